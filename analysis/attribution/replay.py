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
from runners.schedules.dependencies import matching_send, receiving


@dataclass(frozen=True)
class Measured:
    """One step's measurements in ns, keyed by the schedule's compute actions."""

    duration: dict[Action, float]
    latency: dict[tuple[Action, Action], float] = field(default_factory=dict)  # (producer, consumer)
    gap: dict[Action, float] = field(default_factory=dict)
    # hops whose arrival was not seen (the receiver looked after the data was sent): latency is a bound
    bounded: set[tuple[Action, Action]] = field(default_factory=set)


def _by_action(cells: pl.DataFrame) -> dict[Action, dict]:
    return {
        Action(row["stage"], Kind(row["kind"]), row["microbatch"]): row for row in cells.iter_rows(named=True)
    }


def _arrival(recv: dict | None, waits: dict[Action, tuple[int, int]], sent_ns: int) -> tuple[float, bool]:
    """When the input was there on the consumer, and whether that was seen: the end of the RECV's wait
    if the receiver was waiting before the data was sent; else at the latest that end, or the RECV's
    start (an upper bound: the data may have been there for a while)."""
    if recv is None:
        return sent_ns, False
    span = waits.get(Action(recv["stage"], Kind(recv["kind"]), recv["microbatch"]))
    if span is None:
        return recv["start_ns"], False
    return span[1], span[0] <= sent_ns


def measure(schedule: Schedule, cells: pl.DataFrame, waits: pl.DataFrame, origin_ns: int) -> Measured:
    """Measurements of one step from its cells and waits (all ranks); times from `origin_ns`."""
    rows = _by_action(cells)
    spans = waits.group_by("stage", "kind", "microbatch").agg(
        pl.col("start_ns").min(), pl.col("end_ns").max()
    )
    wait_spans = {
        Action(stage, Kind(kind), microbatch): (start, end)
        for stage, kind, microbatch, start, end in spans.iter_rows()
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
                    recv = receiving(action)
                    send = rows.get(matching_send(recv), {"start_ns": end})
                    arrival, seen = _arrival(rows.get(recv), wait_spans, max(end, send["start_ns"]))
                    latency[(dep, action)] = max(0.0, arrival - end)
                    if not seen:
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
