"""The typical step: every analysed step's own inputs (analysis.attribution.own_step) at their typical
values, replayed on the executed lowered order (analysis.attribution.replay).

Per (stage, kind) each input (lead, pre, work, transfer, post) is its mean over every analysed step
and microbatch, and per rank each tail part its mean over the steps: a typical value of times that
add is their mean (a sum of medians understates a sum of times whose spread is skewed, as a hop's is).
Replayed at the measured m it is `typical_step_ms`; `predict` replays it at other m, and the
waterfall's rungs replay it with effects left out. What the spread around these means costs on the
critical path is the waterfall's `variability`: the median step's own replay less this one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import polars as pl

from analysis.attribution.own_step import INPUT_COLUMNS, TAIL_COLUMNS, OwnSteps
from analysis.attribution.replay import Inputs, Step, Tail
from runners.schedules import Action

Key = tuple[int, str]  # (stage, kind)


@dataclass(frozen=True)
class StepModel:
    kinds: dict[Key, Inputs]  # (stage, kind) -> its mean inputs, ns
    tails: tuple[Tail, ...]  # per rank, its mean tail, ns
    orders: tuple[tuple[Action, ...], ...]  # each rank's lowered order, as the median step ran it
    blocking_sends: bool
    eager_receives: bool
    posted_receives: bool = False

    def step(
        self,
        orders: tuple[tuple[Action, ...], ...] | None = None,
        work: Callable[[Action], float] | None = None,
        host: bool = True,
        transfers: bool = True,
        tail: bool = True,
    ) -> Step:
        """The model as one step's replay inputs on `orders` (default: the executed ones; any m's lowered
        orders for a prediction); `work` replaces the busy times, and host time, transfers and the tail
        are left out where asked (the waterfall's rungs)."""
        orders = self.orders if orders is None else orders
        inputs = {}
        for order in orders:
            for action in order:
                typical = self.kinds.get((action.stage, action.kind.value), Inputs())
                if work is not None and action.kind.is_compute:
                    typical = replace(typical, work=work(action))
                if not host:
                    typical = replace(typical, lead=0.0, pre=0.0, post=0.0)
                if not transfers:
                    typical = replace(typical, transfer=0.0)
                inputs[action] = typical
        tails = self.tails if tail else tuple(Tail() for _ in self.tails)
        return Step(orders, inputs, tails, self.blocking_sends, self.eager_receives, self.posted_receives)

    @property
    def busy(self) -> dict[Key, float]:
        """(stage, kind) -> mean busy time of its compute cells."""
        return {key: inputs.work for key, inputs in self.kinds.items() if inputs.work}


def fit(own: OwnSteps, median_step: int, p: int) -> StepModel:
    """The means over every analysed step, on the median step's orders (an eager receive's transfer
    over the receives that saw it)."""
    # an eager receive of a (stage, kind) that always found its data there has no transfer seen: 0
    kinds = own.actions.group_by("stage", "kind").agg(pl.col(c).mean().fill_null(0.0) for c in INPUT_COLUMNS)
    tails = own.tails.group_by("rank").agg(pl.col(c).mean() for c in TAIL_COLUMNS)
    per_rank = {rank: Tail(*values) for rank, *values in tails.iter_rows()}
    return StepModel(
        {(stage, kind): Inputs(*values) for stage, kind, *values in kinds.iter_rows()},
        tuple(per_rank.get(rank, Tail()) for rank in range(p)),
        own.step(median_step, p).orders,
        own.blocking_sends,
        own.eager_receives,
        own.posted_receives,
    )
