"""The step model and host time inside a CPU action against the independent generator
(synthetic.executor_sim). The p2p call that took no time uses the old generator (synthetic.generate) for a
valid trace only: it checks the order inferred, not a number."""

from __future__ import annotations

import json
from dataclasses import replace

import msgspec
import polars as pl
import pytest

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.schema import RANK_PARTS
from analysis.traces.load import load_trace
from runners.schedules import build, lower
from synthetic.executor_sim import RENDEZVOUS, HostTime, Transport, simulate_step
from synthetic.executor_trace import write_executor_run
from synthetic.generate import write_run
from synthetic.truth import Work

CASES = [
    ("gpipe", 4, 8, 1),
    ("1f1b", 4, 8, 1),
    ("interleaved", 2, 4, 2),
    ("zb", 3, 6, 1),
    ("zbv", 3, 6, 2),
    ("dualpipev", 2, 4, 2),
]
US = 1_000
EXECUTOR_US = {"F": 1000, "B": 2000, "I": 1000, "W": 1000}
SMALL_GEMM, SLOWDOWN = 1.1, 1.25
ROUND_TRIP = Transport(RENDEZVOUS, 50 * US)  # gloo's
HOST = HostTime(before_ns=20 * US, inside_ns=2 * US, tail_ns=300 * US)
STALL_US = 40


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_the_step_model_replays_the_step(tmp_path, name, p, m, v):
    """The independent generator (synthetic.executor_sim: gloo's rendezvous, host time before and inside
    every action, the optimizer's tail) against the step model. With every action's inputs alike the
    typical step is the step, to 1 ns. A stall of STALL_US x k before rank 0's first action (k actions
    of its stage and kind) leaves the typical step (means per stage and kind) the independent replay
    with STALL_US before each of the k: the model's prediction is that, and variability the measured
    step less it, to 1 ns; each step's own replay has no residual."""
    schedule = build(name, p, m, v)
    alike = _replayed(tmp_path / "alike", schedule, HOST)
    assert alike.typical_step_ms * 1e6 == pytest.approx(alike.step_time_ms * 1e6, abs=1)
    lowered = lower(schedule)
    first = lowered.orders[0][0]
    kin = [a for a in lowered.orders[0] if (a.stage, a.kind) == (first.stage, first.kind)]
    stalled = replace(HOST, stalls={first: len(kin) * STALL_US * US})
    summary = _replayed(tmp_path / "stalled", schedule, stalled)
    work = Work(EXECUTOR_US, SMALL_GEMM, SLOWDOWN)
    typical = simulate_step(
        lowered,
        lambda action: work.measured_ns(action, lowered.m),
        ROUND_TRIP,
        replace(HOST, stalls=dict.fromkeys(kin, STALL_US * US)),
    ).step_ns
    assert summary.typical_step_ms * 1e6 == pytest.approx(typical, abs=1)
    assert summary.waterfall_ms.variability * 1e6 == pytest.approx(
        summary.step_time_ms * 1e6 - typical, abs=1
    )
    assert all(abs(step.residual_ms) < 1e-6 for step in summary.replayed_steps), summary.replayed_steps
    # only small_batches, interference, the variability and the residual may be negative
    terms = msgspec.structs.asdict(summary.waterfall_ms)
    signed = ("small_batches", "interference", "variability", "residual")
    assert all(terms[t] >= 0 for t in terms if t not in signed), terms
    assert sum(terms.values()) == pytest.approx(summary.step_time_ms, abs=1e-9)
    assert all(
        getattr(r, f"{part}_ms") >= 0
        for r in summary.ranks
        for part in RANK_PARTS
        if part not in ("small_gemm", "slowdown")
    )
    # the small-GEMM loss and the slowdown are the only duration changes: no imbalance
    assert terms["imbalance"] == pytest.approx(0, abs=1e-6)
    assert all(terms[t] > 0 for t in ("small_batches", "interference", "host_time", "transfer")), terms


def _replayed(directory, schedule, host):
    write_executor_run(
        directory,
        schedule,
        durations_us=EXECUTOR_US,
        transport=ROUND_TRIP,
        host=host,
        small_gemm=SMALL_GEMM,
        slowdown=SLOWDOWN,
    )
    return analyze_pipeline(read_run(directory)).summary


def test_a_p2p_call_that_took_no_time_still_cuts_the_op_stream(tmp_path):
    """No host time between actions: each send is a span of no time starting with the next forward's
    first op, which by Chrome's rule (the longer holds the rest) would swallow it and join the two
    forwards into one cell."""
    schedule = build("1f1b", 4, 8)
    write_run(tmp_path, schedule, shape="cpu", labels=False)  # launch gaps of 0
    frame = load_trace(tmp_path / "rank0.json.gz")
    sends = frame.filter(pl.col("name") == "c10d::send")
    assert sends.height and (sends["end_ns"] == sends["start_ns"]).all()
    assert frame.join(sends.select("start_ns"), on="start_ns").filter(pl.col("name") == "aten::linear").height
    result = analyze_pipeline(read_run(tmp_path))
    assert result.schedule.orders == schedule.orders


def test_host_time_inside_a_cpu_action_is_launch_overhead_not_compute(tmp_path):
    """A 300 us host stall before each compute action's ops, inside its PP label (a sleep in the loop):
    the operators are the work, the stall is host overhead. Truth from the independent generator
    (executor_sim's host time inside a compute action), every part to 1 ns."""
    schedule = build("gpipe", 3, 4)
    write_executor_run(
        tmp_path,
        schedule,
        durations_us=EXECUTOR_US,
        transport=ROUND_TRIP,
        host=HostTime(inside_ns=300 * US),
        small_gemm=SMALL_GEMM,
        slowdown=SLOWDOWN,
    )
    truth = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    summary = analyze_pipeline(read_run(tmp_path)).summary
    for entry in summary.ranks:
        true = truth["ranks"][str(entry.rank)]["parts_ns"]
        assert true["launch_overhead"] == 2 * schedule.m * 300 * US  # the stalls alone: every F and B's
        misses = {
            part: (entry.part_ms(part) * 1e6, ns)
            for part, ns in true.items()
            if entry.part_ms(part) * 1e6 != pytest.approx(ns, abs=1)
        }
        assert not misses, (entry.rank, misses)
