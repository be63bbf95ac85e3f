"""`python -m analysis analyze DIR`: cells, gaps, per-rank parts and summary.json for one run.

Writes DIR/analysis/ (analysis.results lists the files) and prints the formula against the measured
bubble and the waterfall, with any caveat the summary notes.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from runners.arguments import whole_number

if TYPE_CHECKING:
    from analysis.schema import RanksSummary, StepReplay, Summary

STEPS_LISTED = 8  # steps the residual line names one by one


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="DIR", help="run directory with rank*.json[.gz] traces")
    parser.add_argument("--schedule", help="schedule name when DIR has no run.json (must match the traces)")
    parser.add_argument(
        "--m", type=whole_number, help="microbatches per step when DIR has no run.json (must match)"
    )


def run(args: argparse.Namespace) -> int:
    from analysis.job.run_dir import analyze_dir  # (imported here: `analyze --help` needs no polars)

    summary = analyze_dir(args.run_dir, schedule=args.schedule, m=args.m).summary
    if summary.scope == "ranks":
        print(ranks_alone(summary))
        return 0
    print(answer(summary))
    print(table(summary))
    if summary.flags:
        print(f"  flags: {', '.join(summary.flags)}")
    for note in summary.notes:
        print(f"  note: {note}")
    return 0


def answer(summary: Summary) -> str:
    """The run, its trust and its verdict: what a reader needs before any figure (docs/numbers.md#verdict)."""
    trust = summary.trust
    lines = [
        f"{summary.schedule} p={summary.p} m={summary.m} v={summary.v} ({summary.device}, "
        f"{summary.steps_analyzed} steps)   trust: {trust.level}"
    ]
    lines += [f"  low trust: {reason}" for reason in trust.reasons]
    lines += [f"  {sentence}" for sentence in summary.verdict.sentences]
    if summary.verdict.findings:
        lines.append("  findings (recoverable on the critical path, largest first)")
    for finding in summary.verdict.findings:
        predicted = "" if finding.predicted_step_ms is None else f"  -> {finding.predicted_step_ms:.1f} ms"
        lines.append(f"    {finding.kind:16s}{finding.recoverable_ms:8.1f} ms  {finding.action}{predicted}")
    return "\n".join(lines)


def ranks_alone(summary: RanksSummary) -> str:
    """Some ranks of a bigger job: the trust, the verdict, each present rank's own figures and what is
    unknown without the others (docs/numbers.md#ranks-alone)."""
    formula = "unknown" if summary.bubble_formula is None else f"{summary.bubble_formula:.3f}"
    lines = [
        f"rank(s) {', '.join(map(str, summary.ranks_present))} of {summary.world_size} ({summary.device})   "
        f"trust: {summary.trust.level}",
        *(f"  low trust: {reason}" for reason in summary.trust.reasons),
        *(f"  {sentence}" for sentence in summary.verdict.sentences),
        f"  each rank alone (ms; own bubble = 1 - busy / its step; the formula's at the job's p: {formula})",
        "    rank      step      busy  own bubble  launch_overhead     other  (unmatched wait)    bubble  p2p_wait",
    ]
    lines += [
        f"    {r.rank:4d}{r.step_time_ms:10.3f}{r.busy_ms:10.3f}{r.bubble_measured:12.3f}{r.launch_overhead_ms:17.3f}"
        f"{r.other_ms:10.3f}{r.unmatched_wait_ms:18.3f}{r.bubble_ms:10.3f}{r.p2p_wait_ms:10.3f}"
        for r in summary.ranks
    ]
    lines.append("  unknown without the other ranks:")
    lines += [f"    {what}" for what in summary.unknown]
    return "\n".join(lines)


def table(summary: Summary) -> str:
    """Formula vs measured bubble, then the waterfall terms with their share of the step."""
    from analysis.vocabulary import RUNGS

    step = summary.step_time_ms
    from analysis.vocabulary import Level

    lines = [
        "figures" + ("  (low trust: see above)" if summary.trust.level != Level.HIGH else ""),
        f"  step (profiled) {step:9.3f} ms   unprofiled {_ms(summary.step_time_unprofiled_ms)}   "
        f"typical step {summary.typical_step_ms:.3f} ms",
        f"  bubble         formula {summary.bubble_formula:.3f}   busy-time {summary.bubble_measured:.3f}   "
        f"seed {'unknown' if summary.bubble_seed is None else f'{summary.bubble_seed:.3f}'}",
    ]
    if summary.straggler is not None:
        late = summary.straggler
        lines.append(
            f"  {len(summary.pipelines)} pipelines (dp={summary.dp}), the figures the slowest's: pipeline "
            f"{late.pipeline} {late.slower_ms:.3f} ms ({late.slower_fraction:.1%}) slower than the fastest; "
            f"dp_sync up to {max(r.dp_sync_ms for r in summary.ranks):.3f} ms a rank"
        )
    lines.append("  waterfall (ladder, Shapley)")
    for term in RUNGS:
        value, fair = getattr(summary.waterfall_ms, term), getattr(summary.waterfall_shapley_ms, term)
        shown = "   unknown (no calibration)" if value is None else f"{value:10.3f} ms  {value / step:6.1%}"
        if value is not None and fair != value:
            shown += f"  {fair:10.3f} ms"
        lines.append(f"    {term:16s}{shown}")
    lines.append(residual_by_step(summary.replayed_steps))
    return "\n".join(lines)


def residual_by_step(steps: list[StepReplay]) -> str:
    """Every step's completeness residual where there are few; on a long run, their median and the steps
    furthest from zero (one entry a step would bury the rest of the summary)."""

    def share(r: StepReplay) -> float:
        return r.residual_ms / r.step_time_ms

    def one(r: StepReplay) -> str:
        # the two waits no measured input explains, named beside what they may explain; where the step
        # ended in the labelled barrier they are replayed, so they explain none of it
        unreplayed = r.residual_ms > 0 and not r.step_end_barrier
        late = f" (opened late {r.opened_late_ms:.1f}, ran on {r.ran_on_ms:.1f} ms)" if unreplayed else ""
        return f"{r.step} {share(r):+.1%}{late}"

    if len(steps) <= STEPS_LISTED:
        return "  completeness residual by step: " + ", ".join(one(r) for r in steps)

    worst = sorted(steps, key=lambda r: -abs(share(r)))[:STEPS_LISTED]
    return (
        f"  completeness residual over {len(steps)} steps: median {statistics.median(map(share, steps)):+.1%}, "
        "furthest from zero: " + ", ".join(one(r) for r in worst)
    )


def _ms(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f} ms"
