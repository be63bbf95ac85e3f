"""`python -m analysis analyze DIR`: cells, gaps, per-rank parts and summary.json for one run.

Writes DIR/analysis/ (analysis.results lists the files) and prints the formula against the measured
bubble and the waterfall, with any caveat the summary notes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.schema import Summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="DIR", help="run directory with rank*.json[.gz] traces")
    parser.add_argument("--schedule", help="schedule name when DIR has no run.json (must match the traces)")
    parser.add_argument("--m", type=int, help="microbatches per step when DIR has no run.json (must match)")


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
    lines.append(
        "  completeness residual by step: "
        + ", ".join(
            f"{r.step} {r.residual_ms / r.step_time_ms:+.1%}"
            + (
                f" (opened late {r.opened_late_ms:.1f}, ran on {r.ran_on_ms:.1f} ms)"
                if r.residual_ms > 0
                else ""
            )
            for r in summary.replayed_steps
        )
    )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f} ms"
