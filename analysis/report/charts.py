"""Altair charts, each a short pure function from polars frames to a Plot (chart + its data).

Charts name their data (`alt.NamedData`) and the frames ride beside them until `Plot.spec()` puts
them into the spec's top-level `datasets`. That keeps altair out of the data path: its 5000-row
limit and its schema validation (which costs seconds per few thousand inline rows) then apply only
to the chart's small structure. Pages ship every spec in a script file beside the page, not in the
HTML; a run page holds one step's cells and timelines draw on canvas, so 50,000 cells (about 6 MB)
still open in seconds (tests/test_report_browser.py measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import polars as pl

from analysis.schema import COMM_KINDS, COMPUTE_KINDS, GAP_CLASSES, RANK_PARTS, WATERFALL_TERMS

CRITICAL_TRACK = "critical path"  # the timeline's fourth track: the step's critical path, one colour
TRACKS = ("compute", "p2p", "idle", CRITICAL_TRACK)
# One colour per quantity, wherever it is drawn: a rank's part, a waterfall term.
_COLOURS = {
    "compute": "#4c78a8",
    "ideal": "#4c78a8",
    "formula_bubble": "#bab0ac",
    "bubble": "#bab0ac",
    "imbalance": "#f58518",
    "small_gemm": "#e45756",
    "slowdown": "#ff9da6",
    "launch_overhead": "#9d755d",
    "p2p_wait": "#b279a2",
    "dp_sync": "#54a24b",
    "other": "#e0e0e0",
    "variability": "#ff9da6",
    "residual": "#eeca3b",
    "measured": "#333333",
}
# Compute kinds in strong colours, their p2p counterparts pale, idle classes as their parts.
_WHAT_COLOURS = {
    "F": "#4c78a8",
    "B": "#f58518",
    "I": "#e45756",
    "W": "#72b7b2",
    "SEND_F": "#9ecae9",
    "RECV_F": "#c6dbef",
    "SEND_B": "#ffbf79",
    "RECV_B": "#fdd0a2",
    **{name: _COLOURS[name] for name in GAP_CLASSES},
    CRITICAL_TRACK: "#d62728",
}
WIDTH = 900
# m is a power of two in every sweep we run; ticks there instead of log-scale ticks at 1.5, 2.5, ...
_M_AXIS = alt.Axis(values=[2**k for k in range(13)], format="d")


@dataclass(frozen=True)
class Plot:
    chart: alt.TopLevelMixin
    datasets: dict[str, pl.DataFrame]

    def spec(self) -> dict:
        """The vega-lite spec with every dataset inlined (validated by altair without the data)."""
        return self.chart.to_dict() | {"datasets": {name: f.to_dicts() for name, f in self.datasets.items()}}


def _scale(colours: dict[str, str], domain: tuple[str, ...]) -> alt.Scale:
    return alt.Scale(domain=list(domain), range=[colours[name] for name in domain])


def _named(name: str) -> alt.NamedData:
    return alt.NamedData(name=name)


def timeline(frame: pl.DataFrame, title: str, ranks: int, name: str = "timeline") -> Plot:
    """One row per rank, three tracks inside it (compute, p2p, idle); hover shows what and how long."""
    what = (*COMPUTE_KINDS, *COMM_KINDS, *GAP_CLASSES, CRITICAL_TRACK)
    chart = (
        alt.Chart(_named(name), title=title)
        .mark_rect(stroke="white")
        .encode(
            x=alt.X("start_ms:Q", title="ms from the start of the step"),
            x2="end_ms:Q",
            # Outline single cells so neighbours of one kind stay apart; binned bars are too thin for it.
            strokeWidth=alt.condition("datum.cells > 1", alt.value(0), alt.value(0.5)),
            y=alt.Y("rank:O", title="rank"),
            yOffset=alt.YOffset("track:N", scale=alt.Scale(domain=list(TRACKS))),
            color=alt.Color("what:N", scale=_scale(_WHAT_COLOURS, what), title="cell kind / gap class"),
            tooltip=[
                alt.Tooltip("action:N", title="action"),
                alt.Tooltip("microbatch:Q"),
                alt.Tooltip("rank:O"),
                alt.Tooltip("track:N"),
                alt.Tooltip("start_ms:Q", title="start (ms)", format=".3f"),
                alt.Tooltip("duration_ms:Q", title="duration (ms)", format=".3f"),
                alt.Tooltip("cells:Q", title="cells in this bar"),
            ],
        )
        .properties(width=WIDTH, height=60 * ranks)
    )
    return Plot(chart, {name: frame})


def timelines(
    measured: list[tuple[str, pl.DataFrame]], ideal: pl.DataFrame | None, ranks: int, ideal_title: str
) -> Plot:
    """The measured timelines (one per pipeline: title, frame), one above another, then the simulated
    ideal one, on one shared time axis."""
    plots = [
        timeline(frame, title, frame["rank"].n_unique(), "measured" if len(measured) == 1 else f"measured{i}")
        for i, (title, frame) in enumerate(measured)
    ]
    if ideal is not None:
        plots.append(timeline(ideal, ideal_title, ranks, "ideal"))
    chart = alt.vconcat(*[p.chart for p in plots]).resolve_scale(x="shared")
    return Plot(chart, {name: f for p in plots for name, f in p.datasets.items()})


def waterfall(frame: pl.DataFrame) -> Plot:
    """From the formula's step time (ideal + formula bubble) through each deviation to the measured one."""
    base = alt.Chart(_named("waterfall")).encode(
        x=alt.X("term:N", sort=alt.SortField("order"), title=None, axis=alt.Axis(labelAngle=0))
    )
    bars = base.mark_bar().encode(
        y=alt.Y("start:Q", title="ms of the step"),
        y2="end:Q",
        color=alt.Color("term:N", scale=_scale(_COLOURS, (*WATERFALL_TERMS, "measured")), legend=None),
        tooltip=[
            alt.Tooltip("term:N"),
            alt.Tooltip("ms:Q", title="ms", format=".3f"),
            alt.Tooltip("end:Q", title="running total (ms)", format=".3f"),
        ],
    )
    labels = base.mark_text(dy=-7).encode(y="top:Q", text=alt.Text("label:N"))
    chart = alt.layer(bars, labels).properties(width=WIDTH * 2 // 3, height=260)
    return Plot(chart, {"waterfall": frame.with_columns(top=pl.max_horizontal("start", "end"))})


def rank_parts(frame: pl.DataFrame) -> Plot:
    """Each rank's step as one stacked bar of its parts (they sum to the step time)."""
    chart = (
        alt.Chart(_named("parts"))
        .mark_bar()
        .encode(
            x=alt.X("sum(ms):Q", title="ms of the step"),
            y=alt.Y("rank:O"),
            color=alt.Color("part:N", scale=_scale(_COLOURS, RANK_PARTS)),
            order=alt.Order("order:Q"),
            tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("part:N"), alt.Tooltip("ms:Q", format=".3f")],
        )
        .properties(width=WIDTH * 2 // 3)
    )
    return Plot(chart, {"parts": frame})


def bubble_vs_m(curve: pl.DataFrame, measured: pl.DataFrame) -> Plot:
    """Formula bubble as a line over m, measured bubbles as points, one colour per family."""
    x = alt.X("m:Q", scale=alt.Scale(type="log", base=2), axis=_M_AXIS, title="microbatches m (log scale)")
    line = (
        alt.Chart(_named("curve"))
        .mark_line(strokeDash=[5, 3])
        .encode(
            x=x,
            y=alt.Y("bubble:Q", title="bubble (fraction of the step)"),
            color=alt.Color("family:N"),
            tooltip=[
                alt.Tooltip("family:N"),
                alt.Tooltip("m:Q"),
                alt.Tooltip("bubble:Q", title="formula", format=".3f"),
            ],
        )
    )
    points = (
        alt.Chart(_named("measured"))
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
        alt.Chart(_named("terms"))
        .mark_bar()
        .encode(
            x=x,
            y=alt.Y("sum(ms):Q", title="ms per step"),
            color=alt.Color("term:N", scale=_scale(_COLOURS, WATERFALL_TERMS), title="waterfall term"),
            order=alt.Order("order:Q"),
            tooltip=[alt.Tooltip("m:O"), alt.Tooltip("term:N"), alt.Tooltip("ms:Q", format=".3f")],
        )
    )
    line = (
        alt.Chart(_named("measured"))
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
        alt.Chart(_named("measured"))
        .transform_filter("datum.best")
        .mark_text(dy=-12, fontWeight="bold")
        .encode(x=x, y="step_time_ms:Q", text=alt.value("best m"))
    )
    layers = [bars, line, best]
    if not predicted.is_empty():
        guess = alt.Chart(_named("predicted"))
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
        alt.Chart(_named("terms"))
        .mark_bar()
        .encode(
            x=alt.X("schedule:N", title=None, axis=alt.Axis(labelAngle=0)),
            y=alt.Y("sum(ms):Q", title="ms per step"),
            color=alt.Color("term:N", scale=_scale(_COLOURS, WATERFALL_TERMS), title="waterfall term"),
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
        alt.Chart(_named("memory"))
        .mark_line(point=True)
        .encode(
            x=alt.X(
                "m:Q", scale=alt.Scale(type="log", base=2), axis=_M_AXIS, title="microbatches m (log scale)"
            ),
            y=alt.Y("peak_mib:Q", title="peak activation memory (MiB, largest rank)"),
            color="family:N",
            tooltip=[alt.Tooltip("family:N"), alt.Tooltip("m:Q"), alt.Tooltip("peak_mib:Q", format=".2f")],
        )
        .properties(width=WIDTH // 2, height=280)
    )
    return Plot(chart, {"memory": frame})


def memory_per_rank(frame: pl.DataFrame) -> Plot:
    """Peak activation memory per rank (its stages), in MiB."""
    chart = (
        alt.Chart(_named("memory"))
        .mark_bar()
        .encode(
            x=alt.X("peak_mib:Q", title="peak activation memory (MiB)"),
            y=alt.Y("rank:O"),
            tooltip=[
                alt.Tooltip("rank:O"),
                alt.Tooltip("stage_ids:N", title="stages"),
                alt.Tooltip("peak_mib:Q", format=".2f"),
            ],
        )
        .properties(width=WIDTH // 2)
    )
    return Plot(chart, {"memory": frame})


def in_flight(
    measured: pl.DataFrame, theory: pl.DataFrame | None, peaks: pl.DataFrame, theory_title: str
) -> Plot:
    """Live microbatches per rank over the step, measured above the schedule's own count on a replay of it
    (one shared time axis, as the timelines); the schedule's peak per rank as a dashed rule in both."""
    colour = alt.Color("rank:N", title="rank")
    rules = (
        alt.Chart(_named("peaks"))
        .mark_rule(strokeDash=[4, 3])
        .encode(
            y="theory:Q",
            color=colour,
            tooltip=[alt.Tooltip("rank:N"), alt.Tooltip("theory:Q", title="theory peak")],
        )
    )

    def panel(name: str, title: str) -> alt.LayerChart:
        lines = (
            alt.Chart(_named(name), title=title)
            .mark_line(interpolate="step-after")
            .encode(
                x=alt.X("t_ms:Q", title="ms from the start of the step"),
                y=alt.Y("live:Q", title="microbatches in flight"),
                color=colour,
                tooltip=[alt.Tooltip("rank:N"), alt.Tooltip("t_ms:Q", format=".3f"), alt.Tooltip("live:Q")],
            )
        )
        return alt.layer(lines, rules).properties(width=WIDTH * 2 // 3, height=180)

    panels = [panel("live", "measured")] + ([] if theory is None else [panel("theory", theory_title)])
    chart = alt.vconcat(*panels).resolve_scale(x="shared")
    return Plot(chart, {"live": measured, "peaks": peaks, **({} if theory is None else {"theory": theory})})


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
    x = alt.X("m:Q", scale=alt.Scale(type="log", base=2), axis=_M_AXIS, title="microbatches m (log scale)")
    colour = alt.Color("label:N", title="schedule v (engine)")

    def panel(y: str, title: str) -> alt.LayerChart:
        predicted = (
            alt.Chart(_named("candidates"))
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
            alt.Chart(_named("candidates")).transform_filter("datum.fits").mark_point(filled=True, size=40)
        )
        runs = alt.Chart(_named("measured")).mark_point(shape="diamond", size=90, filled=True, stroke="black")
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
