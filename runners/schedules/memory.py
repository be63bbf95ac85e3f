"""How many microbatches each rank holds activations for, step by step: the schedule's memory theory.

A forward stashes its activations for the backward; they are released by the last backward piece
that reads them: B, or W when backward is split (W still needs the layer inputs). With
`until_weight_grad=False` a split backward releases at I instead, the zero-bubble paper's accounting,
where what W keeps is counted apart as smaller than a full stash.
"""

from __future__ import annotations

from .actions import Kind
from .schedule import Schedule


def in_flight(schedule: Schedule, until_weight_grad: bool = True) -> tuple[tuple[int, ...], ...]:
    """Per rank, the count of live stashed (stage, microbatch) pairs after each action of its order."""
    # B releases an unsplit backward's stash; of a split one, W (or I, in the paper's accounting).
    release = (Kind.B, Kind.W if until_weight_grad else Kind.I)
    counts = []
    for order in schedule.orders:
        live, after = 0, []
        for action in order:
            live += (action.kind is Kind.F) - (action.kind in release)
            after.append(live)
        counts.append(tuple(after))
    return tuple(counts)
