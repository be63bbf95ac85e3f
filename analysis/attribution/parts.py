"""Where the step time went: per-rank parts that close exactly, and the waterfall from the formula.

Per rank and step the step time is cut into compute at reference efficiency, small-GEMM excess
(busy time beyond the reference), bubble, p2p_wait, launch_overhead and other (idle time of those
classes, plus the stretch by which this rank's step span is shorter than the step's longest). The
small-GEMM excess is defined per compute cell (`cell_small_gemm`) and a rank's part is its cells' sum.

The waterfall is a ladder of replays of the same schedule (DESIGN.md section 4): equal slots at
reference efficiency -> per-stage reference durations -> measured cell durations -> plus measured
gaps -> plus measured p2p latencies; each rung's increase is one bar, the rest is the residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.timeline.gaps import COMPUTE_KINDS
from analysis.attribution.replay import Measured, replay
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
    return cells.join(table, on=["stage", "kind"], how="left")


def _idle_before(times: pl.DataFrame, gaps: pl.DataFrame) -> pl.Series:
    """Per row of `times` (row, rank, t_ns): the rank's idle ns before t_ns, in row order.

    Gaps of a rank are disjoint, so a running sum of their lengths and one as-of join answer it.
    """
    length = pl.col("end_ns") - pl.col("start_ns")
    running = gaps.sort("rank", "start_ns").select(
        "rank", t_ns="start_ns", gap_start="start_ns", gap_end="end_ns", before=length.cum_sum().over("rank") - length
    )
    found = times.sort("t_ns").join_asof(running, on="t_ns", by="rank", check_sortedness=False)
    inside = pl.min_horizontal("t_ns", "gap_end") - pl.col("gap_start")
    return found.sort("row").select((pl.col("before") + inside).fill_null(0))["before"]


def cell_small_gemm(cells: pl.DataFrame, gaps: pl.DataFrame, windows: pl.DataFrame, ref: Reference) -> pl.DataFrame:
    """`cells` with `small_gemm_ns`: a compute cell's busy time (its span within its step window, less
    the idle gaps inside it) beyond its reference; null for transfer cells and without calibration."""
    bounds = windows.select("rank", "step", w0="start_ns", w1="end_ns")
    clipped = (
        _reference_column(cells.with_row_index("row"), ref)
        .join(bounds, on=["rank", "step"], how="left")
        .with_columns(a=pl.max_horizontal("start_ns", "w0"), b=pl.min_horizontal("end_ns", "w1"))
        .sort("row")
    )
    idle = _idle_before(clipped.select("row", "rank", t_ns="b"), gaps) - _idle_before(
        clipped.select("row", "rank", t_ns="a"), gaps
    )
    busy = (pl.col("b") - pl.col("a")).clip(lower_bound=0) - idle
    excess = pl.when(pl.col("kind").is_in(COMPUTE_KINDS) & pl.lit(ref.calibrated)).then(busy - pl.col("reference_ns"))
    return clipped.select(*cells.columns, small_gemm_ns=excess.cast(pl.Float64))


def rank_parts(cells: pl.DataFrame, gaps: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): step_ns and the PARTS in ns, summing to step_ns (small_gemm null if unknown).

    `cells` carry `small_gemm_ns` (cell_small_gemm); compute is the busy time less that excess.
    """
    window = windows.select(
        "rank", "step", window_ns=pl.col("end_ns") - pl.col("start_ns")
    ).with_columns(step_ns=pl.col("window_ns").max().over("step"))
    idle = gaps.group_by("rank", "step").agg(
        (pl.col("end_ns") - pl.col("start_ns")).filter(pl.col("class") == name).sum().alias(name)
        for name in ("bubble", "p2p_wait", "launch_overhead", "other")
    )
    excess = cells.group_by("rank", "step").agg(
        pl.when(pl.col("small_gemm_ns").is_not_null().any()).then(pl.col("small_gemm_ns").sum()).alias("small_gemm")
    )
    parts = (
        window.join(idle, on=["rank", "step"], how="left")
        .fill_null(0)
        .join(excess, on=["rank", "step"], how="left")
        .with_columns(
            busy=pl.col("window_ns") - pl.sum_horizontal("bubble", "p2p_wait", "launch_overhead", "other"),
            other=pl.col("other") + pl.col("step_ns") - pl.col("window_ns"),
        )
        .with_columns(compute=(pl.col("busy") - pl.col("small_gemm").fill_null(0)).cast(pl.Float64))
    )
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
