"""The simulated ideal step: the run's schedule replayed with reference durations, no p2p, no gaps.

Reference durations come from run.json's calibration (each stage's F and B for the whole batch in one
piece, divided by m: the work at full-batch efficiency). Without calibration the measured median of
each (stage, kind) stands in, and the caption says so. Shared by the report's timeline and the merged
trace's ideal track.
"""

from __future__ import annotations

import polars as pl

from analysis.timeline.gaps import COMPUTE_KINDS
from runners.schedules import Schedule, ScheduleError, Timeline, build, simulate


def calibrated_durations(calibration: dict, m: int) -> dict[tuple[int, str], float]:
    """(stage, kind) -> ms per microbatch. A split backward (I, W) is taken as half of B each."""
    durations = {}
    for stage, times in calibration.items():
        forward, backward = float(times["F_ms"]) / m, float(times["B_ms"]) / m
        durations |= {(int(stage), "F"): forward, (int(stage), "B"): backward}
        durations |= {(int(stage), "I"): backward / 2, (int(stage), "W"): backward / 2}
    return durations


def measured_durations(cells: pl.DataFrame) -> dict[tuple[int, str], float]:
    """(stage, kind) -> median measured ms per compute cell."""
    medians = (
        cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
        .group_by("stage", "kind")
        .agg(ms=((pl.col("end_ns") - pl.col("start_ns")) / 1e6).median())
    )
    return {(int(s), str(k)): float(ms) for s, k, ms in medians.iter_rows()}


def ideal_replay(config: dict, cells: pl.DataFrame | None) -> tuple[Schedule | None, Timeline | None, str]:
    """The run's schedule replayed with reference durations (ms), and the caption (or why there is none).

    `config` holds schedule, p, m, v (summary.json or run.json) and calibration (run.json's, or None).
    """
    try:
        schedule = build(str(config["schedule"]), int(config["p"]), int(config["m"]), int(config.get("v") or 1))
    except (KeyError, TypeError, ValueError, ScheduleError) as error:
        return None, None, f"No simulated timeline: the schedule cannot be rebuilt ({error})."
    if config.get("calibration"):
        durations = calibrated_durations(config["calibration"], schedule.m)
        source = "calibration (each stage's whole-batch F and B from run.json, divided by m)"
    elif cells is not None and cells.height:
        durations = measured_durations(cells)
        source = "the measured median of each stage's F/B (run.json has no calibration)"
    else:
        return None, None, "No simulated timeline: no calibration and no measured cells to take durations from."
    fallback = sorted(durations.values())[len(durations) // 2]
    timeline = simulate(schedule, duration=lambda rank, action: durations.get((action.stage, action.kind.value), fallback))
    caption = (f"Simulated: the {schedule.name} schedule (p={schedule.p}, m={schedule.m}, v={schedule.v}) replayed "
               f"with durations from {source}, no p2p latency, no launch gaps; makespan {timeline.makespan:.3f} ms.")
    return schedule, timeline, caption
