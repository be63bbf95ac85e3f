"""Unprofiled timings for run.json: each stage's full-batch F and B (the reference efficiency for the
small-GEMM analysis) and the step time without the profiler.

Timings use CUDA events on a GPU and the wall clock on CPU. Calibration runs one rank at a time,
with a barrier between ranks, so CPU ranks sharing cores do not slow each other down. It is sampled
between the timed steps, just before the profiled ones, so it sees the machine as the steps did: where
its speed drifts (a shared VM), a calibration taken in one burst before the first step or after the
profiled ones times a different machine from the one the steps ran on, and the whole-batch cells of
an m=1 run, which should match it, do not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

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


Samples = dict[str, dict[str, list[float]]]  # stage index text -> {"F_ms": [...], "B_ms": [...]}


def stage_samples(
    stage: Stage, batch: torch.Tensor, is_last: bool, repeats: int, warmup: bool
) -> dict[str, list[float]]:
    """F and B times of one stage on the whole batch in one piece (after one untimed warm-up if asked:
    the first whole-batch pass of a run that splits the batch allocates)."""
    x = batch.detach().requires_grad_()
    out_grad = torch.randn_like(batch)
    forward_ms, backward_ms = [], []
    for _ in range(repeats + warmup):
        # each lambda runs at once, inside its own iteration, so binding the loop's variables late is right
        outputs = []
        forward_ms.append(time_ms(lambda: outputs.append(stage(x)), batch.device))  # noqa: B023
        target = loss_of(outputs[0], 1) if is_last else outputs[0]
        backward_ms.append(time_ms(lambda: target.backward(None if is_last else out_grad), batch.device))  # noqa: B023
        x.grad = None
        stage.zero_grad(set_to_none=True)
    return {"F_ms": forward_ms[warmup:], "B_ms": backward_ms[warmup:]}


def calibration_samples(
    stages: dict[int, Stage], batch: torch.Tensor, n_stages: int, repeats: int = 1, warmup: bool = True
) -> Samples:
    """Every stage's full-batch F and B samples, measured rank after rank, gathered on every rank."""
    mine = {}
    for rank in range(dist.get_world_size()):
        if rank == dist.get_rank():
            mine = {
                str(s): stage_samples(stage, batch, s == n_stages - 1, repeats, warmup)
                for s, stage in stages.items()
            }
        dist.barrier()
    gathered: list[Samples] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, mine)
    return dict(
        sorted(
            ((key, value) for part in gathered for key, value in part.items()), key=lambda item: int(item[0])
        )
    )


def pooled(rounds: list[Samples]) -> Samples:
    """Several rounds' samples as one."""
    return {
        stage: {kind: [ms for samples in rounds for ms in samples[stage][kind]] for kind in times}
        for stage, times in rounds[0].items()
    }


def calibration(samples: Samples) -> dict[str, dict[str, float]]:
    """run.json's calibration: per stage the median of each kind's samples."""
    return {
        stage: {kind: statistics.median(ms) for kind, ms in times.items()} for stage, times in samples.items()
    }


def timed_step(step: Callable[[], None], device: torch.device) -> float:
    """One unprofiled step's time in ms: the ranks start together, and the slowest rank's time counts."""
    dist.barrier()
    elapsed = torch.tensor([time_ms(step, device)], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return round(elapsed.item(), 3)
