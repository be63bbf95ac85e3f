"""The index page's sweep charts, each a short pure function from polars frames to a Plot: bubble and
step time over m, schedules side by side, peak memory over m."""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.report.plot import COLOURS, WIDTH, Plot, m_x, named, scale
from analysis.vocabulary import RUNGS


def bubble_vs_m(curve: pl.DataFrame, measured: pl.DataFrame) -> Plot:
    """Formula bubble as a line over m, measured bubbles as points, one colour per family."""
    x = m_x(curve, measured)
    line = (
        alt.Chart(named("curve"))
        .mark_line(strokeDash=[5, 3])
        .encode(
            x=x,
            y=alt.Y("bubble_formula:Q", title="bubble (fraction of the step)"),
            color=alt.Color("family:N"),
            tooltip=[
                alt.Tooltip("family:N"),
                alt.Tooltip("m:Q"),
                alt.Tooltip("bubble_formula:Q", title="formula", format=".3f"),
            ],
        )
    )
    points = (
        alt.Chart(named("measured"))
        .mark_point(filled=True, size=70)
        .encode(
            x=x,
            y="bubble_measured:Q",
            color="family:N",
            tooltip=[
                alt.Tooltip("run_id:N", title="run"),
                alt.Tooltip("m:Q"),
                alt.Tooltip("bubble_measured:Q", title="measured", format=".3f"),
                alt.Tooltip("bubble_formula:Q", title="formula", format=".3f"),
            ],
        )
    )
    chart = alt.layer(line, points).properties(width=WIDTH // 2, height=280)
    columns = ["family", "run_id", "m", "bubble_measured", "bubble_formula"]
    return Plot(chart, {"curve": curve, "measured": measured.select(columns)})


def step_time_vs_m(terms: pl.DataFrame, measured: pl.DataFrame, predicted: pl.DataFrame, title: str) -> Plot:
    """Step time over m as stacked waterfall terms, the measured time as a line, the predicted one dashed,
    each one's best m marked."""
    x = alt.X("m:O", title="microbatches m", axis=alt.Axis(labelAngle=0))
    bars = (
        alt.Chart(named("terms"))
        .mark_bar()
        .encode(
            x=x,
            y=alt.Y("sum(ms):Q", title="ms per step"),
            color=alt.Color("term:N", scale=scale(COLOURS, RUNGS), title="waterfall term"),
            order=alt.Order("order:Q"),
            tooltip=[alt.Tooltip("m:O"), alt.Tooltip("term:N"), alt.Tooltip("ms:Q", format=".3f")],
        )
    )
    line = (
        alt.Chart(named("measured"))
        .mark_line(point=True, color="#333")
        .encode(
            x=x,
            y="step_time_ms:Q",
            tooltip=[
                alt.Tooltip("m:O"),
                alt.Tooltip("step_time_ms:Q", title="measured step (ms)", format=".3f"),
                alt.Tooltip("repeats:Q", title="median of runs"),
            ],
        )
    )
    best = (
        alt.Chart(named("measured"))
        .transform_filter("datum.best")
        .mark_text(dy=-12, fontWeight="bold")
        .encode(x=x, y="step_time_ms:Q", text=alt.value("best m"))
    )
    layers = [bars, line, best]
    if not predicted.is_empty():
        guess = alt.Chart(named("predicted"))
        layers += [
            guess.mark_line(point=True, strokeDash=[5, 3], color="#888").encode(
                x=x,
                y="step_time_ms:Q",
                tooltip=[
                    alt.Tooltip("m:O"),
                    alt.Tooltip("step_time_ms:Q", title="predicted step (ms)", format=".3f"),
                ],
            ),
            guess.transform_filter("datum.best")
            .mark_text(dy=14, color="#555")
            .encode(x=x, y="step_time_ms:Q", text=alt.value("predicted best")),
        ]
    chart = alt.layer(*layers, title=title).properties(width=WIDTH // 2, height=280)
    return Plot(chart, {"terms": terms, "measured": measured, "predicted": predicted})


def schedules_side_by_side(terms: pl.DataFrame) -> Plot:
    """At equal (p, m): each schedule's step time as stacked waterfall terms, one panel per setting."""
    chart = (
        alt.Chart(named("terms"))
        .mark_bar()
        .encode(
            x=alt.X("schedule:N", title=None, axis=alt.Axis(labelAngle=0)),
            y=alt.Y("sum(ms):Q", title="ms per step"),
            color=alt.Color("term:N", scale=scale(COLOURS, RUNGS), title="waterfall term"),
            order=alt.Order("order:Q"),
            tooltip=[
                alt.Tooltip("schedule:N"),
                alt.Tooltip("term:N"),
                alt.Tooltip("ms:Q", format=".3f"),
                alt.Tooltip("run_id:N", title="run"),
            ],
        )
        .properties(width=45 * max(terms["schedule"].n_unique(), 2), height=240)
        .facet(column=alt.Column("setting:N", title=None))
    )
    return Plot(chart, {"terms": terms})


def peak_memory_vs_m(frame: pl.DataFrame) -> Plot:
    """Peak activation memory (largest over ranks) against m, one line per schedule family."""
    chart = (
        alt.Chart(named("memory"))
        .mark_line(point=True)
        .encode(
            x=m_x(frame),
            y=alt.Y("peak_mib:Q", title="peak activation memory (MiB, largest rank)"),
            color="family:N",
            tooltip=[alt.Tooltip("family:N"), alt.Tooltip("m:Q"), alt.Tooltip("peak_mib:Q", format=".2f")],
        )
        .properties(width=WIDTH // 2, height=280)
    )
    return Plot(chart, {"memory": frame})
