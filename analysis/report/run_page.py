"""One run's page: key figures, measured timeline over the simulated ideal, waterfall, per-rank parts,
memory, thresholds and the merged Perfetto trace."""

from __future__ import annotations

import html
from dataclasses import asdict, replace
from pathlib import Path

import polars as pl

from analysis.pipelines import to_local
from analysis.report import charts, hta_section
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
from analysis.report.pages import Column, Figure, number, table
from analysis.report.runs import Run
from analysis.results import Analysis
from analysis.schema import RANK_PARTS, Summary, rule_meanings
from analysis.traces.memory import Memory

CONFIG_FIELDS = (
    "schedule",
    "engine",
    "device",
    "p",
    "m",
    "v",
    "preset",
    "model",  # --model's entry point; null (not shown) for the preset's Linear+GELU stack
    "dims",
    "dtype",
    "backend",
    "threads_per_rank",
    "host",
    "git_revision",
    "versions",
)
PART_MEANINGS = {
    "compute": "useful compute at reference (full-batch) efficiency; measured compute where no reference exists",
    "small_gemm": "the same work timed alone at the microbatch's size, beyond its full-batch share: smaller GEMMs "
    "run less efficiently (— = no isolated calibration)",
    "slowdown": "busy time beyond the work timed alone: what running inside the pipeline adds (contention, "
    "interference, profiler cost, noise; may be negative; — = no isolated calibration)",
    "bubble": "idle because the producer had not produced yet: schedule geometry plus delays from upstream",
    "p2p_wait": "idle after the peer had already sent: transfer and latency",
    "dp_sync": "idle in data-parallel collectives (the gradient sync) that compute did not hide; of it, "
    "dp_skew is the wait for a slower replica",
    "launch_overhead": "device idle while the host had not yet issued the next work (CPU: host time inside "
    "and between actions)",
    "other": "work outside the schedule that the trace shows (the optimizer step, data loading), and the "
    "stretch by which this rank's step is shorter than the longest",
}
IDEAL_CAPTION = (
    "Ideal: the executed schedule replayed at reference durations (each stage's calibrated F and B per "
    "microbatch; without calibration, the step's own cell durations), no host gaps, no p2p latency: the "
    "waterfall's rung ideal + formula_bubble + imbalance."
)


def figures_html(summary: Summary) -> str:
    """The headline numbers, each with its meaning in a tooltip."""
    p, m, v = summary.p, summary.m, summary.v
    items = [
        (
            "step (profiled)",
            summary.step_time_ms,
            " ms",
            "measured: the median of the analysed profiled steps",
        ),
        (
            "step (unprofiled)",
            "—" if summary.step_time_unprofiled_ms is None else summary.step_time_unprofiled_ms,
            "" if summary.step_time_unprofiled_ms is None else " ms",
            "the median of the steps the runner timed without the profiler (— = not recorded: traces from "
            "elsewhere)",
        ),
        (
            "model prediction",
            summary.simulated_step_time_ms,
            " ms",
            "the step model (per stage and kind: median busy time and host gap; per hop direction: median "
            "latency; the median time after the last action) replayed on the schedule; its difference from "
            "the profiled step is the waterfall's residual",
        ),
        (
            "bubble (formula)",
            summary.bubble_formula,
            "",
            "idle fraction of the step by the schedule's geometry alone: its executed order replayed at unit "
            f"times (F 1, B 2, I and W 1); (p-1)/(v*m+p-1) = ({p}-1)/({v}*{m}+{p}-1) for gpipe, 1f1b, interleaved",
        ),
        (
            "bubble (busy-time)",
            summary.bubble_measured,
            "",
            "1 - sum over ranks of busy time / (p * step time): the fraction of the step devices were not computing",
        ),
        (
            "bubble (seed)",
            "—" if summary.bubble_seed is None else summary.bubble_seed,
            "",
            "the seed experiment's 1 - m*t_slot/step, t_slot timed alone: 1 - the ranks' work timed in "
            "isolation (compute + small_gemm) / (p * step time); slowdown counts as bubble here (— = no "
            "isolated calibration)",
        ),
        ("steps analysed", summary.steps_analyzed, "", "profiled steps the figures are taken over"),
        (
            "profiled steps spread",
            f"{summary.noise.profiled_spread:.0%}",
            "",
            "(max - min) / median of the analysed steps' times; over "
            f"{summary.rules.noisy_spread_max:.0%} (this one's or the unprofiled steps') flags the run noisy",
        ),
    ]
    parts = []
    for label, value, unit, meaning in items:
        shown = f"{value:.3f}{unit}" if isinstance(value, float) else f"{value}{unit}"
        parts.append(
            f'<div class="figure" title="{html.escape(meaning)}"><b>{html.escape(shown)}</b>'
            f"{html.escape(label)}</div>"
        )
    return f'<div class="figures">{"".join(parts)}</div>'


def config_html(run: Run) -> str:
    summary = run.summary
    shown = {
        "schedule": summary.schedule,
        "engine": summary.engine,
        "device": summary.device,
        "p": summary.p,
        "m": summary.m,
        "v": summary.v,
        **run.config,
    }
    rows = [[key, shown[key]] for key in CONFIG_FIELDS if shown.get(key) not in (None, "", {})]
    columns = [
        Column("setting", "as recorded in run.json (or the summary)", text=True),
        Column("value", "the setting's value", show=_plain, text=True),
    ]
    return table(columns, rows)


def _plain(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return " x ".join(map(str, value))
    return str(value)


def timeline_figure(run: Run) -> Figure:
    """Measured cells and gaps of the median step above the ideal timeline of the same step."""
    analysis, step = run.analysis, run.summary.median_step
    origin = step_origin(analysis.cells, analysis.gaps, step)
    measured = timeline_frame(analysis.cells, analysis.gaps, step, origin)
    ranks = measured["rank"].n_unique()
    shown_measured = coarsen(measured)
    binned = (
        f" With {measured.height} rows the timeline is drawn from {shown_measured.height} time bins, each "
        "coloured by the kind that filled most of it (hover: how many cells)."
        if shown_measured is not measured
        else ""
    )
    caption = (
        f"Measured: step {step} (the step of median length), {measured.height} cells and gaps; each rank's row "
        "has three tracks: compute cells (F/B/I/W), p2p cells (SEND/RECV spans, including blocking waits) and "
        f"the idle gaps by class. {run.summary.inferred_cells} of the run's cells were inferred from the op "
        f"stream rather than read from PP: labels. {IDEAL_CAPTION} Hover a cell for its action, microbatch and "
        f"duration.{binned}"
    )
    ideal = ideal_frame(analysis.ideal, origin)
    summary = run.summary
    if summary.dp == 1:
        return Figure(
            "timeline",
            charts.timelines([("measured", shown_measured)], coarsen(ideal), ranks, "ideal timeline"),
            caption,
            "canvas",
        )
    slowest = summary.pipelines[summary.straggler.pipeline].ranks
    per_pipeline = [
        (
            f"measured, pipeline {j} (ranks {', '.join(map(str, line.ranks))})",
            pl.col("rank").is_in(line.ranks),
        )
        for j, line in enumerate(summary.pipelines)
    ]
    measured_plots = [(title, coarsen(measured.filter(inside))) for title, inside in per_pipeline]
    ideal = coarsen(ideal.filter(pl.col("rank").is_in(slowest)))
    caption += (
        f" The job's {len(per_pipeline)} pipelines are drawn one above another on one time axis (the ranks "
        "taken to share a clock); the ideal timeline is the slowest pipeline's."
    )
    title = f"ideal timeline, pipeline {summary.straggler.pipeline}"
    return Figure("timeline", charts.timelines(measured_plots, ideal, len(slowest), title), caption, "canvas")


def waterfall_figure(summary: Summary) -> Figure:
    deviation = largest_deviation(summary)
    largest = f" The largest deviation is {deviation[0]} ({deviation[1]:.3f} ms)." if deviation else ""
    caption = (
        "Where the step time went, in ms: ideal (the work at reference efficiency, evenly split) plus the "
        "formula bubble is the formula's step time; imbalance (unequal stages), small_gemm (a microbatch's "
        "work timed alone, beyond its full-batch share), slowdown (busy time beyond that isolated work), "
        "launch_overhead (host gaps), p2p_wait (hop latencies) and other (the step after its last action: "
        "the optimizer) take it to the model's step time; the residual, what the model of per-(stage, kind) "
        "medians does not explain, to the measured step time, the last bar. Each term is the difference "
        f"between two rungs of a ladder of replays of the schedule.{largest}"
    )
    if summary.waterfall_ms.small_gemm is None:
        caption += (
            " This run has no isolated calibration: small_gemm and slowdown are unknown (no bar), their time "
            "is in imbalance, and the reference is each stage's measured median busy time."
        )
    return Figure("waterfall", charts.waterfall(waterfall_frame(summary)), caption)


def parts_html(summary: Summary) -> str:
    """Per-rank table: each rank's parts sum to its pipeline's step time (the closure column shows it)."""
    columns = [
        Column("rank", "global rank (one process)"),
        Column("pipeline", "the pipeline (data-parallel replica) the rank belongs to"),
        Column("stages", "global stage indices on this rank", show=_plain, text=True),
    ]
    columns += [Column(f"{part} (ms)", PART_MEANINGS[part], show=number(3)) for part in RANK_PARTS]
    columns += [
        Column("sum (ms)", "sum of the parts: equals the step time when the split closes", show=number(3)),
        Column("busy (ms)", "time the rank's work ran: compute + small_gemm + slowdown", show=number(3)),
        Column(
            "cpu_contention (ms)",
            "not a part: the thread's run-queue delay (runnable, waiting for a core) across compute cells, "
            "on their busy share; it lengthens busy time, mostly seen as slowdown (— = no run-queue counter)",
            show=number(3),
        ),
        Column(
            "dp_skew (ms)",
            "of dp_sync: the wait for a slower replica (each collective's latest start in the DP group less "
            "this rank's, at most its time)",
            show=number(3),
        ),
        Column("peak activations (MiB)", "largest live activation memory held for backward", show=number(2)),
    ]
    rows = []
    for entry in summary.ranks:
        parts = [entry.part_ms(part) for part in RANK_PARTS]
        peak = entry.peak_activation_bytes
        rows.append(
            [
                entry.rank,
                entry.pipeline,
                entry.stage_ids,
                *parts,
                sum(x or 0.0 for x in parts),
                entry.busy_ms,
                entry.cpu_contention_ms,
                entry.dp_skew_ms,
                None if peak is None else peak / 2**20,
            ]
        )
    return table(columns, rows)


def memory_figure(summary: Summary) -> Figure | None:
    ranks = [entry for entry in summary.ranks if entry.peak_activation_bytes is not None]
    if not ranks:
        return None
    frame = pl.DataFrame(
        {
            "rank": [r.rank for r in ranks],
            "stage_ids": [_plain(r.stage_ids) for r in ranks],
            "peak_mib": [r.peak_activation_bytes / 2**20 for r in ranks],
        }
    )
    caption = (
        "Peak activation memory per rank in MiB: the most bytes held for backward at once (GPipe holds all m "
        "microbatches' activations, 1F1B at most p - s on stage s)."
    )
    return Figure("memory", charts.memory_per_rank(frame), caption)


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
    peaks = peaks_frame(measured, theory_peaks(analysis.schedule))
    over_time = theory_in_flight(analysis.schedule, analysis.ideal, origin)
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
        charts.in_flight(thinned(measured), over_time, peaks, "theory: the ideal timeline"),
        f"Step {step}: microbatches in flight per rank (activations held for backward), measured from "
        f"{source}; below, the schedule's own count (runners.schedules.in_flight) over the ideal timeline "
        "of the same schedule; dashed: the schedule's peak (GPipe: m on every stage; 1F1B: p - s on "
        f"stage s).{which}",
    )
    return table(columns, [list(row) for row in peaks.iter_rows()]) + figure.html(), figure


def rules_html(summary: Summary) -> str:
    columns = [
        Column("threshold", "name of the rule's parameter (summary.json rules)", text=True),
        Column(
            "value", "the value this analysis used, in the unit its meaning names", show=_plain, text=True
        ),
        Column("meaning", "what the threshold decides", text=True),
    ]
    meanings = rule_meanings()
    return table(columns, [[name, value, meanings[name]] for name, value in asdict(summary.rules).items()])


def merged_html(merged_href: str | None, run_dir: Path) -> str:
    if merged_href is None:
        return (
            f"<p>No merged trace yet: <code>make merge RUN={html.escape(str(run_dir))}</code> (in the "
            "project's folder; or its <code>.venv/bin/python -m analysis merge</code> with that folder) "
            "writes <code>merged.json.gz</code>, all ranks in one Perfetto-loadable trace.</p>"
        )
    return (
        f'<p><a href="{html.escape(merged_href)}">merged.json.gz</a>: all ranks in one trace, with send-to-recv '
        "arrows. To look at it, open https://ui.perfetto.dev, choose <i>Open trace file</i> and pick this file "
        "(it is read in your browser, not uploaded).</p>"
    )


def body(run: Run, merged_href: str | None) -> tuple[str, list[Figure]]:
    """The run page's HTML body and the figures it places."""
    summary = run.summary
    timeline = timeline_figure(run)
    waterfall = waterfall_figure(summary)
    parts = Figure(
        "parts",
        charts.rank_parts(rank_parts_frame(summary)),
        "Each rank's step split into its parts in ms (they sum to the step time): compute at full-batch "
        "efficiency, small_gemm and slowdown (no bar where unknown), bubble, p2p wait, launch overhead, other "
        "(work outside the schedule).",
    )
    memory = memory_figure(summary)
    in_flight_html, in_flight = in_flight_section(run)
    sections = [
        '<p><a href="../index.html">all runs</a></p>',
        f"<h1>{html.escape(run.run_id)}</h1>",
        figures_html(summary),
        *(f"<p>Note: {html.escape(note)}.</p>" for note in summary.notes),
        "<h2>Timeline</h2>",
        timeline.html(),
        "<h2>Waterfall: from the formula to the measurement</h2>",
        waterfall.html(),
        "<h2>Per rank</h2>",
        parts_html(summary),
        parts.html(),
        "<h2>Activation memory</h2>",
        in_flight_html,
        memory.html() if memory else "<p>This run recorded no activation bytes.</p>",
        hta_section.section_html(run),
        "<h2>Thresholds used</h2>",
        rules_html(summary),
        "<h2>Merged trace</h2>",
        merged_html(merged_href, run.path),
        "<h2>Configuration</h2>",
        config_html(run),
    ]
    return "\n".join(sections), [f for f in (timeline, waterfall, parts, in_flight, memory) if f is not None]
