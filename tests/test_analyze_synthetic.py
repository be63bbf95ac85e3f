"""Ground truth from the old generator (synthetic.generate, built on runners.schedules.simulate) where the
independent one (tests/test_independent_*.py) lacks the shape: the typical step's replay with uneven
launch gaps, a p2p call that took no time, host time inside CPU labels."""

from __future__ import annotations

import msgspec
import polars as pl
import pytest

from analysis.job.measure import analyze_run
from analysis.job.run_dir import read_run
from analysis.schema import RANK_PARTS
from analysis.traces.load import load_trace
from runners.schedules import build
from synthetic.generate import write_run

INJECTED_PARTS = ("compute", "small_gemm", "slowdown", "bubble", "p2p_wait", "launch_overhead")  # RankTruth's
CASES = [
    ("gpipe", 4, 8, 1),
    ("1f1b", 4, 8, 1),
    ("interleaved", 2, 4, 2),
    ("zb", 3, 6, 1),
    ("zbv", 3, 6, 2),
    ("dualpipev", 2, 4, 2),
]
INJECTED = dict(
    durations_us={"F": 1000, "B": 2000, "I": 1000, "W": 1000},
    p2p_latency_us=50,
    launch_gap_us=20,
    small_gemm=1.1,
    slowdown=1.25,
    steps=3,
)


def close(got_ms: float, want_ns: int) -> bool:
    return abs(got_ms * 1e6 - want_ns) <= max(1_000, 0.02 * abs(want_ns))


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_the_step_model_replays_the_step(tmp_path, name, p, m, v):
    """Each step's own replay reproduces it (the completeness residual within 1 ns a step); the typical
    step keeps means per (stage, kind): with every launch gap alike it replays the step to 1 us; the
    synthetic run spares each rank's first action its launch gap, which the mean charges, so the
    typical step is slower by at most one gap per rank and the variability says so."""
    write_run(tmp_path / "alike", build(name, p, m, v), **{**INJECTED, "launch_gap_us": 0})
    alike = analyze_run(read_run(tmp_path / "alike")).summary
    assert alike.simulated_step_time_ms == pytest.approx(alike.step_time_ms, abs=1e-3)
    write_run(tmp_path, build(name, p, m, v), **INJECTED)
    summary = analyze_run(read_run(tmp_path)).summary
    gap_ms = INJECTED["launch_gap_us"] / 1e3
    assert all(abs(step.residual_ms) < 1e-6 for step in summary.replayed_steps), summary.replayed_steps
    assert -p * gap_ms <= summary.waterfall_ms.variability < 0
    # only small_gemm, slowdown, the variability and the residual may be negative
    terms = msgspec.structs.asdict(summary.waterfall_ms)
    signed = ("small_gemm", "slowdown", "variability", "residual")
    assert all(terms[t] >= 0 for t in terms if t not in signed), terms
    assert all(
        getattr(r, f"{part}_ms") >= 0
        for r in summary.ranks
        for part in RANK_PARTS
        if part not in ("small_gemm", "slowdown")
    )
    terms = summary.waterfall_ms
    assert sum(msgspec.structs.asdict(terms).values()) == pytest.approx(summary.step_time_ms, abs=1e-9)
    # the small-GEMM loss and the slowdown are the only duration changes: no imbalance
    assert terms.imbalance == pytest.approx(0, abs=1e-6)
    assert terms.small_gemm > 0 and terms.slowdown > 0 and terms.launch_overhead > 0 and terms.p2p_wait > 0


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
    result = analyze_run(read_run(tmp_path))
    assert result.schedule.orders == schedule.orders


def test_host_time_inside_a_cpu_action_is_launch_overhead_not_compute(tmp_path):
    """A 300 us host stall before each compute action's ops, inside its PP label (a sleep in the loop):
    the operators are the work, the stall is host overhead, and the truth is the run's without it."""
    made = write_run(
        tmp_path,
        build("gpipe", 3, 4),
        launch_gap_us=300,
        host_in_labels=True,
        **{k: v for k, v in INJECTED.items() if k != "launch_gap_us"},
    )
    summary = analyze_run(read_run(tmp_path)).summary
    for entry in summary.ranks:
        truth = made.truth[entry.rank]
        assert truth.launch_overhead_ns >= 3 * 300_000  # the stalls are in the truth's host overhead
        for part in INJECTED_PARTS:
            assert close(entry.part_ms(part), getattr(truth, f"{part}_ns")), (entry.rank, part)
