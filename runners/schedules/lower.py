"""Lowering: add the SEND/RECV actions a compute-only schedule needs to run on separate ranks.

A SEND goes right after the compute that produced the tensor (sends are asynchronous, so posting early
never blocks), a RECV right before the compute that consumes it (receives block, so posting late keeps
the rank busy for as long as possible). Adjacent stages on the same rank (interleaved with p = 1) hand
tensors over in memory and need no comm.
"""

from __future__ import annotations

from dataclasses import replace

from .actions import Action, Kind
from .schedule import Schedule, ScheduleError

# The kinds that carry a gradient upstream: B, or I where backward is split (W sends nothing).
GRADIENT_KINDS = (Kind.B, Kind.I)


def incoming(schedule: Schedule, action: Action) -> Action | None:
    """The RECV that must precede compute `action` on its rank, or None if its input is local."""
    stage, mb = action.stage, action.microbatch
    if action.kind is Kind.F and stage > 0 and schedule.rank_of(stage - 1) != schedule.rank_of(stage):
        return Action(stage, Kind.RECV_F, mb)
    if action.kind in GRADIENT_KINDS and stage < schedule.n_stages - 1:
        if schedule.rank_of(stage + 1) != schedule.rank_of(stage):
            return Action(stage, Kind.RECV_B, mb)
    return None


def outgoing(schedule: Schedule, action: Action) -> Action | None:
    """The SEND that must follow compute `action` on its rank, or None if its consumer is local."""
    stage, mb = action.stage, action.microbatch
    last = schedule.n_stages - 1
    if action.kind is Kind.F and stage < last and schedule.rank_of(stage + 1) != schedule.rank_of(stage):
        return Action(stage, Kind.SEND_F, mb)
    if action.kind in GRADIENT_KINDS and stage > 0:
        if schedule.rank_of(stage - 1) != schedule.rank_of(stage):
            return Action(stage, Kind.SEND_B, mb)
    return None


def lower(schedule: Schedule) -> Schedule:
    """The same schedule with SEND_F/RECV_F/SEND_B/RECV_B inserted; `lowered` is set."""
    if schedule.lowered:
        raise ScheduleError(f"{schedule.name}: already lowered")
    orders = []
    for order in schedule.orders:
        lowered: list[Action] = []
        for action in order:
            recv, send = incoming(schedule, action), outgoing(schedule, action)
            lowered.extend(a for a in (recv, action, send) if a is not None)
        orders.append(tuple(lowered))
    return replace(schedule, orders=tuple(orders), lowered=True)
