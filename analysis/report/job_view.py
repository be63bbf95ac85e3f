"""The run page of a job of many ranks: per-pipeline and per-stage tables, a stage x pipeline heatmap of
the ranks' parts, the slowest pipeline, stage and rank named, and one pipeline's timeline at a time,
picked by the reader (analysis.report.run_page places them)."""

from __future__ import annotations

import html

import polars as pl

from analysis.report import run_charts
from analysis.report.frames import coarsen
from analysis.report.pages import Choice, Column, Figure, number, table
from analysis.report.plot import Plot
from analysis.report.run_tables import PART_MEANINGS
from analysis.schema import RANK_PARTS, Summary
from analysis.vocabulary import GapClass

# A run page draws every rank's timeline up to this many ranks: at 60 px a rank that is two screens of
# rows. Past it, all pipelines' rows (6 MB of chart data and seconds to draw at 256 ranks) would bury the
# page, so it summarises per pipeline and stage and draws the pipeline the reader picks.
TIMELINE_RANKS_MAX = 32
# What the heatmap and the tables show per rank: its parts (they sum to the step time) and its busy time.
QUANTITIES = ("busy", *RANK_PARTS)
# The parts the pipeline and stage tables show: where a job's step goes besides work.
TABLE_PARTS = (GapClass.BUBBLE, GapClass.P2P_WAIT, GapClass.DP_SYNC)


def summarised(summary: Summary) -> bool:
    return len(summary.ranks) > TIMELINE_RANKS_MAX


def rank_frame(summary: Summary) -> pl.DataFrame:
    """One row per rank and quantity: its pipeline, its stage (its place in the pipeline), the ms (ranks
    without an isolated calibration have no small_gemm or slowdown row)."""
    stage_of = {rank: s for line in summary.pipelines for s, rank in enumerate(line.ranks)}
    rows = [
        {"rank": e.rank, "pipeline": e.pipeline, "stage": stage_of[e.rank], "quantity": q, "ms": ms}
        for e in summary.ranks
        for q in QUANTITIES
        if (ms := e.busy_ms if q == "busy" else e.part_ms(q)) is not None
    ]
    return pl.DataFrame(rows, schema={"rank": pl.Int64, "pipeline": pl.Int64, "stage": pl.Int64} | _QUANTITY)


_QUANTITY = {"quantity": pl.String, "ms": pl.Float64}


def _wide(frame: pl.DataFrame, by: str) -> pl.DataFrame:
    """Per `by` (pipeline or stage): the mean over its ranks of each quantity, and its slowest rank."""
    means = frame.pivot(on="quantity", index=by, values="ms", aggregate_function="mean")
    busy = frame.filter(pl.col("quantity") == "busy").sort("ms", descending=True)
    slowest = busy.group_by(by, maintain_order=True).first().select(by, slowest_rank="rank", slowest_ms="ms")
    return means.join(slowest, on=by).sort(by)


def _part_columns() -> list[Column]:
    return [
        Column(f"{part} (ms)", f"the mean over its ranks: {PART_MEANINGS[part]}", show=number(3))
        for part in TABLE_PARTS
    ]


def _slowest_columns(what: str) -> list[Column]:
    return [
        Column(
            "busy (ms)",
            f"the mean over the {what}'s ranks of their busy time (compute + small_gemm + slowdown)",
            number(3),
        ),
        Column("busiest rank", f"the {what}'s rank with the most busy time"),
        Column("its busy (ms)", "that rank's busy time", number(3)),
    ]


def pipelines_html(summary: Summary, frame: pl.DataFrame) -> str:
    """One row per pipeline (the straggler's flagged): its step, its step alone, its bubble and the mean
    of its ranks' waits."""
    wide = _wide(frame, "pipeline")
    columns = [
        Column("pipeline", "the data-parallel replica"),
        Column("ranks", "its global ranks, first stage to last", text=True),
        Column("step (ms)", "its median step's time: each of its ranks' parts sum to it", number(3)),
        Column("alone (ms)", "its step less its ranks' wait for slower replicas", number(3)),
        Column("bubble (busy-time)", "1 - its ranks' busy time / (p * its step time)", number(3)),
        *_part_columns(),
        *_slowest_columns("pipeline"),
    ]
    rows = [
        [
            j,
            f"{line.ranks[0]}-{line.ranks[-1]}"
            if _contiguous(line.ranks)
            else ", ".join(map(str, line.ranks)),
        ]
        + [line.step_time_ms, line.step_time_alone_ms, line.bubble_measured]
        + [row[part] for part in TABLE_PARTS]
        + [row["busy"], row["slowest_rank"], row["slowest_ms"]]
        for j, (line, row) in enumerate(zip(summary.pipelines, wide.iter_rows(named=True), strict=True))
    ]
    straggler = None if summary.straggler is None else summary.straggler.pipeline
    return table(columns, rows, ["flagged" if j == straggler else "" for j in range(len(rows))])


def _contiguous(ranks: list[int]) -> bool:
    return ranks == list(range(ranks[0], ranks[0] + len(ranks)))


def stages_html(frame: pl.DataFrame) -> str:
    """One row per stage (a place in the pipeline), over the pipelines: the mean of its ranks' waits and
    busy time, and its busiest rank (the slowest replica of that stage)."""
    wide = _wide(frame, "stage")
    columns = [
        Column("stage", "the place in the pipeline (pipeline rank): one rank of every pipeline"),
        *_part_columns(),
        *_slowest_columns("stage"),
    ]
    rows = [
        [
            row["stage"],
            *[row[part] for part in TABLE_PARTS],
            row["busy"],
            row["slowest_rank"],
            row["slowest_ms"],
        ]
        for row in wide.iter_rows(named=True)
    ]
    return table(columns, rows)


def slowest_html(summary: Summary, frame: pl.DataFrame) -> str:
    """The slowest pipeline, stage and rank, in words."""
    busy = frame.filter(pl.col("quantity") == "busy")
    stages = busy.group_by("stage").agg(pl.col("ms").mean()).sort(["ms", "stage"], descending=[True, False])
    rank = busy.sort(["ms", "rank"], descending=[True, False]).row(0, named=True)
    said = []
    if summary.straggler is not None:
        j, line = summary.straggler.pipeline, summary.pipelines[summary.straggler.pipeline]
        said.append(
            f"Slowest pipeline: {j}, {line.step_time_alone_ms:.3f} ms alone, {summary.straggler.slower_ms:.3f} ms "
            f"({summary.straggler.slower_fraction:.1%}) over the fastest."
        )
    (stage, most), least = stages.row(0), stages["ms"].min()
    said.append(
        f"Slowest stage: {stage}, {most:.3f} ms busy on the mean over the pipelines (the fastest {least:.3f} ms)."
    )
    said.append(
        f"Busiest rank: {rank['rank']} (pipeline {rank['pipeline']}, stage {rank['stage']}), {rank['ms']:.3f} ms busy."
    )
    return f"<p>{html.escape(' '.join(said))}</p>"


def heatmap_figure(frame: pl.DataFrame) -> Figure:
    return Figure(
        "stages",
        run_charts.stage_heatmap(frame, QUANTITIES),
        "Every rank as a cell, its stage against its pipeline, coloured by the quantity picked below the "
        "chart (ms of the median step; busy is compute + small_gemm + slowdown). A slow replica shows as a "
        "column, a slow stage as a row. Hover a cell for its rank.",
    )


def timeline_choice(
    summary: Summary, measured: pl.DataFrame, ideal: pl.DataFrame, caption: str, stem: str
) -> Choice:
    """One pipeline's timeline over its own ideal one, a script file per pipeline, the slowest drawn
    first. Every pipeline has p ranks, so one chart takes each one's data (altair builds and validates a
    chart in a tenth of a second: 32 of them doubled the page's build)."""
    chosen = summary.straggler.pipeline if summary.straggler else 0
    frames = [
        {
            # the dataset names run_charts.timelines gives one measured timeline and the ideal one
            "measured": coarsen(measured.filter(pl.col("rank").is_in(line.ranks))),
            "ideal": coarsen(ideal.filter(pl.col("rank").is_in(line.ranks))),
        }
        for line in summary.pipelines
    ]
    chart = run_charts.timelines(
        [("measured: the pipeline picked above", frames[chosen]["measured"])],
        frames[chosen]["ideal"],
        len(summary.pipelines[chosen].ranks),
        "its ideal timeline",
    ).chart
    slowest = {chosen: " (slowest)"} if summary.straggler else {}
    options = [
        (
            f"pipeline {j}: ranks {', '.join(map(str, line.ranks))}{slowest.get(j, '')}",
            Plot(chart, frames[j]),
        )
        for j, line in enumerate(summary.pipelines)
    ]
    caption += (
        f" The job has {len(summary.ranks)} ranks in {len(options)} pipelines, more than the "
        f"{TIMELINE_RANKS_MAX} ranks drawn at once: pick a pipeline above the chart to draw its timeline (the "
        "ranks taken to share a clock) above its own ideal one."
    )
    return Choice("timeline", "pipeline", options, chosen, caption, stem)
