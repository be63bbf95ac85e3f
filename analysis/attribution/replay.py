"""Replay a run's schedule with what one measured step did (runners.schedules.simulate).

From the cells of one step (all ranks, one clock) come, per compute action: its duration (its busy
time: analysis.attribution.parts), the latency of each cross-rank input (when the data was there on the
consumer, minus when the producer finished) and the gap (how long after it could have started it did
start, plus the host time inside the cell, which is not work).
With all three the replay reproduces the measured compute starts; dropping some of them gives the
counterfactual rungs of the waterfall (analysis.attribution.waterfall).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from runners.schedules import Action, Kind, Schedule, Timeline, dependencies, simulate
from runners.schedules.dependencies import receiving


@dataclass(frozen=True)
class Measured:
    """One step's measurements in ns, keyed by the schedule's compute actions."""

    duration: dict[Action, float]
    latency: dict[tuple[Action, Action], float] = field(default_factory=dict)  # (producer, consumer)
    gap: dict[Action, float] = field(default_factory=dict)
    # hops whose arrival was not seen (the receiver came after the data): their latency is an upper bound
    bounded: set[tuple[Action, Action]] = field(default_factory=set)


def _by_action(cells: pl.DataFrame) -> dict[Action, dict]:
    return {
        Action(row["stage"], Kind(row["kind"]), row["microbatch"]): row for row in cells.iter_rows(named=True)
    }


def _arrival(recv: dict | None, waits_end: dict[Action, int]) -> tuple[float | None, bool]:
    """When the input was there on the consumer: the end of the RECV's wait, else at the latest the
    RECV's start (then the second value is True: a bound, not a sighting)."""
    if recv is None:
        return None, True
    action = Action(recv["stage"], Kind(recv["kind"]), recv["microbatch"])
    if action in waits_end:
        return waits_end[action], False
    return recv["start_ns"], True


def measure(schedule: Schedule, cells: pl.DataFrame, waits: pl.DataFrame, origin_ns: int) -> Measured:
    """Measurements of one step from its cells and waits (all ranks); times from `origin_ns`."""
    rows = _by_action(cells)
    waits_end = {
        Action(r["stage"], Kind(r["kind"]), r["microbatch"]): r["end_ns"]
        for r in waits.group_by("stage", "kind", "microbatch")
        .agg(pl.col("end_ns").max())
        .iter_rows(named=True)
    }
    duration, latency, gap, bounded = {}, {}, {}, set()
    for rank, order in enumerate(schedule.orders):
        free = origin_ns
        for action in order:
            row = rows.get(action)
            if row is None:  # not in the trace: zero-length and in place, so the replay still runs
                duration[action] = 0.0
                continue
            ready = free
            for dep in dependencies(schedule, action):
                producer = rows.get(dep)
                if producer is None:
                    continue
                end = producer["end_ns"]
                if schedule.rank_of(dep.stage) != rank:
                    arrival, bound = _arrival(rows.get(receiving(action)), waits_end)
                    latency[(dep, action)] = max(0.0, (arrival if arrival is not None else end) - end)
                    if bound:
                        bounded.add((dep, action))
                    end += latency[(dep, action)]
                ready = max(ready, end)
            occupied = float(row["end_ns"] - row["start_ns"] - row["blocked_ns"])
            busy = row.get("busy_ns")
            # the work is the cell's busy time; the host time inside the cell counts as a gap before it
            duration[action] = occupied if busy is None else min(float(busy), occupied)
            gap[action] = max(0.0, row["start_ns"] - ready) + occupied - duration[action]
            free = max(ready, row["start_ns"]) + occupied
    return Measured(duration, latency, gap, bounded)


def replay(schedule: Schedule, measured: Measured, gaps: bool = True, latencies: bool = True) -> Timeline:
    """The schedule replayed with the measured durations, and with the measured gaps and latencies
    where asked; times in ns from the step's origin."""
    return simulate(
        schedule,
        duration=lambda _rank, action: measured.duration.get(action, 0.0),
        latency=(lambda dep, action: measured.latency.get((dep, action), 0.0)) if latencies else None,
        gap=(lambda _rank, action: measured.gap.get(action, 0.0)) if gaps else None,
    )
