"""The run page's charts, each a short pure function from polars frames to a Plot: the timelines, the
waterfall, the per-rank parts and memory, the microbatches in flight."""

from __future__ import annotations

import altair as alt
import polars as pl

from analysis.report.plot import COLOURS, WIDTH, Plot, named, scale
from analysis.schema import COMM_KINDS, COMPUTE_KINDS, GAP_CLASSES, RANK_PARTS
from analysis.vocabulary import RUNGS, Part

CRITICAL_TRACK = "critical path"  # the timeline's fourth track: the step's critical path, one colour
TRACKS = (Part.COMPUTE, "p2p", "idle", CRITICAL_TRACK)
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
    **{name: COLOURS[name] for name in GAP_CLASSES},
    CRITICAL_TRACK: "#d62728",
}


def timeline(frame: pl.DataFrame, title: str, ranks: int, name: str = "timeline") -> Plot:
    """One row per rank, three tracks inside it (compute, p2p, idle); hover shows what and how long."""
    what = (*COMPUTE_KINDS, *COMM_KINDS, *GAP_CLASSES, CRITICAL_TRACK)
    chart = (
        alt.Chart(named(name), title=title)
        .mark_rect(stroke="white")
        .encode(
            x=alt.X("start_ms:Q", title="ms from the start of the step"),
            x2="end_ms:Q",
            # Outline single cells so neighbours of one kind stay apart; binned bars are too thin for it.
            strokeWidth=alt.condition("datum.cells > 1", alt.value(0), alt.value(0.5)),
            y=alt.Y("rank:O", title="rank"),
            yOffset=alt.YOffset("track:N", scale=alt.Scale(domain=list(TRACKS))),
            color=alt.Color("what:N", scale=scale(_WHAT_COLOURS, what), title="cell kind / gap class"),
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
    base = alt.Chart(named("waterfall")).encode(
        x=alt.X(
            "term:N",
            sort=alt.SortField("order"),
            title=None,
            # a name's words on lines of their own: a dozen rungs fit the page without overlapping
            axis=alt.Axis(labelAngle=0, labelExpr="split(datum.label, '_')"),
        )
    )
    bars = base.mark_bar().encode(
        y=alt.Y("start:Q", title="ms of the step"),
        y2="end:Q",
        color=alt.Color("term:N", scale=scale(COLOURS, (*RUNGS, "measured")), legend=None),
        tooltip=[
            alt.Tooltip("term:N"),
            alt.Tooltip("ms:Q", title="ms", format=".3f"),
            alt.Tooltip("end:Q", title="running total (ms)", format=".3f"),
        ],
    )
    labels = base.mark_text(dy=-7).encode(y="top:Q", text=alt.Text("label:N"))
    chart = alt.layer(bars, labels).properties(width=WIDTH, height=260)
    return Plot(chart, {"waterfall": frame.with_columns(top=pl.max_horizontal("start", "end"))})


def rank_parts(frame: pl.DataFrame) -> Plot:
    """Each rank's step as one stacked bar of its parts (they sum to the step time)."""
    chart = (
        alt.Chart(named("parts"))
        .mark_bar()
        .encode(
            x=alt.X("sum(ms):Q", title="ms of the step"),
            y=alt.Y("rank:O"),
            color=alt.Color("part:N", scale=scale(COLOURS, RANK_PARTS)),
            order=alt.Order("order:Q"),
            tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("part:N"), alt.Tooltip("ms:Q", format=".3f")],
        )
        .properties(width=WIDTH * 2 // 3)
    )
    return Plot(chart, {"parts": frame})


def memory_per_rank(frame: pl.DataFrame) -> Plot:
    """Peak activation memory per rank (its stages), in MiB."""
    chart = (
        alt.Chart(named("memory"))
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
        alt.Chart(named("peaks"))
        .mark_rule(strokeDash=[4, 3])
        .encode(
            y="theory:Q",
            color=colour,
            tooltip=[alt.Tooltip("rank:N"), alt.Tooltip("theory:Q", title="theory peak")],
        )
    )

    def panel(name: str, title: str) -> alt.LayerChart:
        lines = (
            alt.Chart(named(name), title=title)
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


def stage_heatmap(frame: pl.DataFrame, quantities: tuple[str, ...]) -> Plot:
    """Ranks as cells, stage against pipeline, coloured by the ms of the quantity the reader picks."""
    pick = alt.param(
        name="quantity",
        value=quantities[0],
        bind=alt.binding_select(options=list(quantities), name="colour by "),
    )
    chart = (
        alt.Chart(named("stages"))
        .mark_rect()
        .encode(
            x=alt.X("pipeline:O", title="pipeline"),
            y=alt.Y("stage:O", title="stage (pipeline rank)"),
            color=alt.Color("ms:Q", title="ms", scale=alt.Scale(scheme="orangered")),
            tooltip=[
                alt.Tooltip("rank:O"),
                alt.Tooltip("pipeline:O"),
                alt.Tooltip("stage:O"),
                alt.Tooltip("quantity:N"),
                alt.Tooltip("ms:Q", format=".3f"),
            ],
        )
        .add_params(pick)
        .transform_filter(alt.datum.quantity == pick)
        .properties(width=alt.Step(18), height=alt.Step(22))
    )
    return Plot(chart, {"stages": frame})
