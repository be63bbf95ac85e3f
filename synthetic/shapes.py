"""Kineto-shaped events for one rank of a synthetic run: "cpu" (gloo, ops on the main thread) or "gpu"
(launches with correlation ids, kernels on a compute and a comm stream, ac2g flows), matching the
real traces in tests/data/real-traces and our runners' CPU traces.

A `Cell` is one executed action with integer-nanosecond times on the rank's true clock: `issue` is when
the rank turned to it (for a RECV, when the wait began), [start, end] when it ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.traces.kineto import BACKWARD_OP_PREFIX
from runners.schedules import Action, Kind
from runners.schedules.trace_names import label

COMPUTE_STREAM = 7
COMM_STREAM = 20
LAUNCH_NS = 4_000  # one cudaLaunchKernel call on the host
HOST_LEAD_NS = 20_000  # how far ahead of the device a host that is not late issues work
LABEL_PAD_NS = 1_000  # host time in a PP label before and after its launch call
_OPS = {  # (outer op, inner op) that fill a compute cell, as in the runners' CPU traces
    Kind.F: ("aten::linear", "aten::gelu"),
    Kind.B: (f"{BACKWARD_OP_PREFIX} MmBackward0", "aten::mm"),
    Kind.I: (f"{BACKWARD_OP_PREFIX} MmBackward0", "aten::mm"),
    Kind.W: (f"{BACKWARD_OP_PREFIX} MmBackward0", "aten::mm"),
}


@dataclass(frozen=True)
class Cell:
    action: Action
    issue: int
    start: int
    end: int
    late: bool  # the host issued it once the device was ready, nothing queued: an injected launch gap, or
    # a rank's first action (a kernel launched ahead into an idle device would start at once)


def span(name: str, cat: str, pid: int, tid: int, start: int, end: int, **args: Any) -> dict[str, Any]:
    event = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": start / 1000,
        "dur": (end - start) / 1000,
    }
    if args:
        event["args"] = args
    return event


def metadata(pid: int, tid: int, process: str, thread: str) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": process}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": thread}},
    ]


def cpu_cell(cell: Cell, pid: int) -> list[dict[str, Any]]:
    """PP span on the main thread; compute filled by two aten ops, a RECV's wait inside gloo:recv."""
    annotation = span(label(cell.action), "user_annotation", pid, pid, cell.issue, cell.end)
    kind = cell.action.kind
    if kind.is_compute:
        outer, inner = _OPS[kind]
        split = cell.start + (cell.end - cell.start) * 4 // 5
        return [
            annotation | {"ts": cell.start / 1000, "dur": (cell.end - cell.start) / 1000},
            span(outer, "cpu_op", pid, pid, cell.start, split),
            span(inner, "cpu_op", pid, pid, split, cell.end),
        ]
    if kind in (Kind.RECV_F, Kind.RECV_B):
        return [
            annotation,
            span("c10d::recv_", "cpu_op", pid, pid, cell.issue, cell.end),
            span("gloo:recv", "user_annotation", pid, pid, cell.issue, cell.end),
        ]
    return [annotation, span("c10d::send", "cpu_op", pid, pid, cell.start, cell.end)]


def host_launches(cells: list[Cell]) -> list[int]:
    """When the host finishes launching each cell's kernel (ns), cells in the rank's order.

    One host thread issues in order, so label spans follow one another; a host that is not late issues
    HOST_LEAD_NS before the device needs the kernel, a late one exactly when the device is ready (the
    injected launch gap: nothing queued). Placed from the last cell back, so a run of comm cells that
    the device starts at one instant gets consecutive, distinct host spans, as in real traces.
    """
    ends: list[int] = []
    next_label = None
    for cell in reversed(cells):
        device_start = cell.start if cell.action.kind.is_compute else cell.issue
        wanted = device_start if cell.late else device_start - HOST_LEAD_NS
        end = wanted if next_label is None else min(wanted, next_label - LABEL_PAD_NS)
        ends.append(end)
        next_label = end - LAUNCH_NS - LABEL_PAD_NS
    return ends[::-1]


def label_start(launch_end: int) -> int:
    return launch_end - LAUNCH_NS - LABEL_PAD_NS


def gpu_cell(cell: Cell, pid: int, device: int, correlation: int, launch_end: int) -> list[dict[str, Any]]:
    """Host PP span around one cudaLaunchKernel; the kernel and a gpu_user_annotation on its stream
    (the NCCL stream starts after the work before it, as ProcessGroupNCCL makes it wait); ac2g flow."""
    kind = cell.action.kind
    device_start = cell.start if kind.is_compute else cell.issue
    launch_start = launch_end - LAUNCH_NS
    stream = COMPUTE_STREAM if kind.is_compute else COMM_STREAM
    kernel = (
        "ampere_sgemm_128x64_tn"
        if kind.is_compute
        else "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
    )
    ids = {"correlation": correlation, "External id": correlation}
    name = label(cell.action)
    return [
        span(name, "user_annotation", pid, pid, label_start(launch_end), launch_end + LABEL_PAD_NS),
        span("cudaLaunchKernel", "cuda_runtime", pid, pid, launch_start, launch_end, cbid=211, **ids),
        span(kernel, "kernel", device, stream, device_start, cell.end, device=device, stream=stream, **ids),
        span(
            name, "gpu_user_annotation", device, stream, device_start, cell.end, device=device, stream=stream
        ),
        {
            "ph": "s",
            "id": correlation,
            "pid": pid,
            "tid": pid,
            "ts": launch_start / 1000,
            "cat": "ac2g",
            "name": "ac2g",
        },
        {
            "ph": "f",
            "id": correlation,
            "pid": device,
            "tid": stream,
            "ts": device_start / 1000,
            "cat": "ac2g",
            "name": "ac2g",
            "bp": "e",
        },
    ]
