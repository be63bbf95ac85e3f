"""Cells from PP labels: CPU spans, GPU spans through correlation ids, steps, blocked time, bad labels.

Also home of the tiny Kineto-shaped trace builder the other analysis tests import (`from test_cells
import ...`): hand-written events with times in microseconds, as Kineto writes them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from conftest import REAL_TRACES

from analysis.cells.labelled import rank_cells
from analysis.errors import InputError
from analysis.traces.load import load_trace

MAIN_TID = 11
KERNEL_PID, KERNEL_TID = 0, 7


def span(name: str, start_us: float, end_us: float, cat: str = "user_annotation", **where) -> dict:
    event = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": where.get("pid", 1),
        "tid": where.get("tid", MAIN_TID),
        "ts": start_us,
        "dur": round(end_us - start_us, 3),
    }
    if "correlation" in where:
        event["args"] = {"correlation": where["correlation"]}
    return event


def cpu_action(
    label: str, start_us: float, end_us: float, wait: tuple[float, float] | None = None
) -> list[dict]:
    """A PP label; `wait` adds the gloo:recv span a blocking receive records inside it."""
    events = [span(f"PP:{label}", start_us, end_us)]
    if wait is not None:
        events.append(span("gloo:recv", *wait))
    return events


def gpu_action(
    label: str, start_us: float, end_us: float, kernels: list[tuple[str, float, float]], first_id: int
) -> list[dict]:
    """A PP label on the host launching `kernels` (name, start, end on the GPU), one launch each."""
    events = [span(f"PP:{label}", start_us, end_us)]
    step = (end_us - start_us) / (len(kernels) + 1)
    for i, (name, k_start, k_end) in enumerate(kernels):
        launch = start_us + step * (i + 1)
        events.append(
            span("cudaLaunchKernel", launch, launch + step / 4, cat="cuda_runtime", correlation=first_id + i)
        )
        events.append(
            span(name, k_start, k_end, cat="kernel", pid=KERNEL_PID, tid=KERNEL_TID, correlation=first_id + i)
        )
    return events


def trace(rank: int, steps: list[tuple[float, float]], events: list[dict], world: int = 2) -> dict:
    """A rank's Kineto document: ProfilerStep#1.. spans plus `events`."""
    step_spans = [span(f"ProfilerStep#{i + 1}", a, b) for i, (a, b) in enumerate(steps)]
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
        "baseTimeNanoseconds": 0,
        "traceEvents": step_spans + events,
    }


def write_trace(directory: Path, document: dict) -> Path:
    path = directory / f"rank{document['distributedInfo']['rank']}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


def cells_of(tmp_path: Path, document: dict) -> pl.DataFrame:
    path = write_trace(tmp_path, document)
    return rank_cells(load_trace(path), path).cells


def test_cpu_labels_become_cells_with_steps_and_blocked_time(tmp_path):
    events = [
        *cpu_action("1RECV_F0", 5, 40, wait=(8, 37.5)),
        *cpu_action("1F0", 41, 60),
        *cpu_action("1RECV_F1", 105, 130, wait=(106, 129)),
        *cpu_action("1F1", 131, 150),
        *cpu_action("1F9", 300, 310),  # outside every profiled step: dropped
    ]
    cells = cells_of(tmp_path, trace(1, [(0, 100), (100, 200)], events))
    assert cells.select("step", "stage", "kind", "microbatch").rows() == [
        (1, 1, "RECV_F", 0),
        (1, 1, "F", 0),
        (2, 1, "RECV_F", 1),
        (2, 1, "F", 1),
    ]
    assert cells["blocked_ns"].to_list() == [29_500, 0, 23_000, 0]
    assert cells["start_ns"].to_list() == [5_000, 41_000, 105_000, 131_000]
    assert not cells["inferred"].any()


def test_a_sends_gloo_span_outliving_its_label_marks_an_isend(tmp_path):
    events = [
        *cpu_action("0SEND_F0", 5, 10),
        span("gloo:send", 9, 80),  # an isend's: closed when the step's wait for sends returned
        *cpu_action("0SEND_F1", 20, 40),
        span("gloo:send", 22, 39),  # a blocking send's: closed inside its call
        *cpu_action("0SEND_F2", 45, 50),  # no span: not told
    ]
    path = write_trace(tmp_path, trace(0, [(0, 100)], events))
    sends = rank_cells(load_trace(path), path).sends
    assert sorted(sends.select("microbatch", "outlives").rows()) == [(0, True), (1, False)]


def test_a_wait_inside_the_recv_call_before_its_gloo_span_is_blocked(tmp_path):
    # A real run's shape: gloo's recv call itself waited 2.9 ms before its gloo:recv span opened (on real
    # runs where the call waits is up to timing, so this shape is pinned here)
    events = [
        *cpu_action("0RECV_B1", 10, 40, wait=(14, 38)),
        span("c10d::recv_", 11, 13.9, cat="cpu_op"),
    ]
    cells = cells_of(tmp_path, trace(0, [(0, 50)], events))
    assert cells["blocked_ns"].to_list() == [26_900]


def test_wait_running_past_its_action_is_clipped_to_the_cell(tmp_path):
    events = cpu_action("0RECV_B0", 10, 20, wait=(12, 25))
    cells = cells_of(tmp_path, trace(0, [(0, 50)], events))
    assert cells["blocked_ns"].to_list() == [8_000]


def test_cpu_work_outside_the_schedule_is_the_union_per_step_of_the_label_threads_spans(tmp_path):
    events = [
        *cpu_action("0F0", 10, 20),
        span("aten::mm", 12, 18, cat="cpu_op"),
        span("optimizer.step", 30, 40),
        span("aten::add_", 32, 35, cat="cpu_op"),  # nested: inside the piece
        span("aten::zero_", 38, 45, cat="cpu_op"),  # overlapping: extends it
        span("aten::mul", 60, 70, cat="cpu_op", tid=MAIN_TID + 1),  # no label on its thread
        span("gloo:send", 75, 80),  # comm, not work of the rank's own
        span("aten::copy_", 90, 105, cat="cpu_op"),  # its step is the one it started in
        span("aten::sum", 120, 130, cat="cpu_op"),
    ]
    path = write_trace(tmp_path, trace(0, [(0, 100), (100, 200)], events))
    unscheduled = rank_cells(load_trace(path), path).unscheduled
    assert unscheduled.columns == ["rank", "step", "start_ns", "end_ns"]
    assert unscheduled.select("step", "start_ns", "end_ns").rows() == [
        (1, 12_000, 18_000),
        (1, 30_000, 45_000),
        (1, 90_000, 105_000),
        (2, 120_000, 130_000),
    ]


def test_gpu_cell_is_its_kernels_span_and_nccl_kernels_are_blocked_time(tmp_path):
    events = [
        *gpu_action("0F0", 10, 20, [("gemm_a", 30, 50), ("gemm_b", 52, 70)], first_id=100),
        *gpu_action("0RECV_B0", 21, 25, [("ncclDevKernel_SendRecv", 71, 140)], first_id=200),
        *gpu_action("0B0", 26, 30, [("gemm_c", 141, 180)], first_id=300),
    ]
    cells = cells_of(tmp_path, trace(0, [(0, 200)], events))
    assert cells.select("kind", "start_ns", "end_ns", "blocked_ns").rows() == [
        ("F", 30_000, 70_000, 0),
        ("RECV_B", 71_000, 140_000, 69_000),
        ("B", 141_000, 180_000, 0),
    ]


def test_trace_without_profiler_steps_is_one_step(tmp_path):
    events = [*cpu_action("0F0", 10, 20), *cpu_action("0B0", 30, 45)]
    cells = cells_of(tmp_path, trace(0, [], events))
    assert cells["step"].unique().to_list() == [0]
    assert cells.height == 2


def test_bad_label_is_an_input_error_naming_the_file(tmp_path):
    with pytest.raises(InputError) as caught:
        cells_of(tmp_path, trace(0, [(0, 100)], cpu_action("0X3", 10, 20)))
    assert "rank0.json.gz" in str(caught.value) and "PP:0X3" in str(caught.value)


def gpipe_m1_run(
    directory: Path, run_json: dict | None = None, extra: dict[int, list[dict]] | None = None
) -> Path:
    """Two ranks, GPipe, one microbatch, one 100 us step, every interval chosen by hand (us):

    rank 0: 0F0 [2,12]  0SEND_F0 [12,13]  0RECV_B0 [14,70] waits (15,69)  0B0 [71,91]
    rank 1: 1RECV_F0 [1,16] waits (2,15)  1F0 [17,37]  1B0 [38,68]  1SEND_B0 [68,69]
    `extra` adds events per rank.
    """
    rank0 = [
        *cpu_action("0F0", 2, 12),
        *cpu_action("0SEND_F0", 12, 13),
        *cpu_action("0RECV_B0", 14, 70, wait=(15, 69)),
        *cpu_action("0B0", 71, 91),
    ]
    rank1 = [
        *cpu_action("1RECV_F0", 1, 16, wait=(2, 15)),
        *cpu_action("1F0", 17, 37),
        *cpu_action("1B0", 38, 68),
        *cpu_action("1SEND_B0", 68, 69),
    ]
    directory.mkdir(parents=True, exist_ok=True)
    extra = extra or {}
    write_trace(directory, trace(0, [(0, 100)], rank0 + extra.get(0, [])))
    write_trace(directory, trace(1, [(0, 100)], rank1 + extra.get(1, [])))
    if run_json is not None:
        (directory / "run.json").write_text(json.dumps(run_json))
    return directory


@pytest.mark.parametrize(
    "name",
    [
        "kineto_tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
        "tracelens/mi300/resnet_act_checkpoint.json.gz",
    ],
)
def test_real_gpu_trace_without_pp_labels_gives_steps_and_no_cells(name):
    path = REAL_TRACES / name
    frame = load_trace(path)
    found = rank_cells(frame, path)
    host_steps = frame.filter(
        pl.col("name").str.starts_with("ProfilerStep#")
        & (pl.col("ph") == "X")
        & (pl.col("cat") != "gpu_user_annotation")
    )  # 2021 Kineto files them as "Operator"
    assert found.cells.height == 0 and found.waits.height == 0
    assert found.steps.height == host_steps["name"].n_unique() > 0
    assert found.kernels is not None and found.kernels.height == 0  # no label launched any of its kernels
    assert found.unscheduled.height > 0  # every kernel is work outside the (absent) schedule
