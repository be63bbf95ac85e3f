"""The waterfall: a ladder of replays of the executed schedule, from the formula to the measurement.

Rungs, each a replay (analysis.attribution.replay) of one measured step with one more measured effect:
equal slots at reference efficiency (its excess over the even split of the work, `ideal`, is the
formula bubble) -> per-stage reference durations (imbalance) -> the cells' measured durations
(small_gemm) -> plus the measured host gaps (launch_overhead) -> plus the measured p2p latencies
(p2p_wait). Each rung's increase over the one before is one term; the measured step minus the last
rung is the residual. Without calibration the reference is the step's own medians and the per-stage
rung is folded into imbalance (small_gemm unknown).

The rung at reference durations (no small-GEMM loss, no host gaps, no p2p latency) is the ideal
timeline that the report and the merged trace draw: `ideal` + `formula_bubble` + `imbalance` is its
makespan.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.attribution.reference import Reference, reference
from analysis.attribution.replay import Measured, measure, replay
from analysis.schema import Waterfall
from runners.schedules import Schedule, Timeline

NS_PER_MS = 1e6
IDEAL_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "stage": pl.Int64,
    "kind": pl.Utf8,
    "microbatch": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}


@dataclass(frozen=True)
class Ladder:
    waterfall: Waterfall  # ms
    ideal: Timeline  # the reference rung, ns from the step's origin


def _with_durations(measured: Measured, durations: dict) -> Measured:
    return Measured(durations, measured.latency, measured.gap)


def _equal_slots(ref: Reference, measured: Measured) -> dict:
    """Every action of a kind at that kind's mean reference duration over the stages."""
    kinds = {a.kind.value for a in measured.duration}
    mean = {
        kind: sum(ns for (_, k), ns in ref.ns.items() if k == kind)
        / max(1, sum(1 for _, k in ref.ns if k == kind))
        for kind in kinds
    }
    return {a: mean[a.kind.value] for a in measured.duration}


def ladder(schedule: Schedule, measured: Measured, ref: Reference, step_ns: float) -> Ladder:
    """The waterfall of one step (its terms sum to `step_ns`) and its ideal timeline."""
    per_stage = {a: ref.ns.get((a.stage, a.kind.value), 0.0) for a in measured.duration}
    ideal = sum(per_stage.values()) / schedule.p
    formula = replay(
        schedule, _with_durations(measured, _equal_slots(ref, measured)), gaps=False, latencies=False
    )
    cells = replay(schedule, measured, gaps=False, latencies=False)
    # Uncalibrated, the per-stage rung would be the step's own medians: the cells' rung stands for it.
    reference_rung = (
        replay(schedule, _with_durations(measured, per_stage), gaps=False, latencies=False)
        if ref.calibrated
        else cells
    )
    launched = replay(schedule, measured, gaps=True, latencies=False).makespan
    simulated = replay(schedule, measured, gaps=True, latencies=True).makespan
    terms_ns = {
        "ideal": ideal,
        "formula_bubble": formula.makespan - ideal,
        "imbalance": reference_rung.makespan - formula.makespan,
        "small_gemm": cells.makespan - reference_rung.makespan if ref.calibrated else None,
        "launch_overhead": launched - cells.makespan,
        "p2p_wait": simulated - launched,
        "residual": step_ns - simulated,
    }
    terms = Waterfall(**{term: None if ns is None else ns / NS_PER_MS for term, ns in terms_ns.items()})
    return Ladder(terms, reference_rung)


def step_ladder(
    schedule: Schedule,
    cells: pl.DataFrame,
    waits: pl.DataFrame,
    origin_ns: int,
    ref: Reference,
    step_ns: float,
) -> Ladder:
    """The ladder of one step from its cells and waits (all ranks, that step only; times from `origin_ns`).
    Uncalibrated, the reference is the step's own medians, not other steps'."""
    step_ref = ref if ref.calibrated else reference(cells, None, schedule.m)
    return ladder(schedule, measure(schedule, cells, waits, origin_ns), step_ref, step_ns)


def ideal_frame(timeline: Timeline, step: int, origin_ns: int) -> pl.DataFrame:
    """The ideal timeline as a table on the analysis's clock, from the step's origin: rank, step, stage,
    kind, microbatch, start_ns, end_ns."""
    rows = [
        (rank, step, a.stage, a.kind.value, a.microbatch, origin_ns + round(start), origin_ns + round(end))
        for rank, a, start, end in timeline.rows
    ]
    return pl.DataFrame(rows, schema=IDEAL_SCHEMA, orient="row")
