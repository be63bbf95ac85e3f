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
    from analysis.schema import StepReplay, Summary

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
    print(table(summary))
    if summary.flags:
        print(f"  flags: {', '.join(summary.flags)}")
    for note in summary.notes:
        print(f"  note: {note}")
    return 0


def table(summary: Summary) -> str:
    """Formula vs measured bubble, then the waterfall terms with their share of the step."""
    from analysis.schema import WATERFALL_TERMS

    step = summary.step_time_ms
    lines = [
        f"{summary.schedule} p={summary.p} m={summary.m} v={summary.v} "
        f"({summary.device}, {summary.steps_analyzed} steps)",
        f"  step (profiled) {step:9.3f} ms   unprofiled {_ms(summary.step_time_unprofiled_ms)}   "
        f"model prediction {summary.simulated_step_time_ms:.3f} ms",
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
    for term in WATERFALL_TERMS:
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
