"""P virtual ranks in one process on one GPU (runners.engines.single_gpu), simulated apart from the
analysis and from runners.schedules.simulate: the device of synthetic.executor_gpu with one host thread
and the engine's streams, and the one trace file.

One host thread issues every rank's actions in the engine's plan (runners.schedules.single_gpu's
issue_plan: an input, as a schedule is; the truth is this replay's): each label opens `host.lead_ns`
after the previous one closed, holds `host.inside_ns` of host time and one runtime call (LAUNCH_NS),
and closes when the call returns; a B's or I's kernel is launched from autograd's engine thread while its
label waits on the main thread. On the device:
- compute on the rank's compute stream, once launched and the stream is free;
- a SEND is a device-to-device copy on the sender's own copy stream, once launched, the copy stream free
  and the sender's compute stream done with the work issued before it (the `produced` event); it lasts
  the transfer (eager: nothing waits for the receiver);
- a RECV is a cudaStreamWaitEvent on the receiver's compute stream: nothing runs on the device; the
  stream's next work waits for the copy's end.
There is no wait for sends and no optimizer (`host.tail_ns` must be 0). The step ends when the last
kernel of any rank does, and the host begins the next one then.

Each virtual rank's truth is executor_gpu's rule on its compute stream (synthetic.executor_gpu.rank_parts),
the RECV's wait counted as the receive kernel it stands for, and the window of every virtual rank opens
with the step's first kernel (the engine makes every stream wait for the step's start). Where the host
issued the RECV before the copy ended, the wait runs from when its stream was free: the data came last,
so a faster host would not have moved the work, and the idle is the producer's (bubble, then p2p_wait).
At a step's start each rank but the first idles so, its first RECV issued only after the host went
through the work ahead of it (tens of us) while its data is milliseconds away. Where the host issued
it after the copy ended, the stream idled for the host (launch_overhead), and the wait is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runners.schedules import Action, Kind, Schedule
from runners.schedules.dependencies import matching_recv
from runners.schedules.single_gpu import issue_plan
from runners.schedules.trace_names import label
from synthetic import shapes
from synthetic.executor_events import GEMM_KERNEL, ORIGIN_NS, STEP_PREFIX
from synthetic.executor_gpu import COMM_STREAM_BASE, COMPUTE_STREAM, LAUNCH_NS, GpuStep, Kernel, Replay
from synthetic.executor_sim import EAGER, RECVS, HostTime, Transport

PID = 4000  # the one process
DEVICE = 0  # the one GPU
COPY_KERNEL = "Memcpy DtoD (Device -> Device)"
WAIT_CALL = "cudaStreamWaitEvent"  # a RECV's only trace
ON_AUTOGRAD_THREAD = (Kind.B, Kind.I)  # run by torch.autograd on CUDA: launched from its engine thread


def compute_stream(rank: int) -> int:
    return COMPUTE_STREAM + rank


def copy_stream(p: int, rank: int) -> int:
    return COMPUTE_STREAM + p + rank


def metadata(p: int) -> list[dict[str, Any]]:
    """The names of the one process's two threads and of every rank's two streams."""
    autograd = PID + shapes.AUTOGRAD_TID_OFFSET
    events = shapes.metadata(PID, PID, "python", f"thread {PID} (python)")
    events += shapes.metadata(PID, autograd, "python", f"thread {autograd} (pt_autograd_0)")[1:]
    for rank in range(p):
        for stream in (compute_stream(rank), copy_stream(p, rank)):
            events += shapes.metadata(DEVICE, stream, f"GPU {DEVICE}", f"stream {stream}")
    return events


class _OneGpu(Replay):
    """executor_gpu's replay with one host thread and the engine's streams (module docstring). Kernels
    keep executor_gpu's stream numbers (COMPUTE_STREAM; a SEND's copy COMM_STREAM_BASE + its own rank) so
    that its truth reads them; the trace places them on each rank's streams."""

    def __init__(
        self, schedule: Schedule, work_ns: Callable[[Action], int], host: HostTime, transfer_ns: int
    ):
        super().__init__(schedule, work_ns, Transport(EAGER, transfer_ns), host, batched=False)
        self.labels = {rank: [] for rank in range(schedule.p)}
        free, plan = 0, issue_plan(schedule)
        for issued in plan:
            opens = free + host.lead_ns(issued.action)
            free = opens + host.within_ns(issued.action) + LAUNCH_NS
            self.labels[schedule.rank_of(issued.action.stage)].append((opens, free))
        self.opens = self.labels[schedule.rank_of(plan[0].action.stage)][0][1]  # the step's first kernel

    def advance(self, rank: int) -> bool:
        device, order = self.devices[rank], self.schedule.orders[rank]
        if device.position == len(order) or order[device.position].kind.is_compute:
            return super().advance(rank)
        action = order[device.position]
        opens, launched = self.labels[rank][device.position]
        if action.kind in RECVS:
            if action not in self.sent:
                return False
            arrived = self.transport.delivered(self.sent[action], 0)
            start = max(self.opens, device.stream_at) if launched <= arrived else launched
            end = max(start, arrived)
            kernel = Kernel(action, opens, launched, COMPUTE_STREAM, start, end, self.sent[action])
            device.stream_at = end
        else:
            start = max(launched, device.stream_at, device.comm_free.get(rank, 0))
            self.sent[matching_recv(action)] = start
            kernel = Kernel(
                action, opens, launched, COMM_STREAM_BASE + rank, start, start + self.transport.transfer_ns
            )
            device.comm_free[rank] = device.sends_end = kernel.end
        device.kernels.append(kernel)
        device.position += 1
        return True


def simulate_single_gpu_step(
    schedule: Schedule, work_ns: Callable[[Action], int], transfer_ns: int, host: HostTime | None = None
) -> GpuStep:
    """One step of the lowered `schedule` as one process on one GPU (module docstring)."""
    host = host or HostTime()
    if not schedule.lowered:
        raise ValueError(
            f"{schedule.name}: the single-GPU step runs a lowered schedule (runners.schedules.lower)"
        )
    if host.tail_ns:
        raise ValueError("the single-GPU engine's trace is written without an optimizer step (tail_ns=0)")
    return _OneGpu(schedule, work_ns, host, transfer_ns).run(None)


def single_gpu_events(run: GpuStep, p: int, steps: int) -> list[dict[str, Any]]:
    """Every step's events of the one process: its two threads' labels and runtime calls, every rank's
    kernels and copies on its own streams, the ProfilerStep spans."""
    events = metadata(p)
    issued = sorted(((k, r) for r, ks in run.kernels.items() for k in ks), key=lambda kr: kr[0].launch_end)
    for step in range(steps):
        shift = ORIGIN_NS + step * run.step_ns
        events.append(
            shapes.span(f"{STEP_PREFIX}{step}", "user_annotation", PID, PID, shift, shift + run.step_ns)
        )
        for number, (kernel, rank) in enumerate(issued):
            events += _issued(kernel, rank, p, step * len(issued) + number + 1, shift)
    return events


def _issued(kernel: Kernel, rank: int, p: int, correlation: int, shift: int) -> list[dict[str, Any]]:
    """One action of virtual rank `rank`: its label, its runtime call and what that puts on the device."""
    action = kernel.action
    name = label(action)
    call = (kernel.launch_end - LAUNCH_NS + shift, kernel.launch_end + shift)
    ids = {"correlation": correlation, "External id": correlation}
    found = [shapes.span(name, "user_annotation", PID, PID, kernel.label_start + shift, call[1])]
    if action.kind in RECVS:
        return [*found, shapes.span(WAIT_CALL, "cuda_runtime", PID, PID, *call, **ids)]
    if action.kind.is_compute:
        tid = PID + shapes.AUTOGRAD_TID_OFFSET if action.kind in ON_AUTOGRAD_THREAD else PID
        runtime, device_name, cat = "cudaLaunchKernel", GEMM_KERNEL, "kernel"
        stream = compute_stream(rank)
    else:
        tid, runtime, device_name, cat = PID, "cudaMemcpyAsync", COPY_KERNEL, "gpu_memcpy"
        stream = copy_stream(p, rank)
    on = {"device": DEVICE, "stream": stream}
    times = (kernel.start + shift, kernel.end + shift)
    return [
        *found,
        shapes.span(runtime, "cuda_runtime", PID, tid, *call, **ids),
        shapes.span(device_name, cat, DEVICE, stream, *times, **on, **ids),
        shapes.span(name, "gpu_user_annotation", DEVICE, stream, *times, **on),
    ]
