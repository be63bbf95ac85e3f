"""The advice chart (on the run page and the index's sweeps): predicted step time and peak memory over m
per candidate, beside the measured runs."""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.report.plot import WIDTH, Plot, m_x, named

MEASURED_ADVICE_SCHEMA = {
    "label": pl.String,
    "m": pl.Int64,
    "step_time_ms": pl.Float64,
    "peak_mib": pl.Float64,
}


def empty_measured() -> pl.DataFrame:
    """No measured runs beside an advice chart (the run page's)."""
    return pl.DataFrame(schema=MEASURED_ADVICE_SCHEMA)


def advice_vs_m(candidates: pl.DataFrame, measured: pl.DataFrame, limit_mib: float | None) -> Plot:
    """Predicted step time and peak memory against m, a line per candidate label (hollow points: over the
    memory limit, drawn as a red rule), and measured runs as black-edged points on the same axes."""
    x = m_x(candidates, measured)
    colour = alt.Color("label:N", title="schedule v (engine)")

    def panel(y: str, title: str) -> alt.LayerChart:
        predicted = (
            alt.Chart(named("candidates"))
            .mark_line(point=alt.OverlayMarkDef(filled=False, size=40))
            .encode(
                x=x,
                y=alt.Y(f"{y}:Q", title=title),
                color=colour,
                tooltip=[
                    alt.Tooltip("label:N"),
                    alt.Tooltip("m:Q"),
                    alt.Tooltip(f"{y}:Q", format=".2f"),
                    alt.Tooltip("fits:N"),
                ],
            )
        )
        fitting = (
            alt.Chart(named("candidates")).transform_filter("datum.fits").mark_point(filled=True, size=40)
        )
        runs = alt.Chart(named("measured")).mark_point(shape="diamond", size=90, filled=True, stroke="black")
        layers = [
            predicted,
            fitting.encode(x=x, y=f"{y}:Q", color=colour),
            runs.encode(
                x=x,
                y=f"{y}:Q",
                color=colour,
                tooltip=[alt.Tooltip("label:N"), alt.Tooltip("m:Q"), alt.Tooltip(f"{y}:Q", title="measured")],
            ),
        ]
        if y == "peak_mib" and limit_mib is not None:
            rule = alt.Chart(alt.Data(values=[{"limit": limit_mib}])).mark_rule(
                color="#d62728", strokeDash=[4, 2]
            )
            layers.append(rule.encode(y="limit:Q"))
        return alt.layer(*layers).properties(width=WIDTH // 2 - 60, height=280)

    chart = alt.hconcat(
        panel("step_time_ms", "predicted step time (ms)"), panel("peak_mib", "peak activation memory (MiB)")
    )
    return Plot(chart, {"candidates": candidates, "measured": measured})
