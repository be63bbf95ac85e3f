"""The model of a step that the waterfall's last rung and `predict` replay: medians, no start times.

From every analysed step's measurements (analysis.attribution.replay.measure) the model keeps, per
(stage, kind), the median busy time of its cells and the median host gap before them (the host time
before and inside an action that is not work), and per direction of a hop (activations, gradients)
the median latency from the producer's end to the data's arrival, over the hops whose arrival was seen
(the receiver was already waiting; where it came later, the data had been there for an unknown time);
and the median time the step goes on after the schedule's last action (the optimizer step, waiting for
pending sends, on GPU the host's turn to the next step). Replayed on the executed order
(runners.schedules.simulate), it predicts the step: whatever it does not explain (jitter, order
effects, one slow microbatch) is the waterfall's residual. Like torch.distributed.pipelining's
simulator it is not high-fidelity: it does not model compute and communication overlapping beyond
what the order allows, contention between ranks, or message sizes (a hop's latency is taken as it was
measured, whatever the microbatch size).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import polars as pl

from analysis.attribution.replay import Measured, Measurements, direction
from runners.schedules import Schedule, dependencies

Key = tuple[int, str]  # (stage, kind)


@dataclass(frozen=True)
class StepModel:
    duration: dict[Key, float]  # median busy ns of a (stage, kind)'s cells
    gap: dict[Key, float]  # median host ns before (and inside) them
    latency: dict[str, float]  # direction -> median ns from the producer's end to the data's arrival
    tail: float  # median ns of the step after its last action

    def measured(self, schedule: Schedule, duration: dict[Key, float] | None = None) -> Measured:
        """The model as the measurements of one step of `schedule` (any m); `duration` replaces the busy
        times (a rung of the waterfall)."""
        per_key = self.duration if duration is None else duration
        actions = [a for order in schedule.orders for a in order if a.kind.is_compute]
        hops = {
            (dep, a): self.latency.get(direction(dep), 0.0)
            for a in actions
            for dep in dependencies(schedule, a)
            if schedule.rank_of(dep.stage) != schedule.rank_of(a.stage)
        }
        return Measured(
            {a: per_key.get((a.stage, a.kind.value), 0.0) for a in actions},
            hops,
            {a: self.gap.get((a.stage, a.kind.value), 0.0) for a in actions},
        )


def fit(measured: Measurements, tails: list[float]) -> StepModel:
    """The medians over every analysed step's measurements and the time after their last action."""
    kinds = measured.actions.group_by("stage", "kind").agg("duration", pl.col("gap").drop_nulls())
    hops = measured.hops.group_by("direction").agg(
        seen=pl.col("latency").filter("seen"), bounds=pl.col("latency").filter(~pl.col("seen"))
    )
    # a direction whose data always arrived before its receiver looked is bounded by its quickest hop
    return StepModel(
        {(stage, kind): statistics.median(ns) for stage, kind, ns, _ in kinds.iter_rows()},
        {(stage, kind): statistics.median(ns) for stage, kind, _, ns in kinds.iter_rows() if ns},
        {d: statistics.median(seen) if seen else min(bounds) for d, seen, bounds in hops.iter_rows()},
        statistics.median(tails),
    )
