"""A torch.profiler session over a few training steps, exported atomically as rank{r}.json.gz.

The profiler schedule skips `wait` steps, warms up for `warmup` and records `active` steps; each step
appears in the trace as a ProfilerStep#N span. The trace is written under a temporary name in the same
directory and renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity


def export_atomically(profiler: torch.profiler.profile, path: Path) -> None:
    # export_chrome_trace gzips when the name ends in .gz, so the temporary name keeps that suffix.
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp.json.gz")
    profiler.export_chrome_trace(str(temporary))
    os.replace(temporary, path)


def profile_steps(
    step: Callable[[], None], path: Path, active: int, on_cuda: bool, wait: int = 1, warmup: int = 1
) -> None:
    """Run wait + warmup + active steps under the profiler and write the active ones to path."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    with torch.profiler.profile(
        activities=activities, schedule=schedule, on_trace_ready=lambda prof: export_atomically(prof, path)
    ) as profiler:
        for _ in range(wait + warmup + active):
            step()
            profiler.step()
