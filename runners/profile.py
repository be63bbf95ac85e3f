"""A torch.profiler session over a few training steps, exported atomically as rank{r}.json.gz.

The profiler schedule skips `wait` steps, warms up for `warmup` and records `active` steps; each step
appears in the trace as a ProfilerStep#N span. The trace is written under a temporary name in the same
directory and renamed into place, so a reader never sees half a file. Memory counters of the active
steps (runners.stash: the executor's stash; on CUDA each step's allocator peak) and the executor's
run-queue samples (runners.runqueue) join the trace's events at export, on the profiler's clock.
`session` builds a profiler with the same settings and no export, for the calibration.
"""

from __future__ import annotations

import gzip
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from runners.rundir import temporary_beside
from runners.runqueue import RunQueueMeter, run_queue_events
from runners.schedules.trace_names import CUDA_PEAK_COUNTER
from runners.stash import StashMeter, base_ns, counter_event, stash_events, with_events

Counters = Callable[[int], list[bytes]]  # the trace's baseTimeNanoseconds -> counter events to add


def export_atomically(profiler: torch.profiler.profile, path: Path, counters: Counters | None = None) -> None:
    """The trace exported and gzipped under temporary names, renamed into place whole; the temporary
    files are removed whatever happens (a full disk)."""
    temporary = temporary_beside(path, ".json")
    packed = temporary.with_suffix(".json.gz")
    try:
        profiler.export_chrome_trace(str(temporary))
        trace = temporary.read_bytes()
        if counters is not None:
            trace = with_events(trace, counters(base_ns(trace)))
        packed.write_bytes(gzip.compress(trace, compresslevel=6))
        os.replace(packed, path)
    finally:
        temporary.unlink(missing_ok=True)
        packed.unlink(missing_ok=True)


def _step_with_cuda_peak(step: Callable[[], None], peaks: list[tuple[int, int]]) -> None:
    """Run one step; note the allocator's peak above what was allocated when it began (activations,
    gradients and temporaries of the step)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peaks.append((time.time_ns(), torch.cuda.max_memory_allocated() - before))


def activities(on_cuda: bool) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])


def session(on_cuda: bool, profile_memory: bool) -> torch.profiler.profile:
    """A profiler session with the profiled steps' activities and memory setting, recording from enter
    to exit; nothing exports it, so its trace is dropped with it (it is only there for its cost)."""
    return torch.profiler.profile(activities=activities(on_cuda), profile_memory=profile_memory)


def profile_steps(
    step: Callable[[], None],
    path: Path,
    active: int,
    on_cuda: bool,
    wait: int = 1,
    warmup: int = 1,
    profile_memory: bool = False,
    meter: StashMeter | None = None,
    run_queue: RunQueueMeter | None = None,
) -> None:
    """Run wait + warmup + active steps under the profiler and write the active ones to path."""
    schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    meter = meter or StashMeter()
    run_queue = run_queue or RunQueueMeter()
    cuda_peaks: list[tuple[int, int]] = []

    def counters(base: int) -> list[bytes]:
        return (
            stash_events(meter.samples, base)
            + [
                counter_event(CUDA_PEAK_COUNTER, t, base, {"peak_bytes_above_step_start": peak})
                for t, peak in cuda_peaks
            ]
            + run_queue_events(run_queue.values(), base)
        )

    with torch.profiler.profile(
        activities=activities(on_cuda),
        schedule=schedule,
        profile_memory=profile_memory,
        on_trace_ready=lambda prof: export_atomically(prof, path, counters),
    ) as profiler:
        for index in range(wait + warmup + active):
            if index == wait + warmup:  # keep only the recorded steps' samples
                meter.samples.clear()
                run_queue.samples.clear()
            if on_cuda and index >= wait + warmup:
                _step_with_cuda_peak(step, cuda_peaks)
            else:
                step()
            profiler.step()
