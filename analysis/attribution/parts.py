"""Per-rank parts of the step that close exactly on the step time.

Per rank and step the step time is cut into compute at reference efficiency, small-GEMM excess
(busy time beyond the reference, analysis.attribution.reference), and the idle time of each gap class
(bubble, p2p_wait, launch_overhead, other), plus in `other` the stretch by which this rank's window is
shorter than the step's longest. The small-GEMM excess is defined per compute cell
(`cell_small_gemm`) and a rank's part is its cells' sum; compute is the rank's busy time (its window
less its gaps) less that excess, so compute is the term that closes the split.
"""

from __future__ import annotations

import polars as pl

from analysis.attribution.reference import Reference
from analysis.schema import GAP_CLASSES, RANK_PARTS, RankEntry
from runners.schedules import COMPUTE_KINDS, Schedule

NS_PER_MS = 1e6


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
        "rank",
        t_ns="start_ns",
        gap_start="start_ns",
        gap_end="end_ns",
        before=length.cum_sum().over("rank") - length,
    )
    found = times.sort("t_ns").join_asof(running, on="t_ns", by="rank", check_sortedness=False)
    inside = pl.min_horizontal("t_ns", "gap_end") - pl.col("gap_start")
    return found.sort("row").select((pl.col("before") + inside).fill_null(0))["before"]


def cell_small_gemm(
    cells: pl.DataFrame, gaps: pl.DataFrame, windows: pl.DataFrame, ref: Reference
) -> pl.DataFrame:
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
    excess = pl.when(pl.col("kind").is_in(COMPUTE_KINDS) & pl.lit(ref.calibrated)).then(
        busy - pl.col("reference_ns")
    )
    return clipped.select(*cells.columns, small_gemm_ns=excess.cast(pl.Float64))


def rank_parts(cells: pl.DataFrame, gaps: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): step_ns and the RANK_PARTS in ns, summing to step_ns (small_gemm null if unknown).

    `cells` carry `small_gemm_ns` (cell_small_gemm); compute is the busy time less that excess.
    """
    window = windows.select("rank", "step", window_ns=pl.col("end_ns") - pl.col("start_ns")).with_columns(
        step_ns=pl.col("window_ns").max().over("step")
    )
    idle = gaps.group_by("rank", "step").agg(
        (pl.col("end_ns") - pl.col("start_ns")).filter(pl.col("class") == name).sum().alias(name)
        for name in GAP_CLASSES
    )
    excess = cells.group_by("rank", "step").agg(
        pl.when(pl.col("small_gemm_ns").is_not_null().any())
        .then(pl.col("small_gemm_ns").sum())
        .alias("small_gemm")
    )
    parts = (
        window.join(idle, on=["rank", "step"], how="left")
        .fill_null(0)
        .join(excess, on=["rank", "step"], how="left")
        .with_columns(
            busy=pl.col("window_ns") - pl.sum_horizontal(GAP_CLASSES),
            other=pl.col("other") + pl.col("step_ns") - pl.col("window_ns"),
        )
        .with_columns(compute=(pl.col("busy") - pl.col("small_gemm").fill_null(0)).cast(pl.Float64))
    )
    return parts.select("rank", "step", "step_ns", *RANK_PARTS).sort("step", "rank")


def median_step(parts: pl.DataFrame) -> int:
    """The step whose time is the median, the lower one for an even count: a step that happened, so its
    parts close exactly."""
    per_step = parts.group_by("step").agg(pl.col("step_ns").first()).sort("step_ns", "step")
    return int(per_step["step"][(per_step.height - 1) // 2])


def rank_entries(parts: pl.DataFrame, schedule: Schedule, peaks: dict[int, int]) -> list[RankEntry]:
    """One step's rows of `rank_parts` as summary entries in ms; `peaks`: rank -> peak activation bytes."""
    return [
        RankEntry(
            rank=row["rank"],
            stage_ids=list(schedule.stages_of(row["rank"])),
            peak_activation_bytes=peaks.get(row["rank"]),
            **{f"{part}_ms": None if row[part] is None else row[part] / NS_PER_MS for part in RANK_PARTS},
        )
        for row in parts.sort("rank").iter_rows(named=True)
    ]


def in_ms(parts: pl.DataFrame) -> pl.DataFrame:
    """ranks.parquet: every analysed step's parts per rank, in ms (step_ms, <part>_ms)."""
    return parts.with_columns(pl.col("step_ns", *RANK_PARTS) / NS_PER_MS).rename(
        {"step_ns": "step_ms", **{part: f"{part}_ms" for part in RANK_PARTS}}
    )
