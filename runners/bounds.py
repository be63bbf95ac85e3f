"""How big a run may be asked to be, checked in the launcher before a schedule is built or any process
starts (torch-free): what the analysis reads of its traces by default, how many steps the profiler
holds, and what this machine's memory holds of its processes. Each problem is one line, or None."""

from __future__ import annotations

from analysis.traces.limits import Limits
from runners.presets import Preset, preset_bytes

# Profiled steps and timed steps. The profiler holds every profiled step's events until it exports
# them: a step of the cpu preset at m=32 is about 8,000 events a rank, so a thousand steps make a file
# of 8 million, which the analysis reads on a machine with 2.4 GB available (analysis.traces.limits).
STEPS_MAX = 1_000
# One worker process on the host before its model: torch, gloo and the profiler (430 MB measured on
# the tiny preset).
WORKER_BYTES = 500 * 1_000_000
READS = "the analysis reads (analysis.traces.limits)"


def steps_problem(steps: int, timed_steps: int) -> str | None:
    if min(steps, timed_steps) >= 1 and max(steps, timed_steps) <= STEPS_MAX:
        return None
    return f"steps and timed steps must be at least 1 and at most {STEPS_MAX:,}, got {steps:,} and {timed_steps:,}"


def limits_problem(p: int, m: int, v: int, dp: int) -> str | None:
    """Why the run's traces would be past the analysis's default limits, or None: checked before any
    schedule is built, whose size grows with p x m x v."""
    limits = Limits()
    if m > limits.microbatches:
        return f"m={m:,} microbatches, more than the {limits.microbatches:,} {READS}"
    if p * v > limits.stages:
        return f"P={p:,} x V={v:,} = {p * v:,} stages, more than the {limits.stages:,} {READS}"
    if p * dp > limits.ranks:
        return f"P={p:,} x DP={dp:,} = {p * dp:,} ranks, more than the {limits.ranks:,} {READS}"
    return None


def memory_problem(processes: int, preset: Preset, stage_copies: int, available: int | None) -> str | None:
    """Why `available` bytes cannot hold the run's processes, or None: each a worker (WORKER_BYTES) and
    `stage_copies` times what the preset's stages hold on the host (runners.presets.preset_bytes: the
    largest slow:S:K factor on CPU; 0 on a GPU or for a --model)."""
    each = WORKER_BYTES + preset_bytes(preset) * stage_copies
    if available is None or processes * each <= available:
        return None
    return (
        f"{processes:,} worker process(es) of the {preset.name} preset need about {processes * each / 1e9:,.1f} GB "
        f"({each / 1e6:,.0f} MB each), more than the {available / 1e9:.1f} GB this machine has available"
    )
