"""A run directory from synthetic.executor_sim (shape "cpu") or synthetic.executor_gpu ("gpu"): Kineto
traces of the native executor's steps, run.json with the calibration, and truth.json with each step's
true times.

    run = write_executor_run(DIR, build("gpipe", 2, 16), durations_us={"F": 1000, "B": 2000},
                             transport=Transport(RENDEZVOUS, transfer_ns=50_000), host=HostTime(tail_ns=300_000))

Each step is one simulate_step (every step alike), steps back to back, every rank's ProfilerStep the
step's length (the barrier). What a rank's thread records, as the native executor's gloo traces do
(shapes.cpu_cell): a `PP:` span per action; inside a compute span its two operators from its work's
start; inside a RECV span `c10d::recv_` and `gloo:recv` over the blocked time (the whole span: a RECV is
posted when it begins); inside a SEND span `c10d::send`, and from its end a `gloo:send` span until the
step's wait for sends returns from that send (as real gloo traces hold it, over everything between);
after the last action `PP wait for sends` until the sends are released, then `optimizer_step` holding an
`aten::add_` over the tail.

truth.json: {"transport", "steps": [{"step", "step_ns", "ranks": {rank: {"actions": [[label, start_ns,
end_ns], ...] in order, "lane_end_ns", "sends_done_ns", "parts_ns": {...}}}}]}, times from the step's
start. A rank's parts sum to the step: compute (work), launch_overhead (host time between actions,
inside compute spans before the work, in asynchronous SEND calls), bubble (a RECV's or blocking SEND's
wait before the partner posted; the wait for sends before their last receiver posted, with a
rendezvous; idle after the tail until the barrier), p2p_wait (those waits after the partner posted),
other (the tail).

GPU (NCCL, eager delivery by default): per action its `PP:` label on the host thread around one
cudaLaunchKernel, the kernel (correlation id, ac2g flow) with its device-side label on the compute
stream or its peer's comm stream; `PP wait for sends`, then `optimizer_step` around the optimizer's
launch. truth.json's actions are the kernels' times; its parts are synthetic.executor_gpu.rank_parts,
and p2p_queued_ns says how much of p2p_wait the compute stream spent queued behind the rank's own SEND.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from runners.schedules import Action, Kind, Schedule, lower
from runners.schedules.trace_names import DP_GRAD_SYNC, OPTIMIZER_STEP, WAIT_SENDS, label
from synthetic import shapes
from synthetic.executor_gpu import (
    COMM_STREAM_BASE,
    COMPUTE_STREAM,
    DP_STREAM,
    LAUNCH_NS,
    GpuStep,
    Kernel,
    queued_parts,
    simulate_gpu_step,
)
from synthetic.executor_gpu import rank_parts as gpu_parts
from synthetic.executor_sim import (
    EAGER,
    RECVS,
    RENDEZVOUS,
    SENDS,
    HostTime,
    StepRun,
    Transport,
    simulate_step,
)
from synthetic.truth import (
    DEFAULT_US,
    ROWS_PER_MICROBATCH,
    Durations,
    Work,
    calibration,
    calibration_by_rows,
    dims,
)

BASE_TIME_NS = 1_700_000_000 * 10**9  # baseTimeNanoseconds; event times count from ORIGIN_NS after it
ORIGIN_NS = 10 * 10**9
STEP_PREFIX = "ProfilerStep#"  # torch.profiler's step spans
OPTIMIZER_OP = "aten::add_"  # the SGD update's operator inside optimizer_step
GLOO_SEND = "gloo:send"  # gloo's span of an isend, on the sending thread
ALLREDUCE_CALL_NS = 5_000  # CPU: the c10d::allreduce_ call that hands the gradients to gloo's thread
GLOO_TID_OFFSET = 50  # gloo's worker thread is tid pid + 50
Group = Mapping[str, Any]  # a collective's record_param_comms args that name its process group
GEMM_KERNEL = "ampere_sgemm_128x64_tn"  # a compute action's kernel
OPTIMIZER_KERNEL = "multi_tensor_apply_kernel"  # the SGD update's kernel
ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def rank_parts(run: StepRun, rank: int, transport: Transport, host: HostTime) -> dict[str, int]:
    """The true parts of one rank's step (module docstring), ns; they sum to run.step_ns."""
    parts = dict.fromkeys(("compute", "launch_overhead", "bubble", "p2p_wait", "dp_sync", "other"), 0)
    free = 0
    for done in run.actions[rank]:
        parts["launch_overhead"] += done.start - free
        free = done.end
        if done.action.kind.is_compute:
            parts["launch_overhead"] += done.work_start - done.start
            parts["compute"] += done.end - done.work_start
        elif done.partner_posted is None:  # an asynchronous SEND's call
            parts["launch_overhead"] += done.end - done.start
        else:
            ready = min(max(done.start, done.partner_posted), done.end)
            parts["bubble"] += ready - done.start
            parts["p2p_wait"] += done.end - ready
    end = run.ends[rank]
    posted = end.last_receiver_post if transport.semantics == RENDEZVOUS else None
    ready = min(max(end.lane_end, posted if posted is not None else end.lane_end), end.sends_done)
    parts["bubble"] += ready - end.lane_end + run.step_ns - end.tail_end
    parts["p2p_wait"] += end.sends_done - ready
    tail = end.sends_done if end.synced is None else end.synced
    parts["dp_sync"] += tail - end.sends_done
    parts["other"] += end.tail_end - tail
    return parts


def _rank_events(
    run: StepRun, rank: int, steps: int, group: Group | None = None, labels: bool = True
) -> list[dict[str, Any]]:
    """Every step's events of one rank's thread (pid = tid), on the trace's clock; `group`: the DP
    group's record_param_comms args, where the rank all-reduces its gradients."""
    pid = 4000 + rank
    events = shapes.metadata(pid, pid, "python", f"thread {pid} (python)")
    end = run.ends[rank]
    for step in range(steps):
        shift = ORIGIN_NS + step * run.step_ns
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
            events += _all_reduce(pid, end.sends_done + shift, end.synced + shift, group or {})
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


def _gpu_rank_events(
    run: GpuStep, rank: int, steps: int, group: Group | None, labels: bool = True
) -> list[dict[str, Any]]:
    """Every step's events of one rank on a GPU: host labels around their launches, kernels on the
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
        shift = ORIGIN_NS + step * run.step_ns
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


def rank_document(
    run: StepRun | GpuStep,
    rank: int,
    steps: int,
    run_id: str,
    distributed: Mapping[str, Any],
    group: Group | None = None,
    labels: bool = True,
) -> dict[str, Any]:
    """The trace of the run's local rank `rank`; `distributed`: its global rank and world_size (and
    pg_config), `group` its DP group (_rank_events)."""
    on_gpu = isinstance(run, GpuStep)
    gpu = [{"id": rank, "name": "Synthetic GPU", "totalGlobalMem": 80 * 2**30, "computeMajor": 9}]
    events = (_gpu_rank_events if on_gpu else _rank_events)(run, rank, steps, group, labels)
    return {
        "schemaVersion": 1,
        "deviceProperties": gpu if on_gpu else [],
        "distributedInfo": {"backend": "nccl" if on_gpu else "gloo", **distributed},
        "run_id": run_id,
        "baseTimeNanoseconds": BASE_TIME_NS,
        "traceName": f"synthetic executor rank{distributed['rank']}",
        "traceEvents": events,
    }


def truth_document(
    run: StepRun | GpuStep, transport: Transport, host: HostTime, steps: int
) -> dict[str, Any]:
    """truth.json's content (module docstring)."""
    if isinstance(run, GpuStep):
        ranks = {
            str(rank): {
                "actions": [[label(k.action), k.start, k.end] for k in kernels if k.action],
                "parts_ns": gpu_parts(run, rank),
                "p2p_queued_ns": queued_parts(run, rank)["p2p_queued"],
            }
            for rank, kernels in run.kernels.items()
        }
    else:
        ranks = {
            str(rank): {
                "actions": [[label(d.action), d.start, d.end] for d in run.actions[rank]],
                "lane_end_ns": run.ends[rank].lane_end,
                "sends_done_ns": run.ends[rank].sends_done,
                "parts_ns": rank_parts(run, rank, transport, host),
            }
            for rank in run.actions
        }
    return {
        "transport": asdict(transport),
        "steps": [{"step": step, "step_ns": run.step_ns, "ranks": ranks} for step in range(steps)],
    }


def run_config(
    schedule: Schedule, work: Work, step_ns: int, transport: Transport, run_id: str, on_gpu: bool = False
) -> dict[str, Any]:
    """run.json: the keys synthetic.generate writes for a run, and the transport."""
    step_ms = step_ns / 1e6
    return {
        "schedule": schedule.name,
        "p": schedule.p,
        "m": schedule.m,
        "v": schedule.v,
        "engine": "synthetic",
        "preset": None,
        "device": "cuda" if on_gpu else "cpu",
        "backend": "nccl" if on_gpu else "gloo",
        "mode": "processes",
        "dtype": "float32",
        "run_id": run_id,
        "dims": dims(schedule),
        "rows_per_microbatch": ROWS_PER_MICROBATCH,
        "calibration": calibration(schedule, work),
        "calibration_by_rows": calibration_by_rows(schedule, work),
        "step_time_unprofiled_ms": step_ms,
        "step_times_unprofiled_ms": [step_ms] * 3,
        "synthetic_transport": transport.semantics,
        "complete": True,
    }


def write_trace(path: Path, document: Mapping[str, Any]) -> None:
    _write(path, gzip.compress(json.dumps(document).encode(), 6))


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    _write(path, json.dumps(data, indent=1).encode())


def _write(path: Path, data: bytes) -> None:
    """Write beside `path`, then rename over it: a reader never sees half a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def write_executor_run(
    directory: str | Path,
    schedule: Schedule,
    *,
    durations_us: Durations = DEFAULT_US,
    transport: Transport | None = None,
    host: HostTime | None = None,
    steps: int = 3,
    run_id: str = "synthetic-executor",
    shape: str = "cpu",
    labels: bool = True,
    batched: bool = False,
) -> StepRun | GpuStep:
    """rank{r}.json.gz, truth.json and run.json (last, with complete) of `steps` simulated steps; by
    default a rendezvous (cpu) or eager delivery (gpu) without transfer time, and no host time."""
    if shape not in ("cpu", "gpu"):
        raise ValueError(f"shape {shape!r}: cpu or gpu")
    on_gpu = shape == "gpu"
    transport = transport or Transport(EAGER if on_gpu else RENDEZVOUS)
    host = host or HostTime()
    lowered = schedule if schedule.lowered else lower(schedule)
    work = Work(durations_us)
    if batched and (labels or not on_gpu):
        raise ValueError("batched p2p is written GPU-shaped and unlabelled (shape='gpu', labels=False)")
    work_ns = lambda action: work.measured_ns(action, lowered.m)  # noqa: E731
    run = (
        simulate_gpu_step(lowered, work_ns, transport, host, batched=batched)
        if on_gpu
        else simulate_step(lowered, work_ns, transport, host)
    )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(lowered.p):
        distributed = {"rank": rank, "world_size": lowered.p}
        document = rank_document(run, rank, steps, run_id, distributed, labels=labels)
        write_trace(directory / f"rank{rank}.json.gz", document)
    truth = truth_document(run, transport, host, steps)
    write_json(directory / "truth.json", truth)
    config = run_config(schedule, work, run.step_ns, transport, run_id, on_gpu)
    write_json(directory / "run.json", config)
    return run


def stalls_before(actions: Mapping[str, int]) -> dict[Action, int]:
    """HostTime.stalls from compact labels: {"0RECV_B0": ns} -> {Action(0, RECV_B, 0): ns}."""
    return {Action.parse(text): ns for text, ns in actions.items()}
