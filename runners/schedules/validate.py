"""validate(): a schedule runs, every action exactly once, on the right rank, without deadlock.

Checked in the order a reader would want to hear about it: stray or duplicated actions first (the grid
marks where), then missing ones, then comm pairing (each SEND has exactly one RECV on the peer and every
cross-rank tensor is sent and received), then a unit-time replay with blocking RECVs and asynchronous
SENDs, which finds any dependency the order cannot satisfy.
"""

from __future__ import annotations

from collections.abc import Iterator

from .actions import Action, Kind
from .grid import grid
from .lower import incoming, outgoing
from .schedule import Schedule, ScheduleError
from .simulate import simulate


def _expected_compute(schedule: Schedule) -> Iterator[Action]:
    """F, then B or I and W, of every (stage, microbatch); which backward is the schedule's choice."""
    for stage in range(schedule.n_stages):
        for mb in range(schedule.m):
            backward = schedule.backward_of(stage, mb)
            kinds = (Kind.F, Kind.I, Kind.W) if backward.kind is Kind.I else (Kind.F, Kind.B)
            yield from (Action(stage, kind, mb) for kind in kinds)


def _expected(schedule: Schedule) -> set[Action]:
    compute = set(_expected_compute(schedule))
    if not schedule.lowered:
        return compute
    comms = {c for a in compute for c in (incoming(schedule, a), outgoing(schedule, a)) if c is not None}
    return compute | comms


def _fail(schedule: Schedule, problem: str, marks: set[tuple[int, int]] = frozenset()) -> ScheduleError:
    return ScheduleError(f"{schedule.name}: {problem}\n{grid(schedule, marks=marks)}")


def _why_unexpected(schedule: Schedule, action: Action) -> str:
    if action.kind.is_comm and not schedule.lowered:
        return "a comm action in a schedule not marked lowered"
    if action.kind.is_comm:
        return "a SEND/RECV with no partner (its stages share a rank, or it crosses no stage boundary)"
    return "not an action of this pipeline"


def _check_placement(schedule: Schedule, expected: set[Action]) -> None:
    seen: dict[Action, tuple[int, int]] = {}
    for rank, order in enumerate(schedule.orders):
        for step, action in enumerate(order):
            if action not in expected:
                raise _fail(
                    schedule,
                    f"{action} at rank {rank} step {step}: {_why_unexpected(schedule, action)}",
                    {(rank, step)},
                )
            if schedule.rank_of(action.stage) != rank:
                raise _fail(
                    schedule,
                    f"{action} on rank {rank}, but stage {action.stage} lives on rank "
                    f"{schedule.rank_of(action.stage)}",
                    {(rank, step)},
                )
            if action in seen:
                raise _fail(
                    schedule,
                    f"{action} twice (rank {rank} steps {seen[action][1]} and {step})",
                    {seen[action], (rank, step)},
                )
            seen[action] = (rank, step)
    missing = sorted(expected - seen.keys())
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        raise _fail(schedule, f"{len(missing)} action(s) never scheduled: {shown}")


def _check_shape(schedule: Schedule) -> None:
    if len(schedule.orders) != schedule.p:
        raise ScheduleError(f"{schedule.name}: {len(schedule.orders)} rank orders for p={schedule.p}")


def validate(schedule: Schedule) -> None:
    """Raise ScheduleError (with the step x rank grid, the failing step marked) unless `schedule` runs."""
    _check_shape(schedule)
    _check_placement(schedule, _expected(schedule))
    simulate(schedule)
