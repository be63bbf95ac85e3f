"""The schedule value: which actions each rank runs, in order, plus the pipeline's shape.

A schedule is data, not control flow, so it can be drawn, checked and simulated without a GPU. Stage
placement is the one every generator here uses: global stage s lives on rank s % p (for v = 1 that is
stage s on rank s; for interleaved, chunk c of rank r is stage c * p + r, Megatron's layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .actions import Action, Kind


class ScheduleError(ValueError):
    """A schedule that cannot be built or would not run; the message says why (with the grid if useful)."""


@dataclass(frozen=True)
class Schedule:
    name: str
    p: int  # pipeline ranks
    m: int  # microbatches per step
    v: int  # stages (chunks) per rank
    orders: tuple[tuple[Action, ...], ...]  # per rank, in execution order
    lowered: bool = False  # True once SEND/RECV actions are in the orders

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    def rank_of(self, stage: int) -> int:
        return stage % self.p

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(range(rank, self.n_stages, self.p))

    @cached_property
    def split_backward(self) -> bool:
        """True when backward is split into I (input grad) and W (weight grad), as in zero-bubble."""
        return any(action.kind is Kind.I for order in self.orders for action in order)

    @property
    def backward_kind(self) -> Kind:
        """The kind that carries the gradient upstream: I when backward is split, else B."""
        return Kind.I if self.split_backward else Kind.B
