"""Unprofiled timings for run.json: each stage's full-batch F and B (the reference efficiency for the
small-GEMM analysis) and the step time without the profiler.

Timings use CUDA events on a GPU and the wall clock on CPU. Calibration runs one rank at a time,
with a barrier between ranks, so CPU ranks sharing cores do not slow each other down.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from runners.model import Stage, loss_of


def time_ms(work: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    work()
    return (time.perf_counter() - began) * 1e3


def stage_times(stage: Stage, batch: torch.Tensor, is_last: bool, repeats: int) -> dict[str, float]:
    """Median F and B of one stage on the whole batch in one piece (after one untimed warm-up)."""
    x = batch.detach().requires_grad_()
    out_grad = torch.randn_like(batch)
    forward_ms, backward_ms = [], []
    for _ in range(repeats + 1):
        outputs = []
        forward_ms.append(time_ms(lambda: outputs.append(stage(x)), batch.device))
        target = loss_of(outputs[0], 1) if is_last else outputs[0]
        backward_ms.append(time_ms(lambda: target.backward(None if is_last else out_grad), batch.device))
        x.grad = None
        stage.zero_grad(set_to_none=True)
    return {"F_ms": statistics.median(forward_ms[1:]), "B_ms": statistics.median(backward_ms[1:])}


def calibrate(stages: dict[int, Stage], batch: torch.Tensor, n_stages: int, repeats: int = 3) -> dict[str, dict]:
    """Every stage's full-batch F and B, measured rank after rank, gathered on every rank."""
    mine = {}
    for rank in range(dist.get_world_size()):
        if rank == dist.get_rank():
            mine = {str(s): stage_times(stage, batch, s == n_stages - 1, repeats) for s, stage in stages.items()}
        dist.barrier()
    gathered: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, mine)
    merged = {key: value for part in gathered for key, value in part.items()}
    return dict(sorted(merged.items(), key=lambda item: int(item[0])))


def unprofiled_step_times(step: Callable[[], None], count: int, device: torch.device) -> list[float]:
    """Each step's time in ms: the ranks start together, and the slowest rank's time counts."""
    samples = []
    for _ in range(count):
        dist.barrier()
        elapsed = torch.tensor([time_ms(step, device)], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        samples.append(round(elapsed.item(), 3))
    return samples
