"""A trace of the shape DeepSeek published for DualPipe's overlapped chunks (deepseek-ai/profile-data's
train.json: rank 0 of 64, GPU), small and synthetic: that file has no licence, so tests cannot ship it.

On the main thread each `ProfilerStep#N` holds `blocks` annotations `1F1B` (with `block` None, none:
the phases lie in the step itself), each holding `layers` repeated layer blocks of the ten phase labels
in DualPipe's order (LAYER_PHASES): one microbatch's forward chunk and another's backward chunk,
interleaved. Each phase holds `kernels` cpu_ops `aten::mm`. On GPU each op wraps one cudaLaunchKernel,
made on autograd's engine thread for B and W (where the real trace launches the backward) while the
phase stays open on the main thread; dispatch and combine launch on a comm stream (DeepEP's all-to-all),
the rest on the compute stream, and each stream runs its kernels in launch order, so a comm kernel runs
on under the phases after it, as the real chunks overlap. `truth` has one row per kernel (GPU) or op
(CPU): its step, block, layer, kind, stream and times.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from analysis.traces.kineto import STEP_PREFIX, span
from synthetic.shapes import AUTOGRAD_TID_OFFSET, COMPUTE_STREAM, LAUNCH_NS

# One layer's phases as DualPipe's 1F1B block annotates them, in its order.
LAYER_PHASES = (
    "combine(B)",
    "attn(F)",
    "mlp(B)",
    "dispatch(F)",
    "dispatch(B)",
    "mlp(W)",
    "mlp(F)",
    "attn(B)",
    "attn(W)",
    "combine(F)",
)
BLOCK = "1F1B"
COMM_PHASES = ("dispatch", "combine")  # their kernels run on the comm stream
COMM_STREAM = 27
PID = 1166
OP_NS = 10_000  # one aten::mm on the host, its launch inside
OP_GAP_NS = 2_000  # host time between ops, and around a phase's ops inside the phase
KERNEL_NS = {COMPUTE_STREAM: 6_000, COMM_STREAM: 25_000}
DEVICE_LAG_NS = 3_000  # a launch's kernel starts this long after the call ends, on an idle stream
TRACE_START_NS = 1_000_000_000  # whole microseconds: ts written as exact decimals
FILE_NAME = "train.json"  # the published file's name: no rank in it, the rank from distributedInfo


class Phased(NamedTuple):
    document: dict[str, Any]
    truth: list[dict[str, Any]]


def phase_trace(
    steps: int = 1,
    blocks: int = 1,
    layers: int = 4,
    kernels: int = 2,
    block: str | None = BLOCK,
    on_gpu: bool = True,
    world_size: int = 64,
) -> Phased:
    """Rank 0's trace of a job of `world_size` ranks (the module docstring)."""
    trace = _Trace(on_gpu)
    for step in range(steps):
        step_start = trace.host
        for index in range(blocks):
            block_start = trace.pause()
            for layer in range(layers):
                for phase in LAYER_PHASES:
                    trace.phase(phase, kernels, {"step": step, "block": index, "layer": layer})
            if block is not None:
                trace.events.append(span(block, "user_annotation", PID, PID, block_start, trace.pause()))
        trace.events.append(
            span(f"{STEP_PREFIX}{step}", "user_annotation", PID, PID, step_start, trace.pause())
        )
    device = [{"id": 0, "name": "Synthetic H800", "totalGlobalMem": 80 * 2**30, "computeMajor": 9}]
    document = {
        "schemaVersion": 1,
        "deviceProperties": device if on_gpu else [],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": world_size},
        "traceEvents": trace.events,
    }
    return Phased(document, trace.truth)


def write_phase_trace(directory: str | Path, **options: Any) -> Phased:
    """phase_trace written as `directory`/train.json."""
    made = phase_trace(**options)
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / FILE_NAME).write_text(json.dumps(made.document))
    return made


class _Trace:
    """The events so far, the host's clock and each stream's: when it is free again."""

    def __init__(self, on_gpu: bool):
        self.on_gpu, self.host = on_gpu, TRACE_START_NS
        self.free = dict.fromkeys(KERNEL_NS, 0)
        self.events: list[dict[str, Any]] = []
        self.truth: list[dict[str, Any]] = []
        self.correlation = 0

    def pause(self) -> int:
        """The host's time after a gap (before and after a phase, a block, a step)."""
        self.host += OP_GAP_NS
        return self.host

    def phase(self, name: str, ops: int, where: dict[str, Any]) -> None:
        kind = name[-2]
        start = self.pause()
        for _ in range(ops):
            self.op(name, kind, where)
            self.pause()
        self.events.append(span(name, "user_annotation", PID, PID, start, self.host))

    def op(self, name: str, kind: str, where: dict[str, Any]) -> None:
        """One aten::mm on the host; on GPU its launch and kernel."""
        tid = PID + AUTOGRAD_TID_OFFSET if kind in "BW" and self.on_gpu else PID
        start, self.host = self.host, self.host + OP_NS
        self.events.append(span("aten::mm", "cpu_op", PID, tid, start, self.host))
        row = where | {"kind": kind, "stream": None, "start_ns": start, "end_ns": self.host}
        if self.on_gpu:
            self.correlation += 1
            stream = COMM_STREAM if name.startswith(COMM_PHASES) else COMPUTE_STREAM
            launch_end = self.host - OP_GAP_NS
            begin = max(launch_end + DEVICE_LAG_NS, self.free[stream])
            self.free[stream] = end = begin + KERNEL_NS[stream]
            ids = {"correlation": self.correlation, "External id": self.correlation}
            self.events += [
                span("cudaLaunchKernel", "cuda_runtime", PID, tid, launch_end - LAUNCH_NS, launch_end, **ids),
                span(f"kernel of {name}", "kernel", 0, stream, begin, end, device=0, stream=stream, **ids),
            ]
            row |= {"stream": stream, "start_ns": begin, "end_ns": end}
        self.truth.append(row)
