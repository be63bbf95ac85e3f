"""The waterfall: the typical step (analysis.attribution.model) replayed with the effects
(analysis.vocabulary.Effect) added one at a time, from the formula's step to the measurement: the fixed
ladder, each effect's Shapley value, and the rung at full-batch durations that is the ideal timeline.
Every term and its formula: docs/numbers.md#waterfall.

_Rungs replays every subset of the effects in one batch (analysis.attribution.replay.replay_all); the
ladder, the Shapley values and `gains` (each effect's gain ceiling: docs/numbers.md#recoverable) read
their makespans. Without the isolated calibration small_batches and interference are unknown (None)
and imbalance carries the measured busy times.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from itertools import combinations

import polars as pl

from analysis.attribution.model import StepModel
from analysis.attribution.reference import Reference
from analysis.attribution.replay import Replayed, replay_all
from analysis.cells.labelled import CELL_KEY, CELL_SCHEMA
from analysis.schema import Waterfall
from analysis.vocabulary import FILL_DRAIN, IDEAL, RESIDUAL, VARIABILITY, Effect
from runners.schedules import Schedule, in_flight

NS_PER_MS = 1e6
IDEAL_SCHEMA = {name: CELL_SCHEMA[name] for name in (*CELL_KEY, "start_ns", "end_ns")} | {
    "in_flight": pl.Int64
}
# the effects in the ladder's order; the first three change the work, the others add inputs
EFFECTS = tuple(Effect)
_WORK_SPLIT = (Effect.SMALL_BATCHES, Effect.INTERFERENCE)  # unknown without the isolated calibration


@dataclass(frozen=True)
class Ladder:
    waterfall: Waterfall  # ms, the fixed ladder
    shapley: Waterfall  # ms, each effect's Shapley value
    ideal: Replayed  # the reference rung, ns from the step's origin
    typical_ns: float  # the typical step's replay: typical_step_ms


def _equal_slots(full: dict[tuple[int, str], float]) -> dict[tuple[int, str], float]:
    """Every (stage, kind) at its kind's mean full-batch share over the stages."""
    mean = {
        kind: statistics.mean(ns for (_, k), ns in full.items() if k == kind) for kind in {k for _, k in full}
    }
    return {(stage, kind): mean[kind] for stage, kind in full}


class _Rungs:
    """The typical step replayed with every set of its effects, all in one batch (replay_all)."""

    def __init__(self, schedule: Schedule, model: StepModel, ref: Reference) -> None:
        full = ref.full()
        self.equal = _equal_slots(full)
        busy = model.busy
        if ref.isolated:
            isolated = ref.isolated_medians()
            self.deltas = {
                Effect.IMBALANCE: {k: full[k] - self.equal[k] for k in full},
                Effect.SMALL_BATCHES: {k: isolated[k] - full[k] for k in full},
                Effect.INTERFERENCE: {k: busy.get(k, 0.0) - isolated[k] for k in full},
            }
        else:  # the split of busy time is unknown: imbalance carries the measured busy times
            self.deltas = {Effect.IMBALANCE: {k: busy.get(k, 0.0) - self.equal[k] for k in full}}
        self.effects = tuple(e for e in EFFECTS if e in self.deltas or e not in _WORK_SPLIT)
        subsets = [
            frozenset(c) for size in range(len(self.effects) + 1) for c in combinations(self.effects, size)
        ]
        replayed = replay_all(schedule, [self._step(model, subset) for subset in subsets])
        self._replayed = dict(zip(subsets, replayed))

    def _step(self, model: StepModel, effects: frozenset):
        work = {
            k: ns + sum(self.deltas[e][k] for e in effects if e in self.deltas)
            for k, ns in self.equal.items()
        }
        return model.step(
            work=lambda a: work.get((a.stage, a.kind.value), 0.0),
            host=Effect.HOST in effects,
            transfers=Effect.TRANSFER in effects,
            tail=Effect.TAIL in effects,
        )

    def replayed(self, effects) -> Replayed:
        return self._replayed[frozenset(effects)]

    def value(self, effects) -> float:
        return self.replayed(effects).makespan


def _ideal_work(rungs: _Rungs, schedule: Schedule) -> float:
    """The even split of the full-batch work over the ranks, ns."""
    return (
        sum(rungs.equal.get((a.stage, a.kind.value), 0.0) for order in schedule.orders for a in order)
        / schedule.p
    )


def ladder(schedule: Schedule, model: StepModel, ref: Reference, step_ns: float, own_ns: float) -> Ladder:
    """The waterfall both ways (its terms sum to `step_ns`, the measured step; `own_ns` is that step's
    own replay) and the ideal timeline."""
    rungs = _Rungs(schedule, model, ref)
    ideal = _ideal_work(rungs, schedule)
    chain, climbed = {}, []
    for effect in rungs.effects:
        before = rungs.value(climbed)
        climbed.append(effect)
        chain[effect] = rungs.value(climbed) - before
    typical = rungs.value(rungs.effects)
    k = len(rungs.effects)
    shapley = {e: 0.0 for e in rungs.effects}
    for size in range(k):
        weight = math.factorial(size) * math.factorial(k - size - 1) / math.factorial(k)
        for subset in combinations(rungs.effects, size):
            base = rungs.value(subset)
            for effect in rungs.effects:
                if effect not in subset:
                    shapley[effect] += weight * (rungs.value((*subset, effect)) - base)
    common = {
        IDEAL: ideal,
        FILL_DRAIN: rungs.value(()) - ideal,
        VARIABILITY: own_ns - typical,
        RESIDUAL: step_ns - own_ns,
    }

    def terms(values: dict[str, float]) -> Waterfall:
        found = {e: values.get(e) for e in EFFECTS} | common
        return Waterfall(**{t: None if ns is None else ns / NS_PER_MS for t, ns in found.items()})

    return Ladder(terms(chain), terms(shapley), rungs.replayed((Effect.IMBALANCE,)), typical)


def ideal_frame(ideal: Replayed, schedule: Schedule, step: int, origin_ns: int) -> pl.DataFrame:
    """The ideal timeline's compute actions as a table on the analysis's clock, from the step's origin:
    rank, step, stage, kind, microbatch, start_ns, end_ns, and in_flight: the microbatches the schedule
    holds for backward on the rank after the action (runners.schedules.in_flight)."""
    held = {
        action: count
        for order, counts in zip(schedule.orders, in_flight(schedule))
        for action, count in zip(order, counts)
    }
    rows = [
        (
            schedule.rank_of(a.stage),
            step,
            a.stage,
            a.kind.value,
            a.microbatch,
            origin_ns + round(s),
            origin_ns + round(e),
            held.get(a, 0),
        )
        for a, (s, e) in sorted(
            ideal.spans.items(), key=lambda item: (schedule.rank_of(item[0].stage), item[1])
        )
        if a.kind.is_compute
    ]
    return pl.DataFrame(rows, schema=IDEAL_SCHEMA, orient="row")


def gains(schedule: Schedule, model: StepModel, ref: Reference) -> dict[str, float]:
    """Each effect's gain ceiling, ns: the typical step less its replay with every other effect and not
    this one (what the step would lose if that effect were gone; docs/numbers.md#recoverable)."""
    rungs = _Rungs(schedule, model, ref)
    every = rungs.effects
    whole = rungs.value(every)
    return {effect: whole - rungs.value(tuple(e for e in every if e != effect)) for effect in every}
