"""The waterfall: a ladder of replays of the executed schedule, from the formula to the measurement.

Rungs, each a replay (analysis.attribution.replay) of the step model (analysis.attribution.model: the
medians over every analysed step) with one more measured effect: equal slots at full-batch efficiency
(its excess over the even split of the work, `ideal`, is the formula bubble) -> per-stage full-batch
durations (imbalance) -> each (stage, kind)'s work timed in isolation at its microbatch size
(small_gemm) -> its measured busy time (slowdown) -> plus the measured host gaps (launch_overhead) ->
plus the measured p2p latencies (p2p_wait) -> plus the step's time after its last action (other: the
optimizer step, pending sends). Each rung's increase over the one before is one term; the median step
minus the last rung is the residual: what medians do not explain (jitter, a rank's first action
sparing its launch gap, one slow microbatch). Without the
isolated calibration small_gemm and slowdown are unknown and the cells' rung stands for the
reference (their time is in imbalance).

The rung at full-batch durations (no small-GEMM loss, no slowdown, no host gaps, no p2p latency) is
the ideal timeline that the report and the merged trace draw: `ideal` + `formula_bubble` + `imbalance`
is its makespan.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import polars as pl

from analysis.attribution.model import StepModel, fit
from analysis.attribution.reference import Reference
from analysis.attribution.replay import measure, replay
from analysis.cells.labelled import CELL_KEY, CELL_SCHEMA
from analysis.schema import Waterfall
from runners.schedules import COMPUTE_KINDS, Schedule, Timeline

NS_PER_MS = 1e6
IDEAL_SCHEMA = {name: CELL_SCHEMA[name] for name in (*CELL_KEY, "start_ns", "end_ns")}


@dataclass(frozen=True)
class Ladder:
    waterfall: Waterfall  # ms
    ideal: Timeline  # the reference rung, ns from the step's origin


def _equal_slots(full: dict[tuple[int, str], float]) -> dict[tuple[int, str], float]:
    """Every (stage, kind) at its kind's mean full-batch share over the stages."""
    mean = {
        kind: statistics.mean(ns for (_, k), ns in full.items() if k == kind) for kind in {k for _, k in full}
    }
    return {(stage, kind): mean[kind] for stage, kind in full}


def ladder(schedule: Schedule, model: StepModel, ref: Reference, step_ns: float) -> Ladder:
    """The waterfall (its terms sum to `step_ns`, the measured step) and the ideal timeline, from the
    step model (analysis.attribution.model) and the reference durations."""
    full = ref.full()
    ideal = (
        sum(full.get((a.stage, a.kind.value), 0.0) for order in schedule.orders for a in order) / schedule.p
    )

    def rung(duration: dict | None = None, gaps: bool = False, latencies: bool = False) -> Timeline:
        return replay(schedule, model.measured(schedule, duration), gaps, latencies)

    formula, cells = rung(_equal_slots(full)), rung()
    if ref.isolated:
        reference_rung, isolated = rung(full), rung(ref.isolated_medians())
    else:  # the split of busy time is unknown: the cells' own rung stands for the reference
        reference_rung = isolated = cells
    launched = rung(gaps=True).makespan
    scheduled = rung(gaps=True, latencies=True).makespan
    terms_ns = {
        "ideal": ideal,
        "formula_bubble": formula.makespan - ideal,
        "imbalance": reference_rung.makespan - formula.makespan,
        "small_gemm": isolated.makespan - reference_rung.makespan if ref.isolated else None,
        "slowdown": cells.makespan - isolated.makespan if ref.isolated else None,
        "launch_overhead": launched - cells.makespan,
        "p2p_wait": scheduled - launched,
        "other": model.tail,
        "residual": step_ns - scheduled - model.tail,
    }
    terms = Waterfall(**{term: None if ns is None else ns / NS_PER_MS for term, ns in terms_ns.items()})
    return Ladder(terms, reference_rung)


def step_model(
    schedule: Schedule, cells: pl.DataFrame, waits: pl.DataFrame, windows: pl.DataFrame, parts: pl.DataFrame
) -> StepModel:
    """The model fitted to every analysed step (`parts`: their step_ns), each measured from its first
    stage's window start."""
    origins = windows.filter(pl.col("rank") == schedule.rank_of(0)).select("step", "start_ns")
    ends = (
        cells.filter(pl.col("kind").is_in(COMPUTE_KINDS)).group_by("step").agg(last_ns=pl.col("end_ns").max())
    )
    steps = (
        parts.group_by("step").agg(pl.col("step_ns").first()).join(origins, on="step").join(ends, on="step")
    )
    measured = measure(schedule, cells, waits, steps.select("step", origin_ns="start_ns"))
    rows = steps.select("step_ns", "start_ns", "last_ns").rows()
    return fit(measured, [step_ns - (last - origin) for step_ns, origin, last in rows])


def ideal_frame(timeline: Timeline, step: int, origin_ns: int) -> pl.DataFrame:
    """The ideal timeline as a table on the analysis's clock, from the step's origin: rank, step, stage,
    kind, microbatch, start_ns, end_ns."""
    rows = [
        (rank, step, a.stage, a.kind.value, a.microbatch, origin_ns + round(start), origin_ns + round(end))
        for rank, a, start, end in timeline.rows
    ]
    return pl.DataFrame(rows, schema=IDEAL_SCHEMA, orient="row")
