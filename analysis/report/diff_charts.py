"""The diff page's charts: two runs' waterfalls and per-rank parts side by side, and their median steps'
timelines on one time axis. Each frame carries a `run` column, "A" or "B": the page's heading says which
run is which, so no run id (they can be long) has to fit an axis."""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.report import run_charts
from analysis.report.plot import COLOURS, WIDTH, Plot, named, scale
from analysis.schema import RANK_PARTS

RUNS = ("A", "B")
RUN_COLOURS = {"A": "#9ecae9", "B": "#4c78a8"}  # B, the run after, in the stronger colour
_RUN_COLOUR = alt.Color("run:N", scale=scale(RUN_COLOURS, RUNS), title="run")


def waterfalls(frame: pl.DataFrame) -> Plot:
    """Each rung of A's waterfall beside B's (analysis.report.frames.waterfall_frame per run), from the
    formula's step through each deviation to the measured one."""
    chart = (
        alt.Chart(named("waterfalls"))
        .mark_bar()
        .encode(
            x=alt.X(
                "term:N",
                sort=alt.SortField("order"),
                title=None,
                axis=alt.Axis(labelAngle=0, labelExpr="split(datum.label, '_')"),
            ),
            xOffset=alt.XOffset("run:N", scale=alt.Scale(domain=list(RUNS))),
            y=alt.Y("start:Q", title="ms of the step"),
            y2="end:Q",
            color=_RUN_COLOUR,
            tooltip=[
                alt.Tooltip("run:N"),
                alt.Tooltip("term:N"),
                alt.Tooltip("label:N", title="ms"),
                alt.Tooltip("end:Q", title="running total (ms)", format=".3f"),
            ],
        )
        .properties(width=WIDTH, height=260)
    )
    return Plot(chart, {"waterfalls": frame})


def rank_parts(frame: pl.DataFrame) -> Plot:
    """Each rank's step in parts (analysis.report.frames.rank_parts_frame per run), A's bar above B's."""
    chart = (
        alt.Chart(named("parts"))
        .mark_bar()
        .encode(
            x=alt.X("sum(ms):Q", title="ms of the step"),
            y=alt.Y("row:N", title=None, sort=alt.EncodingSortField("row_order", op="min")),
            color=alt.Color("part:N", scale=scale(COLOURS, RANK_PARTS)),
            order=alt.Order("order:Q"),
            tooltip=[
                alt.Tooltip("run:N"),
                alt.Tooltip("rank:O"),
                alt.Tooltip("part:N"),
                alt.Tooltip("ms:Q", format=".3f"),
            ],
        )
        .properties(width=WIDTH * 2 // 3)
    )
    return Plot(chart, {"parts": frame})


def timelines(frames: list[tuple[str, pl.DataFrame]]) -> Plot:
    """Each run's median step (title, analysis.report.frames.timeline_frame), one above the other on one
    time axis from each step's start: where B's step ends sooner, its row ends sooner."""
    plots = [
        run_charts.timeline(frame, title, frame["rank"].n_unique(), f"timeline_{run.lower()}")
        for run, (title, frame) in zip(RUNS, frames)
    ]
    chart = alt.vconcat(*[plot.chart for plot in plots]).resolve_scale(x="shared")
    return Plot(chart, {name: f for plot in plots for name, f in plot.datasets.items()})


def labelled(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """A's frame and B's as one, each row with its run."""
    return pl.concat([frame.with_columns(run=pl.lit(run)) for run, frame in zip(RUNS, frames)])
