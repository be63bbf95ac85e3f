"""Where the step time went: per-rank parts that close exactly, and the waterfall from the formula.

Per rank and step the step time is cut into compute at reference efficiency, small-GEMM excess
(busy time beyond the reference), bubble, p2p_wait, launch_overhead and other (idle time of those
classes, plus the stretch by which this rank's step span is shorter than the step's longest).

The waterfall is a ladder of replays of the same schedule (DESIGN.md section 4): equal slots at
reference efficiency -> per-stage reference durations -> measured cell durations -> plus measured
gaps -> plus measured p2p latencies; each rung's increase is one bar, the rest is the residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.gaps import COMPUTE_KINDS
from analysis.simulate import Measured, replay
from runners.schedules import Schedule

PARTS = ("compute", "small_gemm", "bubble", "p2p_wait", "launch_overhead", "other")
BARS = ("ideal", "formula_bubble", "imbalance", "small_gemm", "launch_overhead", "p2p_wait", "residual")


@dataclass(frozen=True)
class Reference:
    """Per (stage, kind) duration of one microbatch in ns at reference efficiency.

    Calibrated: the whole batch in one piece (run.json `calibration`) divided by m. Otherwise the
    median measured duration stands in, and the small-GEMM term is unknown.
    """

    ns: dict[tuple[int, str], float]
    calibrated: bool


def _measured_ns() -> pl.Expr:
    return pl.col("end_ns") - pl.col("start_ns") - pl.col("blocked_ns")


def reference(cells: pl.DataFrame, calibration: dict | None, m: int) -> Reference:
    """Reference durations; backward halves (I, W) without their own calibration split the calibrated
    B in their measured ratio."""
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
    medians = {
        (stage, kind): float(ns)
        for stage, kind, ns in compute.group_by("stage", "kind").agg(_measured_ns().median()).iter_rows()
    }
    stages = {stage for stage, _ in medians}
    if not calibration or any(str(stage) not in calibration for stage in stages):
        return Reference(medians, calibrated=False)
    ns = {}
    for (stage, kind), median in medians.items():
        calibrated = calibration[str(stage)]
        if f"{kind}_ms" in calibrated:
            ns[(stage, kind)] = calibrated[f"{kind}_ms"] * 1e6 / m
        else:
            halves = medians.get((stage, "I"), 0.0) + medians.get((stage, "W"), 0.0)
            ns[(stage, kind)] = calibrated["B_ms"] * 1e6 / m * (median / halves if halves else 0.5)
    return Reference(ns, calibrated=True)


def _reference_column(cells: pl.DataFrame, ref: Reference) -> pl.DataFrame:
    table = pl.DataFrame(
        [(stage, kind, ns) for (stage, kind), ns in ref.ns.items()],
        schema={"stage": pl.Int64, "kind": pl.Utf8, "reference_ns": pl.Float64},
        orient="row",
    )
    return cells.filter(pl.col("kind").is_in(COMPUTE_KINDS)).join(table, on=["stage", "kind"], how="left")


def rank_parts(cells: pl.DataFrame, gaps: pl.DataFrame, windows: pl.DataFrame, ref: Reference) -> pl.DataFrame:
    """Per (rank, step): step_ns and the PARTS in ns, summing to step_ns (small_gemm null if unknown)."""
    window = windows.select(
        "rank", "step", window_ns=pl.col("end_ns") - pl.col("start_ns")
    ).with_columns(step_ns=pl.col("window_ns").max().over("step"))
    idle = gaps.group_by("rank", "step").agg(
        (pl.col("end_ns") - pl.col("start_ns")).filter(pl.col("class") == name).sum().alias(name)
        for name in ("bubble", "p2p_wait", "launch_overhead", "other")
    )
    work = _reference_column(cells, ref).group_by("rank", "step").agg(pl.col("reference_ns").sum())
    parts = (
        window.join(idle, on=["rank", "step"], how="left")
        .join(work, on=["rank", "step"], how="left")
        .fill_null(0)
        .with_columns(
            busy=pl.col("window_ns") - pl.sum_horizontal("bubble", "p2p_wait", "launch_overhead", "other"),
            other=pl.col("other") + pl.col("step_ns") - pl.col("window_ns"),
        )
    )
    if ref.calibrated:
        parts = parts.with_columns(compute=pl.col("reference_ns"), small_gemm=pl.col("busy") - pl.col("reference_ns"))
    else:
        parts = parts.with_columns(compute=pl.col("busy").cast(pl.Float64), small_gemm=pl.lit(None, pl.Float64))
    return parts.select("rank", "step", "step_ns", *PARTS).sort("step", "rank")


def _with_durations(measured: Measured, durations: dict) -> Measured:
    return Measured(durations, measured.latency, measured.gap)


def waterfall(schedule: Schedule, measured: Measured, ref: Reference, step_ns: float) -> dict[str, float | None]:
    """The BARS in ns for one step; they sum to `step_ns` (a null small_gemm counts as 0)."""
    actions = list(measured.duration)
    per_stage = {a: ref.ns.get((a.stage, a.kind.value), 0.0) for a in actions}
    kinds = {a.kind.value for a in actions}
    equal = {
        kind: sum(ns for (_, k), ns in ref.ns.items() if k == kind) / max(1, sum(1 for _, k in ref.ns if k == kind))
        for kind in kinds
    }
    slots = {a: equal[a.kind.value] for a in actions}
    ideal = sum(per_stage.values()) / schedule.p
    formula = replay(schedule, _with_durations(measured, slots), gaps=False, latencies=False)
    imbalanced = replay(schedule, _with_durations(measured, per_stage), gaps=False, latencies=False)
    cells = replay(schedule, measured, gaps=False, latencies=False)
    launched = replay(schedule, measured, gaps=True, latencies=False)
    simulated = replay(schedule, measured, gaps=True, latencies=True)
    if not ref.calibrated:  # the per-stage rung would be measured medians: fold it into imbalance
        imbalanced = cells
    return {
        "ideal": ideal,
        "formula_bubble": formula - ideal,
        "imbalance": imbalanced - formula,
        "small_gemm": cells - imbalanced if ref.calibrated else None,
        "launch_overhead": launched - cells,
        "p2p_wait": simulated - launched,
        "residual": step_ns - simulated,
    }
