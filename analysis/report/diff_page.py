"""A page comparing two runs: what changed beyond the runs' noise (a stored diff, analysis.diff.stored:
the report draws it, `python -m analysis diff` or `report` made it), then the runs side by side: their
waterfalls, their ranks' parts and their median steps' timelines on one time axis."""

from __future__ import annotations

import html

import polars as pl

from analysis.diff.figures import place, shown
from analysis.diff.stored import StoredChange, StoredDiff
from analysis.report import diff_charts, job_view
from analysis.report.frames import coarsen, rank_parts_frame, step_origin, timeline_frame, waterfall_frame
from analysis.report.pages import Column, Figure, link, table
from analysis.report.runs import Run

NONE = "—"  # a figure a run lacks, as the report shows it everywhere
CHANGE_COLUMNS = [
    Column("figure", "the part, rung or figure as summary.json names it (docs/numbers.md#diff)", text=True),
    Column("where", "the rank and stage it is of, or the whole step", text=True),
    Column("A", "A's median over its analysed steps (a figure with one value per run: that value)"),
    Column("B", "B's median over its analysed steps"),
    Column("change", "B - A"),
    Column("interval", "the test's interval of the change (— where it could not be tested)"),
    Column(
        "expected",
        "the change the formula (the bubble) or the model (the step) expects where the runs' schedule, p, m "
        "or v differ; — where they do not",
    ),
    Column(
        "verdict",
        "significant: the permutation test's p is at most 0.01; otherwise why it is not called a change",
        text=True,
    ),
]


def _row(change: StoredChange) -> list[str]:
    interval = (
        "—"
        if change.low is None or change.high is None
        else f"{shown(change.low, change.unit, True)} .. {shown(change.high, change.unit, True)}"
    )
    verdict = "significant" if change.significant else change.why or "within noise"
    return [
        change.name,
        place(change.rank, change.stage),
        shown(change.a, change.unit, missing=NONE),
        shown(change.b, change.unit, missing=NONE),
        shown(change.delta, change.unit, True, missing=NONE),
        interval,
        shown(change.expected, change.unit, True, missing=NONE),
        verdict,
    ]


def changes_html(stored: StoredDiff) -> str:
    """The significant changes (largest first, marked), then the rest folded away."""
    significant = [change for change in stored.changes if change.significant]
    rest = [change for change in stored.changes if not change.significant]
    shown = (
        table(CHANGE_COLUMNS, [_row(c) for c in significant], ["significant"] * len(significant))
        if significant
        else "<p>No figure changed beyond the runs' noise.</p>"
    )
    folded = (
        f"<details><summary>the other {len(rest)} figures, within noise or untested</summary>"
        f"{table(CHANGE_COLUMNS, [_row(c) for c in rest])}</details>"
        if rest
        else ""
    )
    return shown + folded


def _configuration(side: str, run: Run, page: str) -> str:
    s = run.summary
    return (
        f"<li><b>{side}</b>: {link(page, run.run_id).text}: {html.escape(s.schedule)} p={s.p} m={s.m} v={s.v} "
        f"dp={s.dp}, step {s.step_time_ms:.3f} ms, {s.steps_analyzed} steps analysed</li>"
    )


def _timeline_frame(run: Run) -> pl.DataFrame:
    """The median step's cells, gaps and critical path, of the slowest pipeline where there are several."""
    analysis, step = run.analysis, run.summary.median_step
    origin = step_origin(analysis.cells, analysis.gaps, step)
    frame = timeline_frame(analysis.cells, analysis.gaps, step, origin, analysis.critical)
    straggler = run.summary.straggler
    if straggler is not None:
        frame = frame.filter(pl.col("rank").is_in(run.summary.pipelines[straggler.pipeline].ranks))
    return coarsen(frame)


def _parts_frame(runs: tuple[Run, Run]) -> pl.DataFrame:
    frame = diff_charts.labelled([rank_parts_frame(run.summary) for run in runs])
    return frame.with_columns(
        row=pl.format("rank {}, {}", "rank", "run"),
        row_order=pl.col("rank") * 2 + (pl.col("run") == "B").cast(pl.Int64),
    )


def figures(runs: tuple[Run, Run]) -> list[Figure]:
    """The waterfalls, and where neither run has too many ranks to draw (job_view), the parts and the
    timelines."""
    found = [
        Figure(
            "waterfalls",
            diff_charts.waterfalls(diff_charts.labelled([waterfall_frame(run.summary) for run in runs])),
            "Each run's waterfall, A's bar beside B's on every rung: from the formula's step (ideal + "
            "fill_drain) through each deviation to the measured step (docs/numbers.md#waterfall). A rung "
            "without a bar is 0 or unknown (hover for its value).",
        )
    ]
    if any(job_view.summarised(run.summary) for run in runs):
        return found
    found.append(
        Figure(
            "parts",
            diff_charts.rank_parts(_parts_frame(runs)),
            "Each rank's step split into its parts in ms (they sum to its step), A's bar above B's.",
        )
    )
    titles = [
        f"{side}: step {run.summary.median_step} (its median step)"
        for side, run in zip(diff_charts.RUNS, runs)
    ]
    found.append(
        Figure(
            "timelines",
            diff_charts.timelines([(title, _timeline_frame(run)) for title, run in zip(titles, runs)]),
            "Each run's median step on one time axis from its start: per rank the compute cells, the p2p "
            "cells, the idle gaps by class and in red the critical path (as on each run's page); in a job "
            "of several pipelines, its slowest pipeline's ranks.",
            "canvas",
        )
    )
    return found


def body(stored: StoredDiff, runs: tuple[Run, Run], pages: tuple[str, str]) -> tuple[str, list[Figure]]:
    """The page's HTML and its figures; `pages`: A's and B's run pages, relative to this page."""
    a, b = runs
    significant = sum(change.significant for change in stored.changes)
    drawn = figures(runs)
    sections = [
        '<p><a href="../../index.html">all runs</a></p>',
        f"<h1>{html.escape(a.run_id)} → {html.escape(b.run_id)}</h1>",
        f"<ul>{_configuration('A', a, pages[0])}{_configuration('B', b, pages[1])}</ul>",
        f"<p><b>{significant} of {len(stored.changes)} figures changed beyond the runs' noise.</b> "
        f'<span class="note">Test: {html.escape(stored.test)}.</span></p>',
        *(f'<p class="note">Note: {html.escape(note)}.</p>' for note in stored.notes),
        "<h2>What changed</h2>",
        changes_html(stored),
        "<h2>Side by side</h2>",
        "\n".join(figure.html() for figure in drawn),
    ]
    if len(drawn) == 1:
        sections.append(
            "<p>The runs' parts and timelines are on their own pages: a job this many ranks wide is "
            "summarised there.</p>"
        )
    return "\n".join(sections), drawn
