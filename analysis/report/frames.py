"""Chart-ready frames for one run's page, shaped in polars from the analysis tables and summary.

Times on the page are milliseconds from the start of one step, rounded to 0.1 us: finer digits would
only grow the page's data, and a pixel on a timeline is never less than a microsecond.
"""

from __future__ import annotations

import polars as pl

from analysis.report.run_charts import CRITICAL_TRACK
from analysis.schema import COMPUTE_KINDS, RANK_PARTS, Summary
from analysis.vocabulary import RUNGS, Part

# The terms that depart from the formula's step time (ideal + fill_drain).
DEVIATION_TERMS = RUNGS[2:]
TIMELINE_COLUMNS = (
    "rank",
    "track",
    "what",
    "action",
    "microbatch",
    "start_ms",
    "end_ms",
    "duration_ms",
    "cells",
)
# Above this many rows a timeline is drawn from time bins: the browser stays fast, and a cell a
# thousandth of the chart wide could not be hovered anyway.
TIMELINE_ROWS_MAX = 10_000
TIMELINE_BINS = 600


def _milliseconds(column: str, origin: int) -> pl.Expr:
    return ((pl.col(column) - origin) / 1e6).round(4)


def step_origin(cells: pl.DataFrame, gaps: pl.DataFrame, step: int) -> int:
    """Where a step's timelines start: its first cell or gap, whichever is earlier (ns, analysis clock)."""
    starts = [frame.filter(pl.col("step") == step)["start_ns"].min() for frame in (cells, gaps)]
    return int(min(start for start in starts if start is not None))


def timeline_frame(
    cells: pl.DataFrame, gaps: pl.DataFrame, step: int, origin: int, critical: pl.DataFrame | None = None
) -> pl.DataFrame:
    """One row per cell and per gap of `step`: compute cells, p2p cells and idle gaps on three tracks,
    and on a fourth the step's critical path (analysis.attribution.critical) where given."""
    step_cells = cells.filter(pl.col("step") == step)
    cell_rows = step_cells.select(
        pl.col("rank").cast(pl.Int64),
        track=pl.when(pl.col("kind").is_in(COMPUTE_KINDS))
        .then(pl.lit(Part.COMPUTE))
        .otherwise(pl.lit("p2p")),
        what=pl.col("kind").cast(pl.String),
        action=pl.format("{}{}{}", "stage", "kind", "microbatch"),
        microbatch=pl.col("microbatch").cast(pl.Int64),
        start_ms=_milliseconds("start_ns", origin),
        end_ms=_milliseconds("end_ns", origin),
    )
    gap_rows = gaps.filter(pl.col("step") == step).select(
        pl.col("rank").cast(pl.Int64),
        track=pl.lit("idle"),
        what=pl.col("class").cast(pl.String),
        action=pl.col("class").cast(pl.String),
        microbatch=pl.lit(None, pl.Int64),
        start_ms=_milliseconds("start_ns", origin),
        end_ms=_milliseconds("end_ns", origin),
    )
    parts = [cell_rows, gap_rows]
    if critical is not None:
        action = pl.when(pl.col("kind").is_not_null()).then(
            pl.format(" {}{}{}", "stage", "kind", "microbatch")
        )
        parts.append(
            critical.filter(pl.col("step") == step).select(
                pl.col("rank").cast(pl.Int64),
                track=pl.lit(CRITICAL_TRACK),
                what=pl.lit(CRITICAL_TRACK),
                action=pl.concat_str("part", action.otherwise(pl.lit(""))),
                microbatch=pl.col("microbatch").cast(pl.Int64),
                start_ms=_milliseconds("start_ns", origin),
                end_ms=_milliseconds("end_ns", origin),
            )
        )
    return _with_duration(pl.concat(parts)).sort("rank", "start_ms")


def _with_duration(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(
        duration_ms=(pl.col("end_ms") - pl.col("start_ms")).round(4), cells=pl.lit(1, pl.Int64)
    ).select(TIMELINE_COLUMNS)


def coarsen(
    frame: pl.DataFrame, bins: int = TIMELINE_BINS, rows_max: int = TIMELINE_ROWS_MAX
) -> pl.DataFrame:
    """Past `rows_max` rows, one bar per (rank, track, time bin), coloured by the kind that filled most
    of it; `cells` says how many rows it stands for, `duration_ms` their summed time."""
    if frame.height <= rows_max:
        return frame
    width = max(frame["end_ms"].max() - frame["start_ms"].min(), 1e-9) / bins
    binned = frame.with_columns(bin=(pl.col("start_ms") / width).floor().cast(pl.Int64))
    time_by_kind = binned.group_by("rank", "track", "bin", "what").agg(pl.col("duration_ms").sum())
    dominant = (
        time_by_kind.sort("duration_ms", "what", descending=[True, False])
        .unique(subset=["rank", "track", "bin"], keep="first")
        .select("rank", "track", "bin", "what")
    )
    bars = binned.group_by("rank", "track", "bin").agg(
        start_ms=pl.col("start_ms").min(),
        end_ms=pl.col("end_ms").max(),
        duration_ms=pl.col("duration_ms").sum().round(4),
        cells=pl.len().cast(pl.Int64),
    )
    return (
        bars.join(dominant, on=["rank", "track", "bin"])
        .with_columns(
            action=pl.format("{} cells, mostly {}", "cells", "what"),
            microbatch=pl.lit(None, pl.Int64),
        )
        .select(TIMELINE_COLUMNS)
        .sort("rank", "start_ms")
    )


def ideal_frame(ideal: pl.DataFrame, origin: int) -> pl.DataFrame:
    """The ideal timeline (analysis.results `ideal`) in the measured frame's shape, from the same origin."""
    return _with_duration(
        ideal.select(
            "rank",
            track=pl.lit(Part.COMPUTE),
            what="kind",
            action=pl.format("{}{}{}", "stage", "kind", "microbatch"),
            microbatch="microbatch",
            start_ms=_milliseconds("start_ns", origin),
            end_ms=_milliseconds("end_ns", origin),
        )
    ).sort("rank", "start_ms")


def waterfall_frame(summary: Summary) -> pl.DataFrame:
    """The waterfall's bars: each term from where the previous ended, then the measured total from 0; an
    unknown term (no isolated calibration) has no bar and says so (`label`)."""
    values = [getattr(summary.waterfall_ms, term) for term in RUNGS]
    terms = pl.DataFrame({"term": list(RUNGS), "ms": values}, schema={"term": pl.String, "ms": pl.Float64})
    terms = terms.with_columns(end=pl.col("ms").fill_null(0.0).cum_sum()).with_columns(
        start=pl.col("end") - pl.col("ms").fill_null(0.0)
    )
    total = pl.DataFrame({"term": ["measured"], "ms": [summary.step_time_ms]})
    total = total.with_columns(end=pl.col("ms"), start=pl.lit(0.0))
    labels = ["unknown" if ms is None else f"{ms:.2f}" for ms in [*values, summary.step_time_ms]]
    return pl.concat([terms, total]).with_columns(
        label=pl.Series(labels, dtype=pl.String),
        order=pl.int_range(pl.len()),
        bar=pl.when(pl.col("term") == "measured")
        .then(pl.lit("total"))
        .otherwise(pl.when(pl.col("ms") < 0).then(pl.lit("decrease")).otherwise(pl.lit("increase"))),
    )


def rank_parts_frame(summary: Summary) -> pl.DataFrame:
    """Each rank's step split into its parts (long form: rank, part, order, ms); an unknown part counts 0."""
    rows = [
        (entry.rank, part, order, entry.part_ms(part) or 0.0)
        for entry in summary.ranks
        for order, part in enumerate(RANK_PARTS)
    ]
    return pl.DataFrame(
        rows, schema={"rank": pl.Int64, "part": pl.String, "order": pl.Int64, "ms": pl.Float64}, orient="row"
    )


def largest_deviation(summary: Summary) -> tuple[str, float] | None:
    """The waterfall term (beyond ideal and fill_drain) with the largest magnitude."""
    present = [(t, getattr(summary.waterfall_ms, t)) for t in DEVIATION_TERMS]
    present = [(t, ms) for t, ms in present if ms is not None]
    return max(present, key=lambda item: abs(item[1])) if present else None
