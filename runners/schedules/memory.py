"""How many microbatches each rank holds activations for, step by step: the schedule's memory theory.

A forward stashes its activations for the backward; they are released by the last backward piece
that reads them: B, or W when backward is split (W still needs the layer inputs). With
`until_weight_grad=False` a split backward releases at I instead, the zero-bubble paper's accounting,
where what W keeps is counted apart as smaller than a full stash.
"""

from __future__ import annotations

from collections.abc import Callable

from .actions import Action, Kind
from .schedule import Schedule


def held(
    schedule: Schedule, size: Callable[[Action], float], until_weight_grad: bool = True
) -> tuple[tuple[float, ...], ...]:
    """Per rank, the total `size` of the live stashed (stage, microbatch) pairs after each action of its
    order; `size` of a forward is what its stash holds (1: a count; its rows times bytes per row: bytes)."""
    # B releases an unsplit backward's stash; of a split one, W (or I, in the paper's accounting).
    release = (Kind.B, Kind.W if until_weight_grad else Kind.I)
    totals = []
    for order in schedule.orders:
        live, after = 0.0, []
        for action in order:
            if action.kind is Kind.F:
                live += size(action)
            elif action.kind in release:
                live -= size(Action(action.stage, Kind.F, action.microbatch))
            after.append(live)
        totals.append(tuple(after))
    return tuple(totals)


def in_flight(schedule: Schedule, until_weight_grad: bool = True) -> tuple[tuple[int, ...], ...]:
    """Per rank, the count of live stashed (stage, microbatch) pairs after each action of its order."""
    counts = held(schedule, lambda _: 1, until_weight_grad)
    return tuple(tuple(int(count) for count in rank) for rank in counts)
