"""`python -m analysis analyze DIR`: cells, gaps, per-rank parts and summary.json for one run.

Writes DIR/analysis/{summary.json, cells.parquet, gaps.parquet, ranks.parquet} into a temporary
directory first and renames it into place, so a crash never leaves a half-written analysis/ behind.
Keys of summary.json are those of DESIGN.md section 3, plus:
  median_step        the ProfilerStep number whose time is the (lower) median; ranks and waterfall
                     are that step's, so they close exactly on step_time_ms
  clock              per-rank clock offsets applied (analysis.timeline.clock), or null when all ranks share
                     one clock (no transfer ends before it began)
  inferred_cells     how many cells came from analysis.cells.inferred rather than PP: labels
ranks.parquet holds every analysed step's parts (ms), one row per rank and step.
cells.parquet has DESIGN.md's columns plus small_gemm_ns: a compute cell's busy time (its span in the
step window less the idle gaps inside it) beyond its reference duration; null for transfer cells and
without calibration. A rank's small_gemm_ms is the sum over its cells (analysis.attribution.parts).
Where the traces carry memory events (analysis.traces.memory): memory.parquet, the executor's stash samples
(rank, step, t_ns, microbatches, bytes), and memory_peaks.parquet, per (rank, step, source) the most
bytes held; ranks[].peak_activation_bytes is the median step's from the best source.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from analysis.attribution.parts import BARS
from analysis.errors import InputError
from analysis.pipeline import Analysis, analyze_run, read_run
from analysis.traces.load import read_run_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="DIR", help="run directory with rank*.json[.gz] traces")
    parser.add_argument("--schedule", help="schedule name when DIR has no run.json (must match the traces)")
    parser.add_argument("--m", type=int, help="microbatches per step when DIR has no run.json (must match)")


def run(args: argparse.Namespace) -> int:
    print(table(analyze_dir(args.run_dir, schedule=args.schedule, m=args.m).summary))
    caveat = oversubscription(read_run_config(args.run_dir / "run.json"))
    if caveat:
        print(f"  note: {caveat}")
    return 0


def oversubscription(config: dict | None) -> str | None:
    """Why CPU figures read against the formula mislead, when the run had more rank threads than cores
    (the default P=4 on a 2-core machine): ranks take turns, and the wait for a core is measured as
    slower compute and longer bubbles. None when it had enough cores, ran on GPUs, or did not say."""
    config = config or {}
    p, threads, nodes = config.get("p"), config.get("threads_per_rank"), config.get("nodes") or 1
    cores = (config.get("host") or {}).get("cpu_count")
    if config.get("device") != "cpu" or not (isinstance(p, int) and isinstance(threads, int) and isinstance(cores, int)):
        return None
    if p * threads <= cores * nodes:
        return None
    return (f"{p} ranks x {threads} thread(s) on {cores * nodes} cores: ranks take turns, so small_gemm and the "
            f"bubble include waiting for a core; use P <= {cores * nodes} to compare with the formula")


def analyze_dir(run_dir: Path, schedule: str | None = None, m: int | None = None) -> Analysis:
    """Analyse one run directory and write its analysis/ beside the traces (the `analyze` command's work)."""
    run_dir = Path(run_dir).resolve()
    result = analyze_run(read_run(run_dir), schedule=schedule, m=m)
    write(run_dir / "analysis", result)
    return result


def write(target: Path, result: Analysis) -> None:
    """The files into a fresh temporary sibling, then one rename over the old directory."""
    try:
        staging = Path(tempfile.mkdtemp(prefix=".analysis.", dir=target.parent))
    except OSError as error:
        raise InputError(target.parent, f"cannot write the analysis: {error.strerror}") from None
    try:
        (staging / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
        result.cells.write_parquet(staging / "cells.parquet")
        result.gaps.write_parquet(staging / "gaps.parquet")
        result.ranks.write_parquet(staging / "ranks.parquet")
        if result.memory is not None and not result.memory.peaks.is_empty():
            result.memory.stash.write_parquet(staging / "memory.parquet")
            result.memory.peaks.write_parquet(staging / "memory_peaks.parquet")
        if target.exists():
            old = target.with_name(f".analysis.old.{os.getpid()}")
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old)
        else:
            os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def table(summary: dict) -> str:
    """Formula vs measured bubble, then the waterfall bars with their share of the step."""
    step = summary["step_time_ms"]
    lines = [
        f"{summary['schedule']} p={summary['p']} m={summary['m']} v={summary['v']} "
        f"({summary['device']}, {summary['steps_analyzed']} steps)",
        f"  step time      {step:10.3f} ms   simulated {summary['simulated_step_time_ms']:.3f} ms",
        f"  bubble         formula {summary['bubble_formula']:.3f}   measured {summary['bubble_measured']:.3f}",
        "  waterfall",
    ]
    for bar in BARS:
        value = summary["waterfall_ms"][bar]
        shown = "   unknown (no calibration)" if value is None else f"{value:10.3f} ms  {value / step:6.1%}"
        lines.append(f"    {bar:16s}{shown}")
    return "\n".join(lines)
