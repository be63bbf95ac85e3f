"""Kineto-shaped events of a synthetic run of P ranks on one GPU, as runners.engines.single_gpu traces
it (shape "single_gpu"): one process and one file, rank r's kernels on its own compute stream, each SEND
a device-to-device copy on its rank's copy stream that lasts the p2p latency, each RECV a label whose
stream wait leaves nothing on the device (a cudaStreamWaitEvent call only).

One host thread issues every rank's actions in runners.schedules.single_gpu's order: a step's first
label launches its first kernel as that kernel starts (the device is idle: the engine's step begins
with every stream waiting for the last one), the others follow back to back, far ahead of the device;
a B's or I's kernel is launched by autograd's engine thread while its label waits on the main thread.
Device times are the multi-GPU replay's, so each virtual rank's truth is the multi-GPU run's
(analysis.cells.virtual_ranks derives the RECV's wait as an NCCL receive kernel would show it). A
launch gap would stall the one host thread for every rank, so a single_gpu run has none.
"""

from __future__ import annotations

from typing import Any

from analysis.traces.kineto import STEP_PREFIX
from runners.schedules import Kind, Schedule
from runners.schedules.single_gpu import issue_plan
from runners.schedules.trace_names import label
from synthetic import shapes
from synthetic.executor_single_gpu import (
    COPY_KERNEL,
    DEVICE,
    ON_AUTOGRAD_THREAD,
    PID,
    WAIT_CALL,
    compute_stream,
    copy_stream,
    metadata,
)

LABEL_NS = 2 * shapes.LABEL_PAD_NS + shapes.LAUNCH_NS  # one label: pad, one runtime call, pad


class HostBehindError(ValueError):
    """The host cannot issue the run ahead of the device (actions shorter than issuing them)."""


def events(
    schedule: Schedule,
    cells: dict[int, list[shapes.Cell]],
    latency_ns: int,
    step_ns: int,
    shifts: list[int],
    step_head_ns: int,
) -> list[dict[str, Any]]:
    """Every step's labels, launches and device work, and the host ProfilerStep spans around them, each
    opening `step_head_ns` before its first label; `cells` on the true clock of step 0, `shifts` where
    each step begins."""
    plan = issue_plan(schedule)
    of = {cell.action: (rank, cell) for rank, rank_cells in cells.items() for cell in rank_cells}
    _, first = of[plan[0].action]
    heads = [shift + first.start - shapes.LAUNCH_NS - shapes.LABEL_PAD_NS for shift in shifts]
    opens = [head - step_head_ns for head in heads]
    found = metadata(schedule.p)
    for step, (shift, head, closes) in enumerate(zip(shifts, heads, [*opens[1:], shifts[-1] + step_ns])):
        found.append(shapes.span(f"{STEP_PREFIX}{step}", "user_annotation", PID, PID, opens[step], closes))
        for number, item in enumerate(plan):
            rank, cell = of[item.action]
            correlation = step * len(plan) + number + 1
            found += _unit(schedule.p, rank, cell, shift, head + number * LABEL_NS, correlation, latency_ns)
        if head + len(plan) * LABEL_NS > closes:
            raise HostBehindError(
                f"step {step}: issuing its {len(plan)} actions ({LABEL_NS} ns each) takes longer than the step"
            )
    return found


def _unit(
    p: int, rank: int, cell: shapes.Cell, shift: int, host: int, correlation: int, latency_ns: int
) -> list[dict[str, Any]]:
    """One action's label at `host`, its runtime call and what that puts on the device."""
    action = cell.action
    launch_start = host + shapes.LABEL_PAD_NS
    launch_end = launch_start + shapes.LAUNCH_NS
    found = [shapes.span(label(action), "user_annotation", PID, PID, host, host + LABEL_NS)]
    ids = {"correlation": correlation, "External id": correlation}
    if action.kind in (Kind.RECV_F, Kind.RECV_B):
        return [
            *found,
            shapes.span(WAIT_CALL, "cuda_runtime", PID, PID, launch_start, launch_end, **ids),
        ]
    start = cell.start + shift
    if launch_end > start:
        raise HostBehindError(
            f"{action} on rank {rank} starts {start - launch_end} ns before the host issued it: one host "
            f"thread issues every rank's actions ({LABEL_NS} ns each), so actions must be longer"
        )
    if action.kind.is_compute:
        tid = PID + shapes.AUTOGRAD_TID_OFFSET if action.kind in ON_AUTOGRAD_THREAD else PID
        call, name, cat, stream, end = (
            "cudaLaunchKernel",
            "ampere_sgemm_128x64_tn",
            "kernel",
            compute_stream(rank),
            cell.end + shift,
        )
    else:
        tid = PID
        call, name, cat, stream, end = (
            "cudaMemcpyAsync",
            COPY_KERNEL,
            "gpu_memcpy",
            copy_stream(p, rank),
            start + latency_ns,
        )
    return [
        *found,
        shapes.span(call, "cuda_runtime", PID, tid, launch_start, launch_end, **ids),
        shapes.span(name, cat, DEVICE, stream, start, end, device=DEVICE, stream=stream, **ids),
        shapes.span(
            label(action), "gpu_user_annotation", DEVICE, stream, start, end, device=DEVICE, stream=stream
        ),
    ]
