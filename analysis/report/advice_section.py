"""The run page's advice (RUN/advice.json: the best candidates and their step and memory against m) and
the sweep page's chart of a sweep's advice with its measured runs on the same axes. Advice is not
computed here (analysis.results.read_advice reads what `python -m analysis advise` wrote)."""

from __future__ import annotations

import html

import polars as pl

from analysis import results
from analysis.errors import InputError
from analysis.report import advice_chart
from analysis.report.pages import Column, Figure, number, table
from analysis.report.runs import Run
from analysis.schema import MIB, Advice
from analysis.vocabulary import ASSUMED, Assumption

HEADING = "<h2>Advice: schedule, m and v at this p</h2>"
SHOWN = 10  # rows of the table; the chart draws every candidate
UNKNOWN_ENGINE = "unknown engine"  # a foreign trace's run, whose engine no run.json names
CANDIDATE_SCHEMA = {
    "label": pl.String,
    "m": pl.Int64,
    "step_time_ms": pl.Float64,
    "step_time_low_ms": pl.Float64,
    "step_time_high_ms": pl.Float64,
    "peak_mib": pl.Float64,
    "fits": pl.Boolean,
}

COLUMNS = [
    Column("#", "rank in the advice: those that fit the memory limit first, by predicted step"),
    Column("engine", "make trace ENGINE=...", text=True),
    Column("schedule", "make trace SCHED=...", text=True),
    Column("m", "microbatches"),
    Column("v", "chunks per rank"),
    Column("step ms", "predicted step time (profiled)", number(1)),
    Column("interval ms", "the middle 90% of the resampled replays"),
    Column("bubble formula", "the order's unit-time bubble", number(3)),
    Column("peak MiB", "predicted peak activation memory, largest rank", number(2)),
    Column("fits", "within the memory limit", text=True),
    Column("assumed", "what the prediction assumed beyond this run's measurements: named below", text=True),
]


def label(schedule: str, v: int, engine: str | None) -> str:
    """One curve of the chart: a schedule at its v on its engine (the same for a candidate and a run)."""
    return f"{schedule} v={v} ({engine or UNKNOWN_ENGINE})"


def candidates_frame(advice: Advice) -> pl.DataFrame:
    rows = [
        (
            label(c.schedule, c.v, c.engine),
            c.m,
            c.step_time_ms,
            c.step_time_low_ms,
            c.step_time_high_ms,
            None if c.peak_activation_bytes is None else c.peak_activation_bytes / MIB,
            c.fits,
        )
        for c in advice.candidates
    ]
    return pl.DataFrame(rows, schema=CANDIDATE_SCHEMA, orient="row")


def _limit_mib(advice: Advice) -> float | None:
    return None if advice.memory_limit_bytes is None else advice.memory_limit_bytes / MIB


def _read(run: Run) -> tuple[Advice | None, str]:
    try:
        return results.read_advice(run.path), ""
    except InputError as error:
        return None, f"<p>{html.escape(str(error))}</p>"


def section(run: Run) -> tuple[str, Figure | None]:
    """The run page's advice section and its chart (none without advice.json)."""
    advice, problem = _read(run)
    if advice is None:
        where = html.escape(str(run.path))
        return HEADING + (
            problem
            or f"<p>No advice yet: <code>make advise RUN={where}</code> predicts every schedule, m and v the "
            "engines admit at this run's p from this run and writes <code>advice.json</code>, shown here.</p>"
        ), None
    rows = [
        [
            i,
            c.engine or UNKNOWN_ENGINE,
            c.schedule,
            c.m,
            c.v,
            c.step_time_ms,
            f"{c.step_time_low_ms:.1f} - {c.step_time_high_ms:.1f}",
            c.bubble_formula,
            None if c.peak_activation_bytes is None else c.peak_activation_bytes / MIB,
            "yes" if c.fits else "no",
            "; ".join([*c.assumptions, *c.caveats]),
        ]
        for i, c in enumerate(advice.candidates[:SHOWN], 1)
    ]
    ranked = (
        ""
        if advice.ranked
        else f"<p>Not ranked: {html.escape('; '.join(advice.caveats))}. The candidates are listed all the same.</p>"
    )
    limit = _limit_mib(advice)
    figure = Figure(
        "advice",
        advice_chart.advice_vs_m(candidates_frame(advice), advice_chart.empty_measured(), limit),
        "Predicted step time (left) and peak activation memory of the largest rank (right) against m, one "
        "line per schedule, v and engine, from this run alone (python -m analysis advise)"
        + (f"; the red rule is the memory limit, {limit:.1f} MiB" if limit is not None else "")
        + ". Hollow points do not fit the limit.",
    )
    return HEADING + ranked + table(COLUMNS, rows) + _assumed(advice) + figure.html(), figure


def _assumed(advice: Advice) -> str:
    """What each assumption named in the table (and the ranking's own) means."""
    named = {*advice.assumptions, *(name for c in advice.candidates[:SHOWN] for name in c.assumptions)}
    items = "".join(
        f"<li><code>{a}</code>: {html.escape(ASSUMED[a])}</li>" for a in Assumption if str(a) in named
    )
    return f"<p>Assumed:</p><ul>{items}</ul>" if items else ""


def sweep_figure(source: Run, runs: pl.DataFrame, name: str) -> Figure | None:
    """The source run's advice with every analysed run at its p and device measured on the same axes;
    None where the source has no readable advice."""
    advice, _ = _read(source)
    if advice is None:
        return None
    s = source.summary
    at_p = runs.filter((pl.col("p") == s.p) & (pl.col("device") == s.device))
    measured = at_p.select(
        label=pl.format("{} v={} ({})", "schedule", "v", pl.col("engine").fill_null(UNKNOWN_ENGINE)),
        m="m",
        step_time_ms="step_time_ms",
        peak_mib=pl.col("peak_activation_bytes") / MIB,
    )
    return Figure(
        name,
        advice_chart.advice_vs_m(candidates_frame(advice), measured, _limit_mib(advice)),
        f"Advice from {html.escape(source.run_id)} (lines: predicted step and peak memory against m per "
        f"schedule, v and engine) with every run measured at p={s.p} on {s.device} as points on the same axes.",
    )
