"""Microbatches in flight (activations stashed for backward) per rank over a step, against theory.

Measured: the executor's own stash counter where the trace has one (analysis.traces.memory), else from the
cells: +1 when a forward ends, -1 when the backward that frees its activations ends (W where the
backward is split, else B). Theory: the ideal timeline's in_flight, which `analyze` stores from
runners.schedules.in_flight on the executed schedule (GPipe holds m on every stage, 1F1B p - s on stage
s), placed at each action's end on that replay of the same schedule.
"""

from __future__ import annotations

import polars as pl

from analysis.report.frames import TIMELINE_BINS, TIMELINE_ROWS_MAX


def measured_in_flight(cells: pl.DataFrame, step: int, origin: int) -> pl.DataFrame:
    """(rank, t_ms, live): the count after each forward or freeing backward of `step`, t from `origin`."""
    step_cells = cells.filter(pl.col("step") == step)
    release = "W" if (step_cells["kind"] == "W").any() else "B"
    changes = step_cells.filter(pl.col("kind").is_in(["F", release])).sort("rank", "end_ns")
    return changes.select(
        pl.col("rank").cast(pl.Int64),
        t_ms=((pl.col("end_ns") - origin) / 1e6).round(4),
        live=pl.when(pl.col("kind") == "F").then(1).otherwise(-1).cum_sum().over("rank").cast(pl.Int64),
    )


def thinned(live: pl.DataFrame, bins: int = TIMELINE_BINS, rows_max: int = TIMELINE_ROWS_MAX) -> pl.DataFrame:
    """Past `rows_max` rows, each rank's count at its highest per time bin: the peaks survive, the page stays small."""
    if live.height <= rows_max:
        return live
    first = live["t_ms"].min()
    width = max(live["t_ms"].max() - first, 1e-9) / bins
    time_bin = ((pl.col("t_ms") - first) / width).floor().clip(upper_bound=bins - 1)
    return (
        live.group_by("rank", bin=time_bin)
        .agg(pl.col("t_ms").min(), pl.col("live").max())
        .drop("bin")
        .sort("rank", "t_ms")
    )


def theory_in_flight(ideal: pl.DataFrame, origin: int) -> pl.DataFrame:
    """(rank, t_ms, live): the schedule's count wherever an action changes it, at that action's end on the
    ideal timeline (analysis.results `ideal`, its `in_flight`), t from `origin`."""
    ordered = ideal.sort("rank", "end_ns")
    changed = pl.col("in_flight") != pl.col("in_flight").shift(1, fill_value=0).over("rank")
    return ordered.filter(changed).select(
        pl.col("rank").cast(pl.Int64),
        t_ms=((pl.col("end_ns") - origin) / 1e6).round(4),
        live=pl.col("in_flight").cast(pl.Int64),
    )


def stash_in_flight(stash: pl.DataFrame, step: int) -> pl.DataFrame:
    """(rank, t_ms, live) from the executor's own stash counter (analysis.traces.memory), t from the step's
    first sample."""
    samples = stash.filter(pl.col("step") == step)
    return samples.sort("rank", "t_ns").select(
        pl.col("rank"),
        t_ms=((pl.col("t_ns") - pl.col("t_ns").min()) / 1e6).round(4),
        live=pl.col("microbatches"),
    )


def theory_peaks(ideal: pl.DataFrame) -> dict[int, int]:
    """Per rank, the most microbatches the schedule keeps in flight (the ideal timeline's in_flight)."""
    return dict(ideal.group_by("rank").agg(pl.col("in_flight").max()).sort("rank").iter_rows())


def peaks_frame(measured: pl.DataFrame, theory: dict[int, int]) -> pl.DataFrame:
    """(rank, measured, theory) peak counts side by side."""
    peaks = measured.group_by("rank").agg(measured=pl.col("live").max())
    expected = pl.DataFrame(
        {"rank": list(theory), "theory": list(theory.values())}, schema={"rank": pl.Int64, "theory": pl.Int64}
    )
    return expected.join(peaks, on="rank", how="left").select("rank", "measured", "theory").sort("rank")
