"""The schedule value: which actions each rank runs, in order, plus the pipeline's shape.

A schedule is data, not control flow, so it can be drawn, checked and simulated without a GPU. Stage
placement is one of three:
- "loop" (every generator but the V-shaped ones): global stage s lives on rank s % p (for v = 1 that
  is stage s on rank s; for interleaved, chunk c of rank r is stage c * p + r, Megatron's layout);
- "v" (zbv, dualpipev; v = 2): rank r holds stages r and 2p-1-r, so the model runs down the ranks and
  back up, and the first and last stage share rank 0 (torch's `style="v"`);
- "custom": `stage_ranks[s]` is the rank of stage s (an order read from traces whose stages sit
  neither way, e.g. a schedule loaded from CSV).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .actions import Action, Kind

PLACEMENTS = ("loop", "v", "custom")


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
    placement: str = "loop"  # which rank holds which stage: "loop", "v" or "custom" (the module docstring)
    stage_ranks: tuple[int, ...] = ()  # "custom" only: the rank of each global stage

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ScheduleError(
                f"{self.name}: unknown placement {self.placement!r}; known: {', '.join(PLACEMENTS)}"
            )
        if self.placement == "v" and self.v != 2:
            raise ScheduleError(f"{self.name}: a V placement holds 2 stages per rank, not v={self.v}")
        if (self.placement == "custom") != bool(self.stage_ranks):
            raise ScheduleError(f"{self.name}: stage_ranks go with the custom placement, and only with it")
        if self.stage_ranks and (
            len(self.stage_ranks) != self.n_stages or not set(self.stage_ranks) <= set(range(self.p))
        ):
            raise ScheduleError(
                f"{self.name}: stage_ranks {self.stage_ranks} do not place {self.n_stages} stages "
                f"on {self.p} ranks"
            )

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    def rank_of(self, stage: int) -> int:
        if self.placement == "custom":
            return self.stage_ranks[stage]
        if self.placement == "v":
            return stage if stage < self.p else self.n_stages - 1 - stage
        return stage % self.p

    def stages_of(self, rank: int) -> tuple[int, ...]:
        if self.placement == "custom":
            return tuple(stage for stage, owner in enumerate(self.stage_ranks) if owner == rank)
        if self.placement == "v":
            return (rank, self.n_stages - 1 - rank)
        return tuple(range(rank, self.n_stages, self.p))

    @cached_property
    def _split(self) -> frozenset[tuple[int, int]]:
        """The (stage, microbatch) pairs whose backward is split into I and W."""
        return frozenset((a.stage, a.microbatch) for order in self.orders for a in order if a.kind is Kind.I)

    @property
    def split_backward(self) -> bool:
        """True when some backward is split into I (input grad) and W (weight grad), as in zero-bubble."""
        return bool(self._split)

    def backward_of(self, stage: int, microbatch: int) -> Action:
        """The action that carries (stage, microbatch)'s gradient upstream: its I when its backward is
        split, else its B. Per pair, since DualPipeV splits only some microbatches' backwards."""
        kind = Kind.I if (stage, microbatch) in self._split else Kind.B
        return Action(stage, kind, microbatch)


def placement_of(stage_ranks: tuple[int, ...], p: int) -> tuple[str, tuple[int, ...]]:
    """The placement that puts stage s on rank stage_ranks[s]: "loop" or "v" where one of them does,
    else "custom" with the ranks themselves (the `placement` and `stage_ranks` of a Schedule)."""
    n_stages = len(stage_ranks)
    if all(rank == stage % p for stage, rank in enumerate(stage_ranks)):
        return "loop", ()
    if n_stages == 2 * p and all(
        rank == min(stage, n_stages - 1 - stage) for stage, rank in enumerate(stage_ranks)
    ):
        return "v", ()
    return "custom", tuple(stage_ranks)
