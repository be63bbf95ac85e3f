"""Replay a run's schedule with what its measured steps did (runners.schedules.simulate).

From the cells of each step (all ranks, one clock) come, per compute action: its duration (its busy
time: analysis.attribution.parts), the latency of each cross-rank input (when the data was there on the
consumer, minus when the producer finished) and the gap (how long after it could have started it did
start, plus the host time inside the cell, which is not work).
With all three the replay reproduces the measured compute starts; dropping some of them gives the
counterfactual rungs of the waterfall (analysis.attribution.waterfall).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

import polars as pl

from runners.schedules import Action, Schedule, Timeline, dependencies, simulate
from runners.schedules.dependencies import matching_send, receiving

Key = tuple[int, str, int]  # (stage, kind, microbatch): an action as the cells name it
Row = tuple[int, int, int, float | None]  # a cell's start_ns, end_ns, blocked_ns, busy_ns (None: unknown)


@dataclass(frozen=True)
class Measured:
    """One step's measurements in ns, keyed by the schedule's compute actions."""

    duration: dict[Action, float]
    latency: dict[tuple[Action, Action], float] = field(default_factory=dict)  # (producer, consumer)
    gap: dict[Action, float] = field(default_factory=dict)
    # hops whose arrival was not seen (the receiver looked after the data was sent): latency is a bound
    bounded: set[tuple[Action, Action]] = field(default_factory=set)


def _key(action: Action) -> Key:
    return action.stage, action.kind.value, action.microbatch


class _Input(NamedTuple):
    """One input of an action as the schedule fixes it: its producer and, where that is on another
    rank, the RECV that brings it and the peer's SEND that RECV waits for."""

    producer: Action
    made: Key  # the producer's
    recv: Key | None
    send: Key | None


Plan = list[list[tuple[Action, Key, list[_Input]]]]


def _plan(schedule: Schedule) -> Plan:
    """Per rank its executed order, each action with its inputs: the same for every step."""
    plan = []
    for rank, order in enumerate(schedule.orders):
        steps = []
        for action in order:
            inputs = []
            for dep in dependencies(schedule, action):
                if schedule.rank_of(dep.stage) == rank:
                    inputs.append(_Input(dep, _key(dep), None, None))
                else:
                    recv = receiving(action)
                    inputs.append(_Input(dep, _key(dep), _key(recv), _key(matching_send(recv))))
            steps.append((action, _key(action), inputs))
        plan.append(steps)
    return plan


def _by_step(cells: pl.DataFrame) -> dict[int, dict[Key, Row]]:
    """step -> action -> its cell's times (the last cell where an action has several)."""
    busy = cells["busy_ns"].to_list() if "busy_ns" in cells.columns else [None] * cells.height
    names = ("step", "stage", "kind", "microbatch", "start_ns", "end_ns", "blocked_ns")
    by_step = defaultdict(dict)
    for step, stage, kind, microbatch, *row in zip(*(cells[name].to_list() for name in names), busy):
        by_step[step][(stage, kind, microbatch)] = tuple(row)
    return by_step


def _wait_spans(waits: pl.DataFrame) -> dict[int, dict[Key, tuple[int, int]]]:
    """step -> action -> from its first wait's start to its last one's end."""
    spans = waits.group_by("step", "stage", "kind", "microbatch").agg(
        pl.col("start_ns").min(), pl.col("end_ns").max()
    )
    by_step = defaultdict(dict)
    for step, stage, kind, microbatch, start, end in spans.iter_rows():
        by_step[step][(stage, kind, microbatch)] = (start, end)
    return by_step


def _arrival(
    recv: Key, rows: dict[Key, Row], waits: dict[Key, tuple[int, int]], sent_ns: int
) -> tuple[float, bool]:
    """When the input was there on the consumer, and whether that was seen: the end of the RECV's wait
    if the receiver was waiting before the data was sent; else at the latest that end, or the RECV's
    start (an upper bound: the data may have been there for a while)."""
    row = rows.get(recv)
    if row is None:
        return sent_ns, False
    span = waits.get(recv)
    if span is None:
        return row[0], False
    return span[1], span[0] <= sent_ns


def measure(
    schedule: Schedule, cells: pl.DataFrame, waits: pl.DataFrame, origins: dict[int, int]
) -> list[Measured]:
    """Measurements of each step of `origins` (step -> its origin in ns), in that order, from the cells
    and waits of all ranks; each step's times from its origin."""
    plan, rows, spans = _plan(schedule), _by_step(cells), _wait_spans(waits)
    return [_measure_step(plan, rows[step], spans.get(step, {}), origin) for step, origin in origins.items()]


def _measure_step(
    plan: Plan,
    rows: dict[Key, Row],
    waits: dict[Key, tuple[int, int]],
    origin_ns: int,
) -> Measured:
    """One step's measurements: a pass over each rank's order, an action ready once the rank is free
    and its inputs are there."""
    duration, latency, gap, bounded = {}, {}, {}, set()
    for order in plan:
        free = origin_ns
        for action, key, inputs in order:
            row = rows.get(key)
            if row is None:  # not in the trace: zero-length and in place, so the replay still runs
                duration[action] = 0.0
                continue
            ready = free
            for producer, made, recv, send in inputs:
                produced = rows.get(made)
                if produced is None:
                    continue
                end = produced[1]
                if recv is not None:
                    sent = rows.get(send)
                    arrival, seen = _arrival(recv, rows, waits, end if sent is None else max(end, sent[0]))
                    hop, latency_ns = (producer, action), max(0, arrival - end)
                    latency[hop] = float(latency_ns)
                    if not seen:
                        bounded.add(hop)
                    end += latency_ns
                ready = max(ready, end)
            # Times stay integer ns: a float at ~1.8e18 ns since the epoch resolves only 256 ns.
            start, stop, blocked, busy = row
            occupied = stop - start - blocked
            # the work is the cell's busy time; the host time inside the cell counts as a gap before it
            work = float(occupied) if busy is None else min(float(busy), float(occupied))
            duration[action] = work
            gap[action] = float(max(0, start - ready)) + occupied - work
            free = max(ready, start) + occupied
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
