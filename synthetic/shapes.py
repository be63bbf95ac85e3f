"""Kineto-shaped events for one rank of a synthetic run: "cpu" (gloo, ops on the main thread) or "gpu"
(launches with correlation ids, kernels on a compute and a comm stream, ac2g flows), matching the
real traces in tests/data/real-traces and our runners' CPU traces.

Labelled (our runners, torch's multi-stage schedules): every action inside its `PP:` span. Unlabelled
(a hand-written loop, torch's Schedule1F1B; F and B only, stage s on rank s): the ops torch.profiler
records instead, with autograd's sequence numbers ([n]: the `sequence` argument):
- CPU, main thread: F = cpu_ops aten::linear [n] then aten::gelu [n+1] (4/5 and 1/5 of the cell); B =
  cpu_ops `autograd::engine::evaluate_function: MmBackward0` [n] then `...: GeluBackward0` [n+1];
  RECV = cpu_op c10d::recv_ with user_annotation gloo:recv over the same span; SEND = cpu_op c10d::send.
- GPU: where the label was, F = cpu_op aten::linear [n] holding cpu_op aten::mm [n+1] around the
  launch; RECV = cpu_op c10d::recv_ holding cpu_op record_param_comms ("Collective name": "recv",
  "Src Rank": the peer) holding user_annotation nccl:recv around the launch; SEND the same with
  c10d::send, "send", "Dst Rank", nccl:send; all on the main thread (tid = pid). B = cpu_op
  `...: MmBackward0` [n+1] around its launch on the autograd engine's thread (tid = pid + 1). Launches,
  kernels, streams and flows as labelled; no gpu_user_annotation.
- GPU batched (`pair_cell`): a SEND and the RECV after it as batch_isend_irecv issues them: c10d::send
  and c10d::recv_ (each holding its record_param_comms) launch nothing; the user_annotation
  nccl:coalesced after them holds the one launch of the one SendRecv kernel that carries both.
[n] is the sequence number of the forward op; a backward op carries its forward op's.

A `Cell` is one executed action with integer-nanosecond times on the rank's true clock: `issue` is when
the rank turned to it (for a RECV, when the wait began), [start, end] when it ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.traces.kineto import BACKWARD_OP_PREFIX, span
from runners.schedules import Action, Kind
from runners.schedules.trace_names import label

COMPUTE_STREAM = 7
COMM_STREAM = 20
LAUNCH_NS = 4_000  # one cudaLaunchKernel call on the host
HOST_LEAD_NS = 20_000  # how far ahead of the device a host that is not late issues work
LABEL_PAD_NS = 1_000  # host time in a PP label before and after its launch call
P2P_HOST_NS = 2_000  # batched: one c10d::send or c10d::recv_ call that only queues its op
PARAM_PAD_NS = 600  # unlabelled GPU: host time in record_param_comms around nccl:send/recv
NCCL_PAD_NS = 300  # in nccl:send/recv around the launch
MM_PAD_NS = 500  # in aten::mm around the launch
AUTOGRAD_TID_OFFSET = 1  # GPU: autograd's engine thread is tid pid + 1 (thread_name pt_autograd_0)
SEQUENCE = "Sequence number"
_OPS = {  # (outer op, inner op) that fill a compute cell, as in the runners' CPU traces
    Kind.F: ("aten::linear", "aten::gelu"),
    Kind.B: (f"{BACKWARD_OP_PREFIX} MmBackward0", "aten::mm"),
    Kind.I: (f"{BACKWARD_OP_PREFIX} MmBackward0", "aten::mm"),
    Kind.W: (f"{BACKWARD_OP_PREFIX} MmBackward0", "aten::mm"),
}
_UNLABELLED_OPS = {  # an unlabelled compute cell's two ops: forward ops n, n+1, or the backward ops of those
    Kind.F: ("aten::linear", "aten::gelu"),
    Kind.B: (f"{BACKWARD_OP_PREFIX} MmBackward0", f"{BACKWARD_OP_PREFIX} GeluBackward0"),
}
SENDRECV_KERNEL = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


@dataclass(frozen=True)
class Cell:
    action: Action
    issue: int
    start: int
    end: int
    late: bool  # the host issued it once the device was ready, nothing queued: an injected launch gap, or
    # a rank's first action (a kernel launched ahead into an idle device would start at once)


def metadata(pid: int, tid: int, process: str, thread: str) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": process}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": thread}},
    ]


def cpu_cell(cell: Cell, pid: int, host_in_label: bool = False) -> list[dict[str, Any]]:
    """PP span on the main thread; compute filled by two aten ops, a RECV's wait inside gloo:recv. With
    `host_in_label` a compute label opens where the rank turned to it: the launch gap before its ops is
    host time inside the action (Python, a sleep), as a stall inside a loop's step records."""
    annotation = span(label(cell.action), "user_annotation", pid, pid, cell.issue, cell.end)
    if cell.action.kind.is_compute:
        outer, inner = _OPS[cell.action.kind]
        split = _split(cell)
        opens = cell.issue if host_in_label else cell.start
        return [
            annotation | {"ts": opens / 1000, "dur": (cell.end - opens) / 1000},
            span(outer, "cpu_op", pid, pid, cell.start, split),
            span(inner, "cpu_op", pid, pid, split, cell.end),
        ]
    return [annotation, *_cpu_comm(cell, pid)]


def cpu_cell_unlabelled(cell: Cell, pid: int, sequence: int) -> list[dict[str, Any]]:
    """The same cell without its PP span: two top-level ops numbered `sequence`, `sequence` + 1."""
    if not cell.action.kind.is_compute:
        return _cpu_comm(cell, pid)
    first, second = _UNLABELLED_OPS[cell.action.kind]
    split = _split(cell)
    return [
        span(first, "cpu_op", pid, pid, cell.start, split, **{SEQUENCE: sequence}),
        span(second, "cpu_op", pid, pid, split, cell.end, **{SEQUENCE: sequence + 1}),
    ]


def _split(cell: Cell) -> int:
    return cell.start + (cell.end - cell.start) * 4 // 5


def _cpu_comm(cell: Cell, pid: int) -> list[dict[str, Any]]:
    if cell.action.kind in (Kind.RECV_F, Kind.RECV_B):
        return [
            span("c10d::recv_", "cpu_op", pid, pid, cell.issue, cell.end),
            span("gloo:recv", "user_annotation", pid, pid, cell.issue, cell.end),
        ]
    return [span("c10d::send", "cpu_op", pid, pid, cell.start, cell.end)]


def host_launches(units: list[tuple[Cell, ...]]) -> list[int]:
    """When the host finishes launching each unit's kernel (ns), units in the rank's order; a unit is
    one cell, or a batched SEND and RECV (one kernel, host time for both calls before its launch).

    One host thread issues in order, so label spans follow one another; a host that is not late issues
    HOST_LEAD_NS before the device needs the kernel, a late one exactly when the device is ready (the
    injected launch gap: nothing queued). Placed from the last unit back, so a run of comm cells that
    the device starts at one instant gets consecutive, distinct host spans, as in real traces.
    """
    ends: list[int] = []
    next_label = None
    for unit in reversed(units):
        cell = unit[0]
        device_start = cell.start if cell.action.kind.is_compute else cell.issue
        wanted = device_start if cell.late else device_start - HOST_LEAD_NS
        end = wanted if next_label is None else min(wanted, next_label - LABEL_PAD_NS)
        ends.append(end)
        next_label = host_start(unit, end)
    return ends[::-1]


def label_start(launch_end: int) -> int:
    return launch_end - LAUNCH_NS - LABEL_PAD_NS


def host_start(unit: tuple[Cell, ...], launch_end: int) -> int:
    """Where a unit's host span begins: its label's start, before that a batched pair's two calls."""
    return label_start(launch_end) - (len(unit) - 1) * 2 * P2P_HOST_NS


def gpu_cell(cell: Cell, pid: int, device: int, correlation: int, launch_end: int) -> list[dict[str, Any]]:
    """Host PP span around one cudaLaunchKernel; the kernel and a gpu_user_annotation on its stream
    (the NCCL stream starts after the work before it, as ProcessGroupNCCL makes it wait); ac2g flow."""
    launch, kernel, *flows = _launched(cell, cell.end, pid, pid, device, correlation, launch_end)
    name = label(cell.action)
    return [
        span(name, "user_annotation", pid, pid, label_start(launch_end), launch_end + LABEL_PAD_NS),
        launch,
        kernel,
        span(
            name,
            "gpu_user_annotation",
            device,
            kernel["tid"],
            _device_start(cell),
            cell.end,
            device=device,
            stream=kernel["tid"],
        ),
        *flows,
    ]


def gpu_cell_unlabelled(
    cell: Cell, pid: int, device: int, correlation: int, launch_end: int, sequence: int, peer: int
) -> list[dict[str, Any]]:
    """The ops torch.profiler records where the PP span was (the module docstring), around the same
    launch; `peer` is the rank a comm cell receives from or sends to."""
    kind = cell.action.kind
    tid = pid + AUTOGRAD_TID_OFFSET if kind is Kind.B else pid
    launched = _launched(cell, cell.end, pid, tid, device, correlation, launch_end)
    outer = (label_start(launch_end), launch_end + LABEL_PAD_NS)
    launch = (launch_end - LAUNCH_NS, launch_end)
    if kind is Kind.F:
        return [
            span("aten::linear", "cpu_op", pid, pid, *outer, **{SEQUENCE: sequence}),
            span("aten::mm", "cpu_op", pid, pid, *_around(launch, MM_PAD_NS), **{SEQUENCE: sequence + 1}),
            *launched,
        ]
    if kind is Kind.B:
        name = _UNLABELLED_OPS[Kind.B][0]
        return [span(name, "cpu_op", pid, tid, *outer, **{SEQUENCE: sequence + 1}), *launched]
    return [*_comm_op(cell.action, pid, outer, launch, peer), *launched]


def pair_cell(
    send: Cell, recv: Cell, pid: int, device: int, correlation: int, launch_end: int, peers: tuple[int, int]
) -> list[dict[str, Any]]:
    """A batched SEND and RECV: both calls, then nccl:coalesced around the launch of the one kernel,
    from the earlier cell's device start to the later one's end. `peers`: (send's peer, recv's peer)."""
    first = host_start((send, recv), launch_end)
    calls = [(first, first + P2P_HOST_NS), (first + P2P_HOST_NS, first + 2 * P2P_HOST_NS)]
    events = [
        event
        for cell, call, peer in zip((send, recv), calls, peers)
        for event in _comm_op(cell.action, pid, call, None, peer)
    ]
    coalesced = (label_start(launch_end), launch_end + LABEL_PAD_NS)
    events.append(span("nccl:coalesced", "user_annotation", pid, pid, *coalesced))
    end = max(send.end, recv.end)
    return events + _launched(send, end, pid, pid, device, correlation, launch_end)


def _around(interval: tuple[int, int], pad: int) -> tuple[int, int]:
    return interval[0] - pad, interval[1] + pad


def _comm_op(
    action: Action, pid: int, outer: tuple[int, int], launch: tuple[int, int] | None, peer: int
) -> list[dict[str, Any]]:
    """c10d::recv_ or c10d::send over `outer`, its record_param_comms inside; with a `launch`, the
    nccl:recv or nccl:send annotation around it."""
    receiving = action.kind in (Kind.RECV_F, Kind.RECV_B)
    collective = "recv" if receiving else "send"
    params = {"Collective name": collective, ("Src Rank" if receiving else "Dst Rank"): peer}
    inner = _around(launch, PARAM_PAD_NS) if launch else _around(outer, -PARAM_PAD_NS)
    events = [
        span("c10d::recv_" if receiving else "c10d::send", "cpu_op", pid, pid, *outer),
        span("record_param_comms", "cpu_op", pid, pid, *inner, **params),
    ]
    if launch:
        events.append(span(f"nccl:{collective}", "user_annotation", pid, pid, *_around(launch, NCCL_PAD_NS)))
    return events


def _device_start(cell: Cell) -> int:
    return cell.start if cell.action.kind.is_compute else cell.issue


def _launched(
    cell: Cell, end: int, pid: int, tid: int, device: int, correlation: int, launch_end: int
) -> list[dict[str, Any]]:
    """One cudaLaunchKernel on thread `tid`, its kernel (on the compute or the NCCL stream, from the
    cell's device start until `end`) and the ac2g flow between them."""
    compute = cell.action.kind.is_compute
    device_start = _device_start(cell)
    launch_start = launch_end - LAUNCH_NS
    stream = COMPUTE_STREAM if compute else COMM_STREAM
    kernel = "ampere_sgemm_128x64_tn" if compute else SENDRECV_KERNEL
    ids = {"correlation": correlation, "External id": correlation}
    return [
        span("cudaLaunchKernel", "cuda_runtime", pid, tid, launch_start, launch_end, cbid=211, **ids),
        span(kernel, "kernel", device, stream, device_start, end, device=device, stream=stream, **ids),
        {
            "ph": "s",
            "id": correlation,
            "pid": pid,
            "tid": tid,
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
