"""The trace events of synthetic.executor_trace's runs: one rank's thread on gloo (`cpu_rank_events`) or
its host thread and streams on NCCL (`gpu_rank_events`), every step shifted onto the trace's clock; what
they hold is said in synthetic.executor_trace's docstring."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from runners.schedules import Kind
from runners.schedules.trace_names import DP_GRAD_SYNC, OPTIMIZER_STEP, WAIT_SENDS, label
from synthetic import shapes
from synthetic.executor_gpu import COMM_STREAM_BASE, COMPUTE_STREAM, DP_STREAM, LAUNCH_NS, GpuStep, Kernel
from synthetic.executor_sim import RECVS, SENDS, StepRun

BASE_TIME_NS = 1_700_000_000 * 10**9  # baseTimeNanoseconds; event times count from ORIGIN_NS after it
ORIGIN_NS = 10 * 10**9  # leaves room for negative clock offsets
STEP_PREFIX = "ProfilerStep#"  # torch.profiler's step spans
OPTIMIZER_OP = "aten::add_"  # the SGD update's operator inside optimizer_step
GLOO_SEND = "gloo:send"  # gloo's span of an isend, on the sending thread
ALLREDUCE_CALL_NS = 5_000  # CPU: the c10d::allreduce_ call that hands the gradients to gloo's thread
GLOO_TID_OFFSET = 50  # gloo's worker thread is tid pid + 50
Group = Mapping[str, Any]  # a collective's record_param_comms args that name its process group
GEMM_KERNEL = "ampere_sgemm_128x64_tn"  # a compute action's kernel
OPTIMIZER_KERNEL = "multi_tensor_apply_kernel"  # the SGD update's kernel
ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def cpu_rank_events(
    run: StepRun, rank: int, steps: int, group: Group | None = None, labels: bool = True, clock_ns: int = 0
) -> list[dict[str, Any]]:
    """Every step's events of one rank's thread (pid = tid), on the trace's clock (the rank's `clock_ns`
    ahead of the true one); `group`: the DP group's record_param_comms args, where the rank all-reduces
    its gradients."""
    pid = 4000 + rank
    events = shapes.metadata(pid, pid, "python", f"thread {pid} (python)")
    end = run.ends[rank]
    for step in range(steps):
        shift = ORIGIN_NS + clock_ns + step * run.step_ns
        events.append(
            shapes.span(f"{STEP_PREFIX}{step}", "user_annotation", pid, pid, shift, shift + run.step_ns)
        )
        for done in run.actions[rank]:
            kind = done.action.kind
            start = done.work_start if kind.is_compute else done.end if kind in RECVS else done.start
            cell = shapes.Cell(done.action, done.start + shift, start + shift, done.end + shift, True)
            if labels:
                events += shapes.cpu_cell(cell, pid, host_in_label=True)
            else:  # autograd's sequence numbers: distinct per (step, microbatch)
                sequence = 1 + 2 * (step * len(run.actions[rank]) + done.action.microbatch)
                events += shapes.cpu_cell_unlabelled(replace(cell, start=start + shift), pid, sequence)
        events += [
            shapes.span(GLOO_SEND, "user_annotation", pid, pid, call_end + shift, waited + shift)
            for call_end, waited in _gloo_sends(run, rank)
        ]
        if labels:
            waiting = (end.lane_end + shift, end.sends_done + shift)
            events.append(shapes.span(WAIT_SENDS, "user_annotation", pid, pid, *waiting))
        if end.synced is not None:
            called = end.sends_done if end.sync_called is None else end.sync_called
            events += _all_reduce(pid, called + shift, end.synced + shift, group or {})
        tail_start = end.sends_done if end.synced is None else end.synced
        if end.tail_end > tail_start:
            tail = (tail_start + shift, end.tail_end + shift)
            events += [shapes.span(OPTIMIZER_STEP, "user_annotation", pid, pid, *tail)] if labels else []
            events.append(shapes.span(OPTIMIZER_OP, "cpu_op", pid, pid, *tail))
    return events


def _gloo_sends(run: StepRun, rank: int) -> list[tuple[int, int]]:
    """Each SEND's gloo:send span, as real gloo traces hold it: from the end of its c10d::send call until
    the step's wait for sends returns from it (in order, from the rank's last action on, once the send
    is released): not the transfer, which may end long before."""
    waited, spans = run.ends[rank].lane_end, []
    for done in run.actions[rank]:
        if done.action.kind in SENDS:
            waited = max(waited, run.released[done.action], done.end)
            spans.append((done.end, waited))
    return spans


def _all_reduce(pid: int, start: int, end: int, group: Group) -> list[dict[str, Any]]:
    """The gradients' all-reduce on gloo, as the runner's DP_GRAD_SYNC records it: the c10d call (its
    record_param_comms naming the group) on the main thread, then gloo's run of it on gloo's thread."""
    call = (start, start + ALLREDUCE_CALL_NS)
    params = {"Collective name": "allreduce", **group}
    return [
        shapes.span(DP_GRAD_SYNC, "user_annotation", pid, pid, start, end),
        shapes.span("c10d::allreduce_", "cpu_op", pid, pid, *call),
        shapes.span("record_param_comms", "cpu_op", pid, pid, call[0] + 1_000, call[1] - 1_000, **params),
        shapes.span("gloo:all_reduce", "user_annotation", pid, pid + GLOO_TID_OFFSET, start, end),
    ]


def gpu_rank_events(
    run: GpuStep, rank: int, steps: int, group: Group | None, labels: bool = True, clock_ns: int = 0
) -> list[dict[str, Any]]:
    """Every step's events of one rank on a GPU (host and device on one clock, `clock_ns` ahead of the
    true one): host labels around their launches, kernels on the
    compute and comm streams with ac2g flows, the wait for sends, the DP all-reduce's launch inside its
    record_param_comms (naming `group`), and the optimizer's launch. Without `labels` (a hand-written
    loop) an action's launch sits inside the ops torch.profiler records instead (shapes.gpu_cell_unlabelled:
    a B's on autograd's thread), with no label anywhere."""
    pid, device = 4000 + rank, rank
    events = shapes.metadata(pid, pid, "python", f"thread {pid} (python)")
    if not labels:
        autograd = pid + shapes.AUTOGRAD_TID_OFFSET
        events += shapes.metadata(pid, autograd, "python", f"thread {autograd} (pt_autograd_0)")[1:]
    for stream in sorted({k.stream for k in run.kernels[rank]}):
        events += shapes.metadata(device, stream, f"GPU {device}", f"stream {stream}")
    waits = run.send_waits[rank]
    per_step = len(run.kernels[rank])
    for step in range(steps):
        shift = ORIGIN_NS + clock_ns + step * run.step_ns
        events.append(
            shapes.span(f"{STEP_PREFIX}{step}", "user_annotation", pid, pid, shift, shift + run.step_ns)
        )
        if labels:
            events.append(shapes.span(WAIT_SENDS, "user_annotation", pid, pid, *(t + shift for t in waits)))
        kernels = run.kernels[rank]
        for number, kernel in enumerate(kernels):
            correlation = step * per_step + number + 1
            paired = number + 1 < len(kernels) and kernels[number + 1].launch_end == kernel.launch_end
            if number and kernels[number - 1].launch_end == kernel.launch_end:
                continue  # a batched RECV: its SEND's kernel carries it
            if paired:  # batch_isend_irecv's: both calls, one kernel
                send, recv = (_cell(k, shift) for k in kernels[number : number + 2])
                peers = (
                    rank + (1 if kernel.action.kind is Kind.SEND_F else -1),
                    kernels[number + 1].stream - COMM_STREAM_BASE,
                )
                events += shapes.pair_cell(
                    send, recv, pid, device, correlation, kernel.launch_end + shift, peers
                )
            elif labels or kernel.action is None:
                launched = _launched(kernel, pid, device, correlation, shift, group or {})
                events += [e for e in launched if labels or "user_annotation" not in e.get("cat", "")]
            else:
                cell = _cell(kernel, shift)
                sequence = 1 + 2 * (step * per_step + kernel.action.microbatch)  # autograd's, per microbatch
                peer = kernel.stream - COMM_STREAM_BASE
                events += shapes.gpu_cell_unlabelled(
                    cell, pid, device, correlation, kernel.launch_end + shift, sequence, peer
                )
    return events


def _cell(kernel: Kernel, shift: int) -> shapes.Cell:
    """An action's kernel as synthetic.shapes draws a cell: its device span (a comm cell's from its start)."""
    return shapes.Cell(kernel.action, kernel.start + shift, kernel.start + shift, kernel.end + shift, False)


def _names(kernel: Kernel) -> tuple[str, str]:
    """A kernel's host label and its kernel's name."""
    if kernel.action is not None:
        comm = kernel.stream != COMPUTE_STREAM
        return label(kernel.action), shapes.SENDRECV_KERNEL if comm else GEMM_KERNEL
    if kernel.stream == DP_STREAM:
        return DP_GRAD_SYNC, ALLREDUCE_KERNEL
    return OPTIMIZER_STEP, OPTIMIZER_KERNEL


def _launched(
    kernel: Kernel, pid: int, device: int, correlation: int, shift: int, group: Group
) -> list[dict[str, Any]]:
    """A kernel's host label around its cudaLaunchKernel (an all-reduce's inside its record_param_comms),
    the kernel and its device-side label, and the ac2g flow from launch to kernel."""
    name, kernel_name = _names(kernel)
    start, end, launched = kernel.start + shift, kernel.end + shift, kernel.launch_end + shift
    launch = (launched - LAUNCH_NS, launched)
    ids = {"correlation": correlation, "External id": correlation}
    on_stream = {"device": device, "stream": kernel.stream}
    flow = {"id": correlation, "cat": "ac2g", "name": "ac2g"}
    params = {"Collective name": "allreduce", **group}
    said = [shapes.span("record_param_comms", "cpu_op", pid, pid, *launch, **params)]
    return [
        shapes.span(name, "user_annotation", pid, pid, kernel.label_start + shift, launched),
        *(said if kernel.stream == DP_STREAM else []),
        shapes.span("cudaLaunchKernel", "cuda_runtime", pid, pid, *launch, **ids),
        shapes.span(kernel_name, "kernel", device, kernel.stream, start, end, **on_stream, **ids),
        shapes.span(name, "gpu_user_annotation", device, kernel.stream, start, end, **on_stream),
        flow | {"ph": "s", "pid": pid, "tid": pid, "ts": launch[0] / 1000},
        flow | {"ph": "f", "pid": device, "tid": kernel.stream, "ts": start / 1000, "bp": "e"},
    ]
