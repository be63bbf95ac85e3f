"""The waterfall: a ladder of replays of the executed schedule, from the formula to the measurement.

Rungs, each a replay (analysis.attribution.replay) of one measured step with one more measured effect:
equal slots at full-batch efficiency (its excess over the even split of the work, `ideal`, is the
formula bubble) -> per-stage full-batch durations (imbalance) -> each cell's work timed in isolation
at its microbatch size (small_gemm) -> the cells' measured busy times (slowdown) -> plus the measured
host gaps (launch_overhead) -> plus the measured p2p latencies (p2p_wait). Each rung's increase over
the one before is one term; the measured step minus the last rung is the residual. Without the
isolated calibration small_gemm and slowdown are unknown and the cells' rung stands for the
reference (their time is in imbalance).

The rung at full-batch durations (no small-GEMM loss, no slowdown, no host gaps, no p2p latency) is
the ideal timeline that the report and the merged trace draw: `ideal` + `formula_bubble` + `imbalance`
is its makespan.
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


def _equal_slots(full: dict[tuple[int, str], float], measured: Measured) -> dict:
    """Every action of a kind at that kind's mean full-batch share over the stages."""
    kinds = {a.kind.value for a in measured.duration}
    mean = {
        kind: sum(ns for (_, k), ns in full.items() if k == kind)
        / max(1, sum(1 for _, k in full if k == kind))
        for kind in kinds
    }
    return {a: mean[a.kind.value] for a in measured.duration}


def ladder(schedule: Schedule, measured: Measured, ref: Reference, step_ns: float) -> Ladder:
    """The waterfall of one step (its terms sum to `step_ns`) and its ideal timeline."""
    full = ref.full()
    per_stage = {a: full.get((a.stage, a.kind.value), 0.0) for a in measured.duration}
    ideal = sum(per_stage.values()) / schedule.p

    def rung(durations: dict | None = None, gaps: bool = False, latencies: bool = False) -> Timeline:
        return replay(
            schedule, measured if durations is None else _with_durations(measured, durations), gaps, latencies
        )

    formula, cells = rung(_equal_slots(full, measured)), rung()
    if ref.isolated:
        isolated_of = ref.isolated_of()
        reference_rung = rung(per_stage)
        isolated = rung(
            {a: isolated_of.get((a.stage, a.kind.value, a.microbatch), 0.0) for a in measured.duration}
        )
    else:  # the split of busy time is unknown: the cells' own rung stands for the reference
        reference_rung = isolated = cells
    launched = rung(gaps=True).makespan
    simulated = rung(gaps=True, latencies=True).makespan
    terms_ns = {
        "ideal": ideal,
        "formula_bubble": formula.makespan - ideal,
        "imbalance": reference_rung.makespan - formula.makespan,
        "small_gemm": isolated.makespan - reference_rung.makespan if ref.isolated else None,
        "slowdown": cells.makespan - isolated.makespan if ref.isolated else None,
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
