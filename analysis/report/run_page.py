"""One run's page: key figures, measured timeline over the ideal one, waterfall, per-rank parts,
memory, thresholds and the merged Perfetto trace."""

from __future__ import annotations

import html
from dataclasses import replace

import polars as pl

from analysis.report import advice_section, hta_section, job_view, run_charts, verdict_section, whatif_section
from analysis.report.frames import (
    coarsen,
    ideal_frame,
    largest_deviation,
    rank_parts_frame,
    step_origin,
    timeline_frame,
    waterfall_frame,
)
from analysis.report.inflight import (
    measured_in_flight,
    peaks_frame,
    stash_in_flight,
    theory_in_flight,
    theory_peaks,
    thinned,
)
from analysis.report.pages import Choice, Column, Figure, table
from analysis.report.run_tables import (
    config_html,
    figures_html,
    merged_html,
    parts_html,
    plain_text,
    rules_html,
)
from analysis.report.runs import Run
from analysis.results import Analysis
from analysis.schema import Summary
from analysis.traces.layout import to_local
from analysis.traces.memory import Memory

IDEAL_CAPTION = (
    "Ideal: the executed schedule replayed at each stage's full-batch durations, with no host time or "
    "transfers: the waterfall's rung ideal + fill_drain + imbalance (docs/numbers.md#ideal-timeline)."
)


def _path_shares(summary: Summary) -> str:
    """The critical path's largest parts, in words."""
    shares = summary.critical_path[:4]
    return (
        ", ".join(
            f"{s.part}{'' if s.stage is None else f' of stage {s.stage}'} {s.ms:.1f} ms" for s in shares
        )
        or "no path"
    )


def timeline_figure(run: Run, stem: str) -> Figure | Choice:
    """Measured cells and gaps of the median step above the ideal timeline of the same step: every
    pipeline's at once, or in a job of many ranks the one the reader picks (job_view)."""
    analysis, step = run.analysis, run.summary.median_step
    origin = step_origin(analysis.cells, analysis.gaps, step)
    measured = timeline_frame(analysis.cells, analysis.gaps, step, origin, analysis.critical)
    ranks = measured["rank"].n_unique()
    shown_measured = coarsen(measured)
    binned = (
        f" With {measured.height} rows the timeline is drawn from {shown_measured.height} time bins, each "
        "coloured by the kind that filled most of it (hover: how many cells)."
        if shown_measured is not measured
        else ""
    )
    caption = (
        f"Measured: step {step} (the step of median length), {measured.height} cells, gaps and critical-path "
        "segments; each rank's row has four tracks: compute cells (F/B/I/W), p2p cells (SEND/RECV spans, "
        "including blocking waits), the idle gaps by class, and in red the step's critical path where it runs "
        f"on that rank (from its own replay: {_path_shares(run.summary)}). "
        f"{run.summary.inferred_cells} of the run's cells were inferred from the op "
        f"stream rather than read from PP: labels. {IDEAL_CAPTION} Hover a cell for its action, microbatch and "
        f"duration.{binned}"
    )
    ideal = ideal_frame(analysis.ideal, origin)
    summary = run.summary
    if summary.dp == 1:
        return Figure(
            "timeline",
            run_charts.timelines([("measured", shown_measured)], coarsen(ideal), ranks, "ideal timeline"),
            caption,
            "canvas",
        )
    if job_view.summarised(summary):
        return job_view.timeline_choice(summary, measured, ideal, caption, stem)
    slowest = summary.pipelines[summary.straggler.pipeline].ranks
    measured_plots = [
        (
            f"measured, pipeline {j} (ranks {', '.join(map(str, line.ranks))})",
            coarsen(measured.filter(pl.col("rank").is_in(line.ranks))),
        )
        for j, line in enumerate(summary.pipelines)
    ]
    ideal = coarsen(ideal.filter(pl.col("rank").is_in(slowest)))
    caption += (
        f" The job's {len(measured_plots)} pipelines are drawn one above another on one time axis (the ranks "
        "taken to share a clock); the ideal timeline is the slowest pipeline's."
    )
    title = f"ideal timeline, pipeline {summary.straggler.pipeline}"
    return Figure(
        "timeline", run_charts.timelines(measured_plots, ideal, len(slowest), title), caption, "canvas"
    )


def waterfall_figure(summary: Summary) -> Figure:
    deviation = largest_deviation(summary)
    largest = f" The largest deviation is {deviation[0]} ({deviation[1]:.3f} ms)." if deviation else ""
    caption = (
        "From the formula's step (ideal + fill_drain) to the measured one, each term a replay of the typical "
        f"step with one more effect (docs/numbers.md#waterfall).{largest}"
    )
    if summary.waterfall_ms.small_batches is None:
        caption += " No isolated calibration: small_batches and interference are unknown, their time is in imbalance."
    return Figure("waterfall", run_charts.waterfall(waterfall_frame(summary)), caption)


def memory_figure(summary: Summary) -> Figure | None:
    ranks = [entry for entry in summary.ranks if entry.peak_activation_bytes is not None]
    if not ranks:
        return None
    frame = pl.DataFrame(
        {
            "rank": [r.rank for r in ranks],
            "stage_ids": [plain_text(r.stage_ids) for r in ranks],
            "peak_mib": [r.peak_activation_bytes / 2**20 for r in ranks],
        }
    )
    caption = (
        "Peak activation memory per rank in MiB: the most bytes held for backward at once (GPipe holds all m "
        "microbatches' activations, 1F1B at most p - s on stage s)."
    )
    return Figure("memory", run_charts.memory_per_rank(frame), caption)


def _measured_in_flight(analysis: Analysis, step: int, origin: int) -> tuple[pl.DataFrame, str]:
    """The executor's own stash counter where the run recorded one, else the count from the cells."""
    memory = analysis.memory
    if memory is not None and not memory.stash.filter(pl.col("step") == step).is_empty():
        return stash_in_flight(
            memory.stash, step
        ), "the executor's stash counter (microbatches it held for backward)"
    return (
        measured_in_flight(analysis.cells, step, origin),
        "the cells (+1 at a forward's end, -1 at its freeing backward's)",
    )


def _slowest_pipeline(run: Run) -> tuple[Analysis, str]:
    """The run's analysis, or in a job of several pipelines the slowest one's on its local ranks (the
    schedule's own), with a note saying which."""
    summary, analysis = run.summary, run.analysis
    if summary.straggler is None:
        return analysis, ""
    ranks = summary.pipelines[summary.straggler.pipeline].ranks
    memory = analysis.memory
    if memory is not None:
        memory = Memory(to_local(memory.stash, ranks), to_local(memory.peaks, ranks))
    local = {table: to_local(getattr(analysis, table), ranks) for table in ("cells", "gaps", "ideal")}
    note = (
        f" The slowest pipeline, {summary.straggler.pipeline}: its ranks {', '.join(map(str, ranks))} as "
        "pipeline ranks 0..p-1."
    )
    return replace(analysis, memory=memory, **local), note


def in_flight_section(run: Run) -> tuple[str, Figure]:
    """Measured in-flight microbatches over the step against the schedule's count on the ideal timeline."""
    (analysis, which), step = _slowest_pipeline(run), run.summary.median_step
    origin = step_origin(analysis.cells, analysis.gaps, step)
    measured, source = _measured_in_flight(analysis, step, origin)
    peaks = peaks_frame(measured, theory_peaks(analysis.ideal))
    over_time = theory_in_flight(analysis.ideal, origin)
    columns = [
        Column("rank", "pipeline rank"),
        Column(
            "measured peak (microbatches)",
            "most microbatches whose forward had ended and freeing backward had not",
        ),
        Column("theory peak (microbatches)", "the schedule's own count (runners.schedules.in_flight)"),
    ]
    figure = Figure(
        "in-flight",
        run_charts.in_flight(thinned(measured), over_time, peaks, "theory: the ideal timeline"),
        f"Step {step}: microbatches in flight per rank (activations held for backward), measured from "
        f"{source}; below, the schedule's own count (runners.schedules.in_flight) over the ideal timeline "
        "of the same schedule; dashed: the schedule's peak (GPipe: m on every stage; 1F1B: p - s on "
        f"stage s).{which}",
    )
    return table(columns, [list(row) for row in peaks.iter_rows()]) + figure.html(), figure


def _per_rank(summary: Summary) -> tuple[list[str], Figure | None]:
    """The per-rank table and parts chart; in a job of many ranks the table folded away and no chart (the
    stage x pipeline heatmap draws the same parts)."""
    if job_view.summarised(summary):
        rows = f"<summary>every rank's parts ({len(summary.ranks)} rows)</summary>"
        return [f"<details>{rows}{parts_html(summary)}</details>"], None
    parts = Figure(
        "parts",
        run_charts.rank_parts(rank_parts_frame(summary)),
        "Each rank's step split into its parts in ms, which sum to the step time; small_gemm and slowdown "
        "have no bar where unknown (docs/numbers.md#parts).",
    )
    return [parts_html(summary), parts.html()], parts


def _job_summary(summary: Summary) -> tuple[list[str], Figure | None]:
    """Per-pipeline and per-stage summaries, for a job of many ranks only."""
    if not job_view.summarised(summary):
        return [], None
    frame = job_view.rank_frame(summary)
    heatmap = job_view.heatmap_figure(frame)
    return [
        "<h2>Pipelines and stages</h2>",
        job_view.slowest_html(summary, frame),
        "<h3>Per pipeline</h3>",
        job_view.pipelines_html(summary, frame),
        "<h3>Per stage</h3>",
        job_view.stages_html(frame),
        heatmap.html(),
    ], heatmap


def body(run: Run, merged_href: str | None, stem: str) -> tuple[str, list[Figure], tuple[Choice, ...]]:
    """The run page's HTML body, the figures it places and the charts the reader picks (`stem`: the page's
    file stem, which their files share)."""
    summary = run.summary
    timeline = timeline_figure(run, stem)
    job_html, heatmap = _job_summary(summary)
    waterfall = waterfall_figure(summary)
    per_rank_html, parts = _per_rank(summary)
    memory = memory_figure(summary)
    in_flight_html, in_flight = in_flight_section(run)
    advice_html, advice = advice_section.section(run)
    sections = [
        '<p><a href="../index.html">all runs</a></p>',
        f"<h1>{html.escape(run.run_id)}</h1>",
        verdict_section.section_html(summary),
        verdict_section.figures_heading(summary),
        figures_html(summary),
        *(f"<p>Note: {html.escape(note)}.</p>" for note in summary.notes),
        *job_html,
        "<h2>Timeline</h2>",
        timeline.html(),
        "<h2>Waterfall: from the formula to the measurement</h2>",
        waterfall.html(),
        "<h2>Per rank</h2>",
        *per_rank_html,
        whatif_section.section_html(summary),
        "<h2>Activation memory</h2>",
        in_flight_html,
        memory.html() if memory else "<p>This run recorded no activation bytes.</p>",
        advice_html,
        hta_section.section_html(run),
        "<h2>Thresholds used</h2>",
        rules_html(summary),
        "<h2>Merged trace</h2>",
        merged_html(merged_href, run.path),
        "<h2>Configuration</h2>",
        config_html(run),
    ]
    figures = [timeline, heatmap, waterfall, parts, in_flight, memory, advice]
    return (
        "\n".join(sections),
        [f for f in figures if isinstance(f, Figure)],
        tuple(f for f in figures if isinstance(f, Choice)),
    )
