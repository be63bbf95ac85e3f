"""Chart-ready frames for one run's page, shaped in polars from the analysis tables and summary.

Times on the page are milliseconds from the start of one step, rounded to 0.1 us: finer digits would
only grow the page's data, and a pixel on a timeline is never less than a microsecond.
"""

from __future__ import annotations

import polars as pl

COMPUTE_KINDS = ("F", "B", "I", "W")
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
GAP_CLASSES = ("bubble", "p2p_wait", "launch_overhead", "other")
# The waterfall's order, from the formula's step time to the measured one (DESIGN.md section 4).
WATERFALL_TERMS = ("ideal", "formula_bubble", "imbalance", "small_gemm", "launch_overhead", "p2p_wait", "residual")
DEVIATION_TERMS = WATERFALL_TERMS[2:]
RANK_PARTS = ("compute_ms", "small_gemm_ms", "bubble_ms", "p2p_wait_ms", "launch_overhead_ms", "other_ms")
TIMELINE_COLUMNS = ("rank", "track", "what", "action", "microbatch", "start_ms", "end_ms", "duration_ms", "cells")
# Above this many rows a timeline is drawn from time bins: the browser stays fast, and a cell a
# thousandth of the chart wide could not be hovered anyway.
TIMELINE_ROWS_MAX = 10_000
TIMELINE_BINS = 600


def representative_step(cells: pl.DataFrame) -> int:
    """The step whose span is the median one: a typical step, not the warm-up or an outlier."""
    spans = (
        cells.group_by("step")
        .agg(span=pl.col("end_ns").max() - pl.col("start_ns").min())
        .sort("span", "step")
    )
    return int(spans["step"][(spans.height - 1) // 2])


def _milliseconds(column: str, origin: int) -> pl.Expr:
    return ((pl.col(column) - origin) / 1e6).round(4)


def timeline_frame(cells: pl.DataFrame, gaps: pl.DataFrame | None, step: int) -> pl.DataFrame:
    """One row per cell and per gap of `step`: compute cells, p2p cells and idle gaps on three tracks."""
    step_cells = cells.filter(pl.col("step") == step)
    step_gaps = gaps.filter(pl.col("step") == step) if gaps is not None else None
    origin = int(step_cells["start_ns"].min())
    if step_gaps is not None and step_gaps.height:
        origin = min(origin, int(step_gaps["start_ns"].min()))
    cell_rows = step_cells.select(
        pl.col("rank").cast(pl.Int64),
        track=pl.when(pl.col("kind").is_in(COMPUTE_KINDS)).then(pl.lit("compute")).otherwise(pl.lit("p2p")),
        what=pl.col("kind").cast(pl.String),
        action=pl.format("{}{}{}", "stage", "kind", "microbatch"),
        microbatch=pl.col("microbatch").cast(pl.Int64),
        start_ms=_milliseconds("start_ns", origin),
        end_ms=_milliseconds("end_ns", origin),
    )
    frames = [cell_rows]
    if step_gaps is not None:
        frames.append(
            step_gaps.select(
                pl.col("rank").cast(pl.Int64),
                track=pl.lit("idle"),
                what=pl.col("class").cast(pl.String),
                action=pl.col("class").cast(pl.String),
                microbatch=pl.lit(None, pl.Int64),
                start_ms=_milliseconds("start_ns", origin),
                end_ms=_milliseconds("end_ns", origin),
            )
        )
    return _with_duration(pl.concat(frames)).sort("rank", "start_ms")


def _with_duration(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(duration_ms=(pl.col("end_ms") - pl.col("start_ms")).round(4),
                              cells=pl.lit(1, pl.Int64)).select(TIMELINE_COLUMNS)


def coarsen(frame: pl.DataFrame, bins: int = TIMELINE_BINS, rows_max: int = TIMELINE_ROWS_MAX) -> pl.DataFrame:
    """Past `rows_max` rows, one bar per (rank, track, time bin), coloured by the kind that filled most
    of it; `cells` says how many rows it stands for, `duration_ms` their summed time."""
    if frame.height <= rows_max:
        return frame
    width = max(frame["end_ms"].max() - frame["start_ms"].min(), 1e-9) / bins
    binned = frame.with_columns(bin=(pl.col("start_ms") / width).floor().cast(pl.Int64))
    time_by_kind = binned.group_by("rank", "track", "bin", "what").agg(pl.col("duration_ms").sum())
    dominant = time_by_kind.sort("duration_ms", "what", descending=[True, False]).unique(
        subset=["rank", "track", "bin"], keep="first").select("rank", "track", "bin", "what")
    bars = binned.group_by("rank", "track", "bin").agg(
        start_ms=pl.col("start_ms").min(), end_ms=pl.col("end_ms").max(),
        duration_ms=pl.col("duration_ms").sum().round(4), cells=pl.len().cast(pl.Int64))
    return bars.join(dominant, on=["rank", "track", "bin"]).with_columns(
        action=pl.format("{} cells, mostly {}", "cells", "what"), microbatch=pl.lit(None, pl.Int64),
    ).select(TIMELINE_COLUMNS).sort("rank", "start_ms")


def ideal_frame(rows: list[tuple]) -> pl.DataFrame:
    """The simulated timeline's rows (rank, action, start, end in ms) in the measured frame's shape."""
    frame = pl.DataFrame(
        {
            "rank": [row[0] for row in rows],
            "what": [row[1].kind.value for row in rows],
            "action": [str(row[1]) for row in rows],
            "microbatch": [row[1].microbatch for row in rows],
            "start_ms": [float(row[2]) for row in rows],
            "end_ms": [float(row[3]) for row in rows],
        },
        schema_overrides={"rank": pl.Int64, "microbatch": pl.Int64},
    )
    return _with_duration(frame.with_columns(track=pl.lit("compute"), start_ms=pl.col("start_ms").round(4),
                                             end_ms=pl.col("end_ms").round(4)))


def waterfall_frame(summary: dict) -> pl.DataFrame:
    """The waterfall's bars: each term from where the previous ended, then the measured total from 0."""
    waterfall = summary.get("waterfall_ms") or {}
    terms = pl.DataFrame({"term": list(WATERFALL_TERMS), "ms": [float(waterfall.get(t) or 0.0) for t in WATERFALL_TERMS]})
    terms = terms.with_columns(end=pl.col("ms").cum_sum()).with_columns(start=pl.col("end") - pl.col("ms"))
    total = pl.DataFrame({"term": ["measured"], "ms": [float(summary["step_time_ms"])]})
    total = total.with_columns(end=pl.col("ms"), start=pl.lit(0.0))
    return pl.concat([terms, total]).with_columns(
        order=pl.int_range(pl.len()), bar=pl.when(pl.col("term") == "measured").then(pl.lit("total")).otherwise(
            pl.when(pl.col("ms") < 0).then(pl.lit("decrease")).otherwise(pl.lit("increase")))
    )


def rank_parts_frame(summary: dict) -> pl.DataFrame:
    """Each rank's step split into its parts (long form: rank, part, ms); a null part counts as 0."""
    ranks = pl.DataFrame(summary.get("ranks") or [], infer_schema_length=None)
    if ranks.is_empty():
        return pl.DataFrame(schema={"rank": pl.Int64, "part": pl.String, "ms": pl.Float64})
    present = [part for part in RANK_PARTS if part in ranks.columns]
    return (
        ranks.select(pl.col("rank").cast(pl.Int64), *[pl.col(p).cast(pl.Float64).fill_null(0.0) for p in present])
        .unpivot(index="rank", variable_name="part", value_name="ms")
        .with_columns(order=pl.col("part").replace_strict(list(RANK_PARTS), list(range(len(RANK_PARTS)))),
                      part=pl.col("part").str.strip_suffix("_ms"))
    )


def largest_deviation(summary: dict) -> tuple[str, float] | None:
    """The waterfall term (beyond ideal and formula bubble) with the largest magnitude."""
    waterfall = summary.get("waterfall_ms") or {}
    present = [(t, float(waterfall[t])) for t in DEVIATION_TERMS if waterfall.get(t) is not None]
    return max(present, key=lambda item: abs(item[1])) if present else None
