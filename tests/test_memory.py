"""Activation memory: the executor's stash meter, its counter events in a trace, and the analysis that
reads them (and torch.profiler's allocator events) back into per-rank peaks."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
from conftest import REAL_TRACES, summary_of
from test_cells import gpipe_m1_run

from analysis.errors import TraceWarning
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.traces.load import read_trace
from analysis.traces.memory import memory_events, run_memory, step_peaks, with_steps
from analysis.traces.run import load_run
from analysis.traces.runqueue import run_queue_samples
from analysis.traces.spans import step_spans
from runners.execute import Forward, forward_work
from runners.model import Stage
from runners.schedules.trace_names import CUDA_PEAK_COUNTER, RUN_QUEUE_COUNTER, STASH_COUNTER
from runners.stash import SavedMeter, StashMeter, base_ns, counter_event, held_bytes, with_events


def test_held_bytes_counts_each_tensor_once_and_a_view_by_its_own_size():
    batch = torch.zeros(8, 4)  # 128 bytes
    first_half = batch[:4]  # a view: 64 bytes, not its base's 128
    hidden = torch.zeros(4, 4)
    stashed = Forward(first_half, hidden, [(first_half, hidden), (hidden, torch.zeros(4, 4))])
    assert held_bytes(stashed) == 64 + 64 + 64


def test_meter_counts_microbatches_across_both_stashes():
    meter = StashMeter()
    one, two = torch.zeros(2, 2), torch.zeros(4, 4)  # 16 and 64 bytes
    meter.sample({"forwards": {(0, 0): [one]}, "weight_work": {}})
    meter.sample({"forwards": {(0, 0): [one], (0, 1): [two]}, "weight_work": {}})
    meter.sample(
        {"forwards": {(0, 1): [two]}, "weight_work": {(0, 0): [one, one]}}
    )  # 0I0: still held until W
    meter.sample({"forwards": {}, "weight_work": {(0, 1): [two]}})
    assert [(k, b) for _, k, b in meter.samples] == [(1, 16), (2, 80), (2, 80), (1, 64)]
    times = [t for t, _, _ in meter.samples]
    assert times == sorted(times)


def test_saved_meter_counts_what_the_native_stash_holds_until_backward_lets_it_go():
    """torch's schedules hold a forward through autograd's saves and its output: the same bytes as the
    native executor's Forward of that stage and input, two microbatches apart, none once backward ran."""
    torch.manual_seed(0)
    stage, inputs = Stage(16, 3), [torch.randn(8, 16, requires_grad=True) for _ in range(2)]
    native = held_bytes(Forward(inputs[0], *forward_work(stage, inputs[0], False, 1)[:2]))
    meter = StashMeter()
    saved = SavedMeter.on({5: stage}, meter)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        outputs = [stage(x) for x in inputs]
    assert meter.samples[-1][1:] == (2, 2 * native)
    for output in outputs:
        output.sum().backward()
    del output, outputs
    assert meter.samples[-1][1:] == (0, 0)


def test_counter_events_join_the_trace_exactly_on_its_clock():
    exported = b'{"baseTimeNanoseconds": 1000000000, "traceEvents": [ {"ph": "X", "ts": 1.5}\n]}'
    base = base_ns(exported)
    assert base == 10**9
    events = [
        counter_event(STASH_COUNTER, 10**9 + 2_500_123, base, {"microbatches": 3, "activation_bytes": 7})
    ]
    document = json.loads(with_events(exported, events))
    counter = document["traceEvents"][0]
    assert counter["ph"] == "C" and counter["args"] == {"microbatches": 3, "activation_bytes": 7}
    assert b'"ts":2500.123' in events[0] and len(document["traceEvents"]) == 2
    empty = json.loads(with_events(b'{"traceEvents": []}', events))  # no trailing comma before ]
    assert len(empty["traceEvents"]) == 1


def stash(t_us: float, microbatches: int, held: int) -> dict:
    return {
        "ph": "C",
        "name": STASH_COUNTER,
        "pid": 1,
        "tid": 1,
        "ts": t_us,
        "args": {"microbatches": microbatches, "activation_bytes": held},
    }


def allocation(t_us: float, size: int, total: int, device_type: int = 0) -> dict:
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": t_us,
        "args": {"Total Allocated": total, "Bytes": size, "Device Type": device_type},
    }


def memory_run(directory: Path) -> Path:
    """gpipe_m1_run's step (0-100 us) with a stash counter on rank 0 and allocator events on both ranks;
    events after the step (150 us) must not count."""
    rank0 = [
        stash(11, 1, 1000),
        stash(90, 0, 0),
        stash(150, 5, 99_999),
        allocation(5, 1000, 5000),
        allocation(20, 2000, 7000),
        allocation(80, -4000, 3000),
    ]
    rank1 = [
        allocation(18, 500, 10_000),
        allocation(30, 2000, 12_500),
        allocation(60, -2500, 10_000),
        allocation(150, 50_000, 60_000),
    ]
    return gpipe_m1_run(directory, extra={0: rank0, 1: rank1})


def test_peaks_per_source_and_step(tmp_path):
    peaks = run_memory(load_run(memory_run(tmp_path / "run"))).peaks
    found = {(r, s): (b, k) for r, _, s, b, k in peaks.iter_rows()}
    # rank 0 allocator: +1000, +2000 above the step start -> 3000; rank 1: +500, +2000 -> 2500
    assert found == {(0, "stash"): (1000, 1), (0, "allocator"): (3000, None), (1, "allocator"): (2500, None)}


def test_summary_takes_the_stash_where_there_is_one_else_the_allocator(tmp_path):
    run = read_run(memory_run(tmp_path / "run"))
    summary = analyze_pipeline(run).summary
    assert [entry.peak_activation_bytes for entry in summary.ranks] == [1000, 2500]
    samples = run.memory.stash
    assert samples["microbatches"].to_list() == [1, 0] and set(samples["step"]) == {1}


def test_without_memory_events_the_peak_stays_unknown(tmp_path):
    summary = analyze_pipeline(read_run(gpipe_m1_run(tmp_path / "run"))).summary
    assert [entry.peak_activation_bytes for entry in summary.ranks] == [None, None]


def test_cuda_peak_counter_beats_the_allocator_events(tmp_path):
    peak = {
        "ph": "C",
        "name": CUDA_PEAK_COUNTER,
        "pid": 1,
        "tid": 1,
        "ts": 95,
        "args": {"peak_bytes_above_step_start": 123_456},
    }
    directory = gpipe_m1_run(
        tmp_path / "run",
        extra={
            0: [peak, allocation(5, 1000, 1000, device_type=1)],
            1: [allocation(5, 64, 64, device_type=1)],
        },
    )
    summary = analyze_pipeline(read_run(directory)).summary
    assert [entry.peak_activation_bytes for entry in summary.ranks] == [123_456, 64]


def test_counter_values_that_are_no_whole_number_are_unknown(tmp_path):
    """The loader reads counter values in its one decode: booleans, floats, text and numbers past 64 bits
    are no byte counts (null), and a run-queue sample without a whole number >= 0 is dropped, warned."""
    odd = [
        stash(11, True, 1000),
        stash(12, 2, 1.5),
        stash(13, 3, "many"),
        stash(14, 4, 2**64),
        stash(15, 5, 7),
    ]
    delays = [
        {**stash(20 + i, 0, 0), "name": RUN_QUEUE_COUNTER, "args": {"run_delay_ns": v}}
        for i, v in enumerate([100, True, -1, 2.5, 300])
    ]
    trace = read_trace(gpipe_m1_run(tmp_path / "run", extra={0: odd + delays}) / "rank0.json.gz")
    events = memory_events(trace)
    assert events["microbatches"].to_list() == [None, 2, 3, 4, 5]
    assert events["bytes"].to_list() == [1000, None, None, None, 7]
    with pytest.warns(TraceWarning, match="3 PP run queue sample"):
        samples = run_queue_samples(trace)
    assert samples["run_delay_ns"].to_list() == [100, 300]


def test_real_trace_allocator_events_without_total_allocated():
    path = REAL_TRACES / "kineto_tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    trace = read_trace(path)
    events = with_steps(memory_events(trace), step_spans(trace.frame))
    peaks = step_peaks(events).filter(pl.col("source") == "cuda_allocator")
    assert peaks.height == events["step"].n_unique() > 1
    # a ResNet-50 training step holds between 100 MB and 16 GB of activations and gradients on the GPU
    assert peaks["peak_bytes"].min() > 100e6 and peaks["peak_bytes"].max() < 16e9


def test_theory_over_time_reaches_p_minus_s_on_stage_s_at_replayed_times():
    from analysis.attribution.replay import Inputs, Step, Tail, replay
    from analysis.attribution.waterfall import ideal_frame
    from analysis.report.inflight import theory_in_flight
    from runners.schedules import build

    schedule = build("1f1b", 4, 8)
    one_ms = {a: Inputs(work=1e6) for order in schedule.orders for a in order}  # F = B = 1 ms
    one_ms_per_unit = replay(schedule, Step(schedule.orders, one_ms, [Tail()] * 4))
    theory = theory_in_flight(ideal_frame(one_ms_per_unit, schedule, step=0, origin_ns=0), origin=0)
    assert theory.group_by("rank").agg(pl.col("live").max()).sort("rank")["live"].to_list() == [4, 3, 2, 1]
    # unit-time replay: rank 3's first forward ends at 4, so its count first rises there
    assert theory.filter(pl.col("rank") == 3)["t_ms"].min() == 4.0
    assert theory.group_by("rank").agg(pl.col("live").last())["live"].to_list() == [0] * 4


def test_memory_against_m_keeps_fixed_batch_and_fixed_microbatch_apart():
    from analysis.report import sweeps

    rows = [
        sweeps.run_row(
            f"run{m}{fixed}", summary_of(m=m, peak_bytes=m * 2**20), {"rows_per_microbatch": fixed}
        )
        for m in (2, 4)
        for fixed in (None, 8)
    ]
    memory = sweeps.peak_memory(sweeps.families(sweeps.runs_frame(rows)))
    lines = memory.group_by("family").agg(pl.col("m").sort()).sort("family")
    assert lines["family"].to_list() == [
        "gpipe p=2 v=1 (native, cpu), 8 rows/microbatch",
        "gpipe p=2 v=1 (native, cpu), fixed batch",
    ]
    assert lines["m"].to_list() == [[2, 4], [2, 4]]
