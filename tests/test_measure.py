"""Calibration: each stage's F and B of one microbatch at several sizes, sampled rank after rank, doing
exactly the executor's work; run.json keeps the medians."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections import Counter

import polars as pl
import pytest
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, record_function

from runners.execute import StepContext, run_step
from runners.measure import (
    CUDA_EVENTS,
    OP_UNION,
    PASS_PREFIX,
    WALL,
    OpUnionClock,
    at_rows,
    calibration,
    calibration_by_rows,
    calibration_samples,
    microbatch_passes,
    op_union_ms,
    pass_clock,
    pooled,
    timing_rule,
    union_ns,
)
from runners.model import build_stages, split_microbatches, stage_input
from runners.presets import CALIBRATED_MS, Preset, calibration_rows, microbatch_rows
from runners.runqueue import RunQueueMeter, uncontended_ms
from runners.schedules import build, lower

PRESET = Preset("test", width=16, layers_per_rank=2, rows=32, dtype="float32")


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_every_stage_of_the_rank_is_sampled_in_index_order_at_every_size(one_rank):
    stages = build_stages(PRESET, (10, 2), 1, torch.device("cpu"))
    sessions = []

    class Session:
        def __enter__(self):
            sessions.append("enter")

        def __exit__(self, *exc):
            sessions.append("exit")

    samples = calibration_samples(
        stages, stage_input(PRESET, torch.device("cpu")), 11, (32, 8, 1), repeats=3, session=Session
    )
    assert sessions == ["enter", "exit"]  # one session around this rank's whole turn
    assert list(samples) == ["2", "10"]  # by index, not as text
    for by_rows in samples.values():
        assert list(by_rows) == ["32", "8", "1"]
        for times in by_rows.values():
            assert {kind: len(ms) for kind, ms in times.items()} == {"F_ms": 3, "B_ms": 3}
            assert all(ms > 0 for kind in times.values() for ms in kind)
    medians = calibration_by_rows(samples)
    assert medians["10"]["8"]["B_ms"] == sorted(samples["10"]["8"]["B_ms"])[1]
    assert calibration(at_rows(samples, 32)) == {stage: by_rows["32"] for stage, by_rows in medians.items()}
    for stage in stages.values():  # a step starts with no gradients: calibration leaves none behind
        assert all(parameter.grad is None for parameter in stage.parameters())


def test_calibration_is_each_kinds_median():
    samples = {"10": {"F_ms": [3.0, 1.0, 2.0], "B_ms": [4.0]}, "2": {"F_ms": [5.0], "B_ms": [6.0, 8.0]}}
    assert calibration(samples) == {"10": {"F_ms": 2.0, "B_ms": 4.0}, "2": {"F_ms": 5.0, "B_ms": 7.0}}
    assert calibration_by_rows({"2": {"64": samples["2"]}}) == {"2": {"64": {"F_ms": 5.0, "B_ms": 7.0}}}


def test_rounds_pool_into_one_sample_list_per_stage_size_and_kind():
    rounds = [
        {"0": {"8": {"F_ms": [1.0], "B_ms": [2.0]}, "4": {"F_ms": [0.5], "B_ms": [1.0]}}},
        {"0": {"8": {"F_ms": [3.0], "B_ms": [4.0]}, "4": {"F_ms": [0.7], "B_ms": [1.1]}}},
        {"0": {"8": {"F_ms": [9.0], "B_ms": [5.0]}, "4": {"F_ms": [0.6], "B_ms": [1.2]}}},
    ]
    together = pooled(rounds)
    assert together == {
        "0": {
            "8": {"F_ms": [1.0, 3.0, 9.0], "B_ms": [2.0, 4.0, 5.0]},
            "4": {"F_ms": [0.5, 0.7, 0.6], "B_ms": [1.0, 1.1, 1.2]},
        }
    }
    assert calibration(at_rows(together, 8)) == {"0": {"F_ms": 3.0, "B_ms": 4.0}}


@pytest.mark.parametrize("rows,m", [(512, 8), (64, 4), (64, 6), (64, 64), (3, 2), (512, 1)])
def test_calibrated_sizes_are_the_microbatch_sizes_of_the_usual_ms_and_the_runs_own(rows, m):
    sizes = calibration_rows(rows, m)
    assert sizes[0] == rows and list(sizes) == sorted(set(sizes), reverse=True) and min(sizes) >= 1
    for count in (*CALIBRATED_MS, m):
        if rows // count >= 1:
            assert set(microbatch_rows(rows, count)) <= set(sizes), count
    assert set(sizes) == {
        size for count in (*CALIBRATED_MS, m) if rows // count for size in microbatch_rows(rows, count)
    }


# The executor's work against the calibration's, op by op: interleaved on one rank with 3 chunks has a
# first (no input gradient), a middle and a last stage (the loss in its forward).
EXEC_PRESET = Preset("exec", width=16, layers_per_rank=6, rows=32, dtype="float32")


def _ops_inside(events: list, span) -> Counter:
    return Counter(
        e.name
        for e in events
        if e is not span
        and e.thread == span.thread
        and e.time_range.start >= span.time_range.start
        and e.time_range.end <= span.time_range.end
    )


@pytest.mark.parametrize("m", [1, 2])
def test_calibration_does_exactly_the_executors_forward_and_backward(m):
    """Same ops, same gradients asked for: stage 0's backward computes no input gradient, the last
    stage's forward holds the loss, and a microbatch after the first adds to existing weight gradients."""
    schedule = lower(build("interleaved", 1, m, 3))
    stages = build_stages(EXEC_PRESET, schedule.stages_of(0), 3, torch.device("cpu"))
    batch = stage_input(EXEC_PRESET, torch.device("cpu"))
    ctx = StepContext(0, schedule.n_stages, schedule.rank_of, stages, None, split_microbatches(batch, m))
    optimizer = torch.optim.SGD([p for s in stages.values() for p in s.parameters()], lr=0.1)
    rows = batch.shape[0] // m
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as profiler:
        run_step(ctx, schedule.orders[0], optimizer)
        for s, stage in stages.items():
            forward, reset, passes = microbatch_passes(
                stage, batch[:rows], s == 0, s == 2, m, accumulate=m > 1
            )
            with record_function(f"calibration {s}F"):
                forward()
            reset()
            with record_function(f"calibration {s}B"):
                passes["B_ms"]()
            stage.zero_grad(set_to_none=True)
    events = list(profiler.events())
    spans = {event.name: event for event in events if event.name.startswith(("PP:", "calibration "))}
    last = m - 1  # with m > 1 the last microbatch's backward adds to the gradients the first made
    for s in range(3):
        for kind in ("F", "B"):
            executed = _ops_inside(events, spans[f"PP:{s}{kind}{last}"])
            calibrated = _ops_inside(events, spans[f"calibration {s}{kind}"])
            assert executed == calibrated, (s, kind, executed - calibrated, calibrated - executed)
    input_grad_mms = {s: _ops_inside(events, spans[f"calibration {s}B"])["aten::mm"] for s in range(3)}
    assert input_grad_mms[0] == 2 * 2 - 1  # 2 layers: 2 weight gradients, 1 input gradient between them
    assert input_grad_mms[1] == input_grad_mms[2] == 2 * 2


def test_a_slowed_stage_calibrates_its_extra_layers():
    """slow:S:K is the stage's own work: its calibration does K times the matrix work."""
    stages = build_stages(EXEC_PRESET, (0, 1), 3, torch.device("cpu"), layer_factors={1: 3})
    assert [len(stages[s].linears) for s in (0, 1)] == [2, 6]
    batch = stage_input(EXEC_PRESET, torch.device("cpu"))
    counts = []
    for s in (0, 1):
        forward, reset, passes = microbatch_passes(stages[s], batch, False, False, 1, accumulate=False)
        with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as profiler:
            forward()
            reset()
            passes["B_ms"]()
        counts.append(Counter(event.name for event in profiler.events())["aten::mm"])
    assert counts == [2 + 2 * 2, 3 * (2 + 2 * 2)]


def test_a_step_ends_with_a_barrier_across_the_ranks(monkeypatch):
    """The worker's step: the engine's step, then a barrier, so the ranks' ProfilerStep spans end together."""
    from runners import worker

    calls = []
    monkeypatch.setattr(worker.dist, "barrier", lambda: calls.append("barrier"))
    step = worker.ended_together(lambda: calls.append("step"))
    step()
    step()
    assert calls == ["step", "barrier", "step", "barrier"]


# On CPU a cell's busy time is the union of its operators' spans (analysis.cells.labelled.operator_spans);
# the calibration's passes are timed by the same rule, not by the wall clock around them.
SLEEP_S = 0.1


def _sleeping_between_ops(stage) -> None:
    """A Python sleep after the first Linear of every forward: host time between two of its operators."""
    stage.linears[0].register_forward_hook(lambda *_: time.sleep(SLEEP_S))


def _calibrated(stages, batch, timing, sessions):
    def session():
        sessions.append(torch.profiler.profile(activities=[ProfilerActivity.CPU]))
        return sessions[-1]

    return calibration_samples(stages, batch, 3, (32, 8), repeats=2, session=session, timing=timing)


def test_on_cpu_a_pass_is_timed_as_the_union_of_its_operators_not_the_wall_clock(one_rank):
    stages = build_stages(EXEC_PRESET, (0, 1), 3, torch.device("cpu"))
    for stage in stages.values():
        _sleeping_between_ops(stage)
    batch = stage_input(EXEC_PRESET, torch.device("cpu"))
    walled = _calibrated(stages, batch, WALL, [])
    unioned = _calibrated(stages, batch, OP_UNION, [])

    def forwards(samples):
        return [ms for by_rows in samples.values() for times in by_rows.values() for ms in times["F_ms"]]

    assert min(forwards(walled)) >= SLEEP_S * 1e3  # the sleep is in every pass's wall time
    # a forward of two 16-wide Linears is microseconds of operators: the sleep is not work (the median:
    # on a busy machine a thread descheduled inside an operator may lengthen one pass)
    assert statistics.median(forwards(unioned)) < SLEEP_S * 1e3 / 2
    assert all(
        ms > 0 for by_rows in unioned.values() for t in by_rows.values() for ms in t["F_ms"] + t["B_ms"]
    )


def test_the_calibrations_op_union_is_the_analysis_busy_rule_on_the_same_events(
    one_rank, tmp_path, monkeypatch
):
    """Each pass's time is what analysis.cells.labelled.operator_spans makes of its span in the
    session's own exported trace, had the pass been a compute cell (with no run-queue samples, so that
    no wait for a core is taken out: the next test covers that)."""
    from analysis.cells.labelled import operator_spans, rank_events
    from analysis.traces.load import load_trace

    monkeypatch.setattr(
        "runners.measure.RunQueueMeter", lambda: RunQueueMeter(str(tmp_path / "no schedstat"))
    )
    stages = build_stages(EXEC_PRESET, (0, 2), 3, torch.device("cpu"))
    _sleeping_between_ops(stages[2])
    sessions = []
    samples = _calibrated(stages, stage_input(EXEC_PRESET, torch.device("cpu")), OP_UNION, sessions)
    (profiler,) = sessions
    profiler.export_chrome_trace(str(tmp_path / "rank0.json"))
    frame = load_trace(tmp_path / "rank0.json")
    passes = frame.filter(pl.col("name").str.starts_with(PASS_PREFIX)).sort("start_ns")
    labels = passes.select(
        "rank",
        "tid",
        step=pl.lit(0, pl.Int64),
        stage=pl.lit(0, pl.Int64),
        kind=pl.lit("F"),
        microbatch=pl.col("name").str.strip_prefix(PASS_PREFIX).cast(pl.Int64),
        start_ns="start_ns",
        end_ns="end_ns",
    )
    busy = (
        operator_spans(rank_events(frame).ops, labels)
        .group_by("microbatch")
        .agg(((pl.col("end_ns") - pl.col("start_ns")).sum() / 1e6).alias("ms"))
        .sort("microbatch")
    )
    # the session's passes in order: per stage, per size, warm-up then 2 repeats, each an F then a B
    expected = [
        ms
        for stage in ("0", "2")
        for rows in ("32", "8")
        for pair in zip(samples[stage][rows]["F_ms"], samples[stage][rows]["B_ms"], strict=True)
        for ms in pair
    ]
    warm = [n for n in range(len(passes)) if n % 6 >= 2]  # each size's first F and B are its warm-up
    assert busy["microbatch"].to_list() == list(range(len(passes))) and len(passes) == 2 * 2 * 3 * 2
    assert busy["ms"].gather(warm).to_list() == pytest.approx(expected, abs=2e-6)  # trace times: 1 ns


class _HalfWaiting:
    """A run queue whose samples say each pass of 10 ms waited 4 ms for a core."""

    def __init__(self) -> None:
        self.taken = 0

    def sample(self) -> None:
        self.taken += 1

    def values(self) -> list[tuple[int, int]]:
        return [
            (n // 2 * 20_000_000 + n % 2 * 10_000_000, n // 2 * 4_000_000 + n % 2 * 4_000_000)
            for n in range(self.taken)
        ]


def test_a_calibration_pass_leaves_out_its_share_of_waiting_for_a_core():
    """The isolated time is the work alone: a cell's wait for a core is slowdown's cpu_contention, so the
    calibration's own wait (4 of a pass's 10 ms here) must not be in the reference."""
    stage = build_stages(PRESET, (0,), 1, torch.device("cpu"))[0]
    forward, _, _ = microbatch_passes(stage, stage_input(PRESET, torch.device("cpu")), True, False, 1, False)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as profiler:
        clock = OpUnionClock(profiler, _HalfWaiting())
        readings = [clock(forward) for _ in range(3)]
    unions = op_union_ms(profiler.profiler.kineto_results.events())
    assert [read() for read in readings] == pytest.approx(
        [unions[f"{PASS_PREFIX}{n}"] * 0.6 for n in range(3)]
    )


def test_a_wait_longer_than_its_span_leaves_no_work_and_no_span_leaves_the_time_as_it_was():
    assert uncontended_ms(10.0, 30_000_000, 10_000_000) == 0.0
    assert uncontended_ms(10.0, -1, 10_000_000) == 10.0  # a counter cannot go back: no wait
    assert uncontended_ms(10.0, 5, 0) == 10.0


def test_the_timing_rule_by_device_and_session():
    assert timing_rule(torch.device("cpu"), profiled=True) == OP_UNION
    assert timing_rule(torch.device("cpu"), profiled=False) == WALL
    assert timing_rule(torch.device("cuda", 0), profiled=True) == CUDA_EVENTS
    with pytest.raises(ValueError, match="profiler session"):
        pass_clock(OP_UNION, torch.device("cpu"), None)
    with pytest.raises(ValueError, match="no wall timing"):
        pass_clock(WALL, torch.device("cuda", 0), None)


def test_union_merges_nested_overlapping_and_touching_spans():
    assert union_ns([(5, 9), (0, 4), (1, 2), (3, 6), (12, 13), (13, 15)]) == 9 + 3
    assert union_ns([]) == 0


# The cpu preset's four stages as one 32-layer stack, 64 rows, on two of torch's threads; prints how many
# weight-gradient entries are subnormal. argv[1] == "1": the worker's torch set-up first.
DEEP_BACKWARD = """
import sys, dataclasses, torch
from runners.model import build_stages, loss_of, stage_input
from runners.presets import PRESETS
from runners.worker import set_up_torch
if sys.argv[1] == "1":
    set_up_torch(1)
torch.set_num_threads(2)
preset = dataclasses.replace(PRESETS["cpu"], rows=64)
stages = build_stages(preset, (0, 1, 2, 3), 1, torch.device("cpu"))
x = stage_input(preset, torch.device("cpu"))
for stage in stages.values():
    x = stage(x)
loss_of(x, 1).backward()
tiny = torch.finfo(torch.float32).tiny
print(sum(int(((w.grad != 0) & (w.grad.abs() < tiny)).sum()) for s in stages.values() for w in s.parameters()))
"""


@pytest.mark.parametrize("set_up", [False, True])
def test_the_workers_set_up_flushes_a_deep_backwards_subnormals_on_every_thread(set_up):
    """Without it the 32-layer backward's gradients hold subnormals (slow microcode on many x86 CPUs);
    with it, none on either thread. A fresh process each: the flag and torch's thread pool are per process."""
    out = subprocess.run(
        [sys.executable, "-c", DEEP_BACKWARD, str(int(set_up))], capture_output=True, text=True, check=True
    )
    subnormals = int(out.stdout)
    assert subnormals == 0 if set_up else subnormals > 1000
