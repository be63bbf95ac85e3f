"""A rank's trace integrity (analysis.traces.integrity): each count on a small trace written here, where it
is known exactly, and on a clean one, where it is 0; the counts the real traces give; and the counts
carried in RankInput, across the pool's processes and a renumbering."""

from __future__ import annotations

import gzip
import json
import pickle
import random
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from conftest import REAL_TRACES

from analysis.job.run_dir import read_run
from analysis.ranks import workers
from analysis.traces.integrity import Integrity, integrity_of
from analysis.traces.kineto import span
from analysis.traces.load import RawTrace, read_trace
from runners.schedules import build
from synthetic.generate import write_run

HOST, THREAD, DEVICE, STREAM = 100, 100, 0, 7


def trace_of(tmp_path: Path, events: list[dict]) -> RawTrace:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return read_trace(path)


def op(name: str, start: int, end: int, tid: int | str = THREAD) -> dict:
    return span(name, "cpu_op", HOST, tid, start, end)


def kernel(
    start: int, end: int, correlation: int | None = None, stream: int = STREAM, cat: str = "kernel"
) -> dict:
    return span(f"kernel {start}", cat, DEVICE, stream, start, end, correlation=correlation, stream=stream)


def launch(start: int, correlation: int | None, name: str = "cudaLaunchKernel") -> dict:
    return span(name, "cuda_runtime", HOST, THREAD, start, start + 5, correlation=correlation)


def counts(trace: RawTrace) -> tuple[int, ...]:
    found = integrity_of(trace)
    return (
        found.overlapping_slices,
        found.overrunning_slices,
        found.string_timestamps,
        found.outside_steps,
        found.missing_kernels,
    )


def test_overlapping_slices_are_those_that_start_inside_another_and_end_after_it(tmp_path):
    nested = [op("step", 0, 100), op("first", 0, 50), op("inner", 10, 20), op("last", 90, 100)]
    clean = trace_of(tmp_path, [*nested, op("after", 100, 110), kernel(0, 10), kernel(10, 20)])
    assert counts(clean)[0] == 0
    overlapping = [
        op("starts inside first", 40, 60),  # ends after first, inside step: 1
        op("starts inside two", 45, 120),  # ends after first and step: counted once
        op("other thread", 40, 60, tid=THREAD + 1),  # alone on its thread: 0
        kernel(15, 25),  # a kernel's start inside the one before it on the stream: 1
        span("k", "Kernel", DEVICE, "stream 9", 0, 10, stream=9),  # the 2021 format's stream tid
        span("k", "Kernel", DEVICE, "stream 9", 5, 15, stream=9),  # on stream 9: 1
        op("a", 0, 10, tid="main"),  # a tid that is no integer: on no track the frame can tell
        op("b", 5, 15, tid="main"),
    ]
    trace = trace_of(tmp_path, [*nested, op("after", 100, 110), kernel(0, 10), kernel(10, 20), *overlapping])
    assert counts(trace) == (4, 2, 0, 0, 0)  # the two kernels that run into the next on their stream
    derived = trace.frame.head(1).with_columns(  # a row virtual_ranks derives: no event of the file
        pl.lit(None, pl.Int64).alias("index"),
        pl.lit(45, pl.Int64).alias("start_ns"),
        pl.lit(200, pl.Int64).alias("end_ns"),
    )
    assert counts(replace(trace, frame=pl.concat([trace.frame, derived])))[0] == 4


def test_not_nesting_is_the_definition_on_random_tracks(tmp_path):
    """The range-minimum search against the definition itself, slice by slice, on tracks that overlap
    everywhere: ties, zero durations, chains, slices inside slices."""
    rng = random.Random(7)
    for _ in range(30):
        slices = []
        for _ in range(rng.randint(1, 60)):
            start = rng.randint(0, 40)
            slices.append((rng.randint(0, 2), start, start + rng.randint(0, 15)))
        expected = sum(any(p[0] == s[0] and p[1] < s[1] < p[2] < s[2] for p in slices) for s in slices)
        trace = trace_of(tmp_path, [op(f"op{i}", a, b, tid=t) for i, (t, a, b) in enumerate(slices)])
        assert counts(trace)[0] == expected, slices


def test_overrunning_slices_are_device_work_that_runs_into_the_next_on_its_stream(tmp_path):
    sequential = [kernel(0, 10), kernel(10, 20), kernel(25, 30, stream=8)]
    annotation = span("PP:0F0", "gpu_user_annotation", DEVICE, STREAM, 0, 20)  # spans the kernels: not work
    calls = [op("call", 0, 100), op("callee", 10, 20)]  # a host thread nests: no overrun
    assert counts(trace_of(tmp_path, [*sequential, annotation, *calls]))[:2] == (0, 0)
    overrunning = [
        kernel(100, 200),  # swallows the two after it: 1, and nothing a viewer drops
        kernel(110, 120),
        kernel(130, 140),
        kernel(100, 110, stream=8),  # into the next copy's start: 1
        kernel(105, 115, stream=8, cat="gpu_memcpy"),  # which a viewer drops: overlapping 1
        kernel(300, 310, stream=9),  # two at one start on one stream: the shorter first runs into the other
        kernel(300, 320, stream=9),  # a viewer nests them: overlapping 0
    ]
    trace = trace_of(tmp_path, [*sequential, annotation, *calls, *overrunning])
    assert counts(trace)[:2] == (1, 3)


def test_string_timestamps_count_the_events_that_wrote_a_time_as_a_string(tmp_path):
    events = [op("a", 10, 20), op("b", 20, 30), op("c", 30, 40), op("d", 40, 50)]
    clean = trace_of(tmp_path, events)
    events[0]["ts"] = str(events[0]["ts"])
    events[1]["ts"], events[1]["dur"] = str(events[1]["ts"]), str(events[1]["dur"])  # one event, counted once
    events[3]["dur"] = str(events[3]["dur"])
    quoted = trace_of(tmp_path, events)
    assert counts(clean)[2] == 0 and counts(quoted)[2] == 3
    assert quoted.frame.equals(clean.frame)


def test_outside_steps_are_slices_no_profiled_step_holds_device_work_by_its_launch(tmp_path):
    steps = [
        op("ProfilerStep#1", 100, 200),
        op("ProfilerStep#2", 200, 300),
        op("ProfilerStep#3", 400, 500),
    ]
    inside = [
        op("whole run", 0, 1000),  # holds every step
        op("into the first", 90, 110),
        op("an instant", 250, 250),
        launch(290, 1),
        kernel(350, 360, 1),  # runs after ProfilerStep#2, which launched it: inside
    ]
    outside = [
        op("before", 50, 90),
        op("from the second's end", 300, 320),
        op("between", 310, 390),
        op("after", 600, 700),
        op("no category", 700, 710) | {"cat": None},  # a host slice still
        launch(350, 2),  # in the gap between steps, and so its kernel, though it runs in ProfilerStep#3
        kernel(420, 430, 2),
    ]
    no_launch = span("PP:0F0", "gpu_user_annotation", DEVICE, STREAM, 600, 650)  # not placed
    assert counts(trace_of(tmp_path, [*steps, *inside, no_launch]))[3] == 0
    assert counts(trace_of(tmp_path, [*steps, *inside, *outside, no_launch]))[3] == 7
    assert counts(trace_of(tmp_path, [*inside, *outside, no_launch]))[3] == 0  # no steps: 0


def test_missing_kernels_are_launches_whose_correlation_no_device_work_carries(tmp_path):
    issued = [
        launch(0, 1),
        kernel(10, 20, 1),
        launch(30, 5, "cudaMemcpyAsync"),
        kernel(40, 50, 5, stream=8, cat="gpu_memcpy"),
    ]
    not_launches = [launch(60, 6, "cudaEventRecord"), launch(70, None)]  # no work to miss, no id to match
    assert counts(trace_of(tmp_path, [*issued, *not_launches]))[4] == 0
    missing = [
        launch(80, 2),
        launch(90, 3, "cuLaunchKernel"),
        launch(95, 4, "hipLaunchKernel"),
        span("PP:0F0", "gpu_user_annotation", DEVICE, STREAM, 95, 100, correlation=4),  # no work of id 4
    ]
    assert counts(trace_of(tmp_path, [*issued, *not_launches, *missing]))[4] == 3


# The counts on the real traces (overlapping, overrunning, string, outside steps, missing kernels):
# Perfetto drops Python-function spans of torch.compile's wrappers and the record_function scopes of
# TraceLens's MI300 run on their host threads, and the B200 vLLM run's MoE kernels that start during the
# one before (programmatic dependent launch: overlapping on the device and overrunning); HTA's alexnet
# puts "Stream Sync" spans on the stream over its copies and has two cudaMemsetAsync without a memset.
REAL_COUNTS = {
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": (0, 0, 0, 1, 0),
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": (0, 0, 0, 12, 0),
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz": (8, 0, 0, 0, 2),
    "hta/rank_non_gpu/rank_non_gpu.json.gz": (0, 0, 0, 8, 0),
    "hta/trace_diff/test/test.json.gz": (1, 1, 0, 0, 0),
    "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz": (0, 0, 0, 0, 0),
    "kineto_tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": (0, 0, 0, 3, 0),
    "param_dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json.gz": (0, 0, 0, 1, 0),
    "pippy/local_test_forward_hf_gpt2.json.gz": (0, 0, 0, 0, 0),
    "tracelens/b200/eager_trace.json.gz": (27, 14, 0, 0, 0),
    "tracelens/mi300/resnet_act_checkpoint.json.gz": (18, 0, 0, 0, 0),
}


@pytest.mark.parametrize("name", REAL_COUNTS)
def test_the_real_traces_counts(name):
    assert counts(read_trace(REAL_TRACES / name)) == REAL_COUNTS[name]


def test_rank_input_carries_the_counts_across_processes_and_a_renumbering(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="gpu")
    (packed,) = tmp_path.glob("rank1.json*")
    document = json.loads(gzip.decompress(packed.read_bytes()))
    document["traceEvents"] += [op("a", 0, 10, tid=1), op("b", 5, 15, tid=1) | {"ts": "0.005"}]
    packed.write_bytes(gzip.compress(json.dumps(document).encode()))
    expected = integrity_of(read_trace(packed))
    with workers.applied(2):
        pooled = read_run(tmp_path).ranks[1]
    assert pooled.integrity == expected and (expected.overlapping_slices, expected.string_timestamps) == (
        1,
        1,
    )
    assert pickle.loads(pickle.dumps(pooled)).integrity == expected
    assert pooled.renumbered(5).integrity == expected


def test_total_is_the_sum_of_the_counts_not_of_the_events():
    found = Integrity(
        events=100,
        overlapping_slices=1,
        overrunning_slices=2,
        string_timestamps=3,
        outside_steps=4,
        missing_kernels=5,
    )
    assert found.total() == 15
