"""The run page's tables and headline figures: the figures with their meanings, the per-rank parts,
the thresholds, the configuration and the merged trace's line (analysis.report.run_page places them)."""

from __future__ import annotations

import html
from dataclasses import asdict
from pathlib import Path

from analysis.report.pages import Column, number, table
from analysis.report.runs import Run
from analysis.schema import RANK_PARTS, Summary, rule_meanings
from analysis.vocabulary import Part

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
    Part.COMPUTE: "useful compute at reference (full-batch) efficiency; measured compute where no reference exists",
    Part.SMALL_GEMM: "the same work timed alone at the microbatch's size, beyond its full-batch share: smaller GEMMs "
    "run less efficiently (— = no isolated calibration)",
    Part.SLOWDOWN: "busy time beyond the work timed alone: what running inside the pipeline adds (contention, "
    "interference, profiler cost, noise; may be negative; — = no isolated calibration)",
    Part.BUBBLE: "idle because the producer had not produced yet: schedule geometry plus delays from upstream",
    Part.P2P_WAIT: "idle after the peer had already sent: transfer and latency",
    Part.DP_SYNC: "idle in data-parallel collectives (the gradient sync) that compute did not hide; of it, "
    "dp_skew is the wait for a slower replica",
    Part.LAUNCH_OVERHEAD: "device idle while the host had not yet issued the next work (CPU: host time inside "
    "and between actions)",
    Part.OTHER: "work outside the schedule that the trace shows (the optimizer step, data loading), and the "
    "stretch before this rank's step opened while the longest was open (after it closed, it is drain bubble)",
}


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
            "typical step",
            summary.typical_step_ms,
            " ms",
            "the typical step (per stage and kind the mean of every input: host time, busy time, transfer; "
            "per rank the mean time after the last action) replayed on the lowered schedule; the profiled "
            "step less it is the waterfall's variability plus its residual",
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
            f"{summary.noise.profiled_spread:.0%}" if summary.steps_analyzed > 1 else "—",
            "",
            "(max - min) / median of the analysed steps' times (— = one step: no spread to measure); over "
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
        Column("value", "the setting's value", show=plain_text, text=True),
    ]
    return table(columns, rows)


def plain_text(value) -> str:
    """A setting or a stage list as text: key=value pairs, a x b dimensions."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={'—' if v is None else v}" for k, v in value.items())
    if isinstance(value, list):
        return " x ".join(map(str, value))
    return str(value)


def parts_html(summary: Summary) -> str:
    """Per-rank table: each rank's parts sum to its pipeline's step time (the sum column shows it), with
    the busy time they split and its run-queue delay; the figures read less often are folded below it so
    the table fits the page."""
    columns = [
        Column("rank", "global rank (one process)"),
        Column("stages", "global stage indices on this rank", show=plain_text, text=True),
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
    ]
    rows = []
    for entry in summary.ranks:
        parts = [entry.part_ms(part) for part in RANK_PARTS]
        rows.append(
            [
                entry.rank,
                entry.stage_ids,
                *parts,
                sum(x or 0.0 for x in parts),
                entry.busy_ms,
                entry.cpu_contention_ms,
            ]
        )
    more = [
        Column("rank", "global rank (one process)"),
        Column("pipeline", "the pipeline (data-parallel replica) the rank belongs to"),
        Column(
            "dp_skew (ms)",
            "of dp_sync: the wait for a slower replica (each collective's latest start in the DP group less "
            "this rank's, at most its time)",
            show=number(3),
        ),
        Column("peak activations (MiB)", "largest live activation memory held for backward", show=number(2)),
    ]
    more_rows = [
        [
            entry.rank,
            entry.pipeline,
            entry.dp_skew_ms,
            None if entry.peak_activation_bytes is None else entry.peak_activation_bytes / 2**20,
        ]
        for entry in summary.ranks
    ]
    return (
        table(columns, rows)
        + "<details><summary>each rank's pipeline, dp_skew and peak activations</summary>"
        + table(more, more_rows)
        + "</details>"
    )


def rules_html(summary: Summary) -> str:
    columns = [
        Column("threshold", "name of the rule's parameter (summary.json rules)", text=True),
        Column(
            "value", "the value this analysis used, in the unit its meaning names", show=plain_text, text=True
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
