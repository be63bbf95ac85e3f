"""`python -m analysis advise RUN [--memory-mb X] [--schedules ...] [--ms ...] [--vs ...]`: which schedule,
m and v to run at the run's p, predicted from the run (analysis.attribution.advice).

Prints the candidates best first and writes RUN/advice.json: {ranked, caveats, memory_limit_bytes,
source, candidates: [{engine, schedule, m, v, step_time_ms, step_time_low_ms, step_time_high_ms,
bubble_formula, peak_activation_bytes, fits, extrapolated, caveats, assumptions}], assumptions}. Each
candidate's row names the assumptions its figures rest on (what each means below the table). Without
run.json, or without its calibration or rows, it advises from the trace alone (analysis.attribution.from_trace).
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from analysis import results
from analysis.attribution.advice import admitted, advise
from analysis.cli.predict import check_limit, legend, microbatch_counts
from analysis.errors import InputError, LimitExceeded, TraceWarning
from analysis.job.run_dir import analysis_of
from analysis.schema import MIB, Advice
from analysis.traces import limits
from analysis.traces.run_config import read_run_config
from runners.arguments import decimal
from runners.presets import ADVISED_VS, CALIBRATED_MS
from runners.schedules import SCHEDULES


def _schedules(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in SCHEDULES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown schedule(s) {unknown or text!r}; known: {', '.join(SCHEDULES)}"
        )
    return names


def _megabytes(text: str) -> float:
    """MiB in decimals (`512`, `0.5`), > 0: not `inf` (an OverflowError once made bytes), `1e20`, `nan`."""
    if not decimal(text) > 0:
        raise argparse.ArgumentTypeError(f"not a positive number of MiB: {text!r}")
    return decimal(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="an analysed run directory")
    parser.add_argument(
        "--memory-mb", type=_megabytes, help="activation memory per rank a candidate may hold, MiB"
    )
    parser.add_argument(
        "--schedules", type=_schedules, default=list(SCHEDULES), help="comma-separated (default: %(default)s)"
    )
    parser.add_argument(
        "--ms",
        type=microbatch_counts,
        default=list(CALIBRATED_MS),
        help="microbatch counts (default: %(default)s)",
    )
    parser.add_argument(
        "--vs",
        type=microbatch_counts,
        default=list(ADVISED_VS),
        help="chunks per rank where admitted (default: %(default)s)",
    )


def advice(
    run_dir: Path, schedules: list[str], ms: list[int], vs: list[int], memory_mb: float | None
) -> Advice:
    """The run's candidates predicted, best first; a candidate that cannot be predicted is a warning."""
    path = Path(run_dir) / "run.json"
    check_limit(ms)
    if vs[-1] > limits.current().stages:  # each v's schedules are built: v=10**8 ran for minutes
        raise LimitExceeded("--vs", f"v={vs[-1]:,} is past {limits.current().describe('stages')}")
    config = read_run_config(path)
    analysis = analysis_of(run_dir)
    requests = admitted(analysis.summary.engine, analysis.schedule.p, config or {}, schedules, ms, vs)
    limit = None if memory_mb is None else round(memory_mb * MIB)
    found, skipped = advise(analysis, config, requests, limit, path)
    for (engine, name, m, v), why in skipped.items():
        warnings.warn(f"{engine} {name} m={m} v={v} skipped: {why}", TraceWarning, stacklevel=2)
    if not found.candidates:
        raise InputError(path, "no candidate can be predicted from this run")
    return found


def run(args: argparse.Namespace) -> int:
    found = advice(args.run_dir, args.schedules, args.ms, args.vs, args.memory_mb)
    s = found.source
    engine = s["engine"] or "an unnamed engine"
    print(
        f"from {engine}: {s['schedule']} p={s['p']} m={s['m']} v={s['v']}: {s['step_time_ms']:.3f} ms a step"
    )
    head = f"  {'#':>3}  {'engine':<6}  {'schedule':<10}  {'m':>3}  {'v':>2}  {'step ms':>9}  {'interval ms':>17}"
    print(f"{head}  {'bubble':>6}  {'peak MiB':>8}  fits  assumes")
    for i, c in enumerate(found.candidates, 1):
        peak = "-" if c.peak_activation_bytes is None else f"{c.peak_activation_bytes / MIB:.1f}"
        interval = f"{c.step_time_low_ms:.1f} - {c.step_time_high_ms:.1f}"
        engine = c.engine or "-"
        print(
            f"  {i:>3}  {engine:<6}  {c.schedule:<10}  {c.m:>3}  {c.v:>2}  {c.step_time_ms:>9.1f}  {interval:>17}"
            f"  {c.bubble_formula:>6.3f}  {peak:>8}  {'yes' if c.fits else 'no':<4}  {', '.join(c.assumptions) or '-'}"
        )
    for line in legend([*found.assumptions, *(name for c in found.candidates for name in c.assumptions)]):
        print(line)
    for why in sorted({why for c in found.candidates for why in c.caveats}):
        print(f"  caveat: {why}")
    if not found.ranked:
        print("  not ranked: " + "; ".join(found.caveats))
    print(f"written: {results.write_advice(args.run_dir, found)}")
    return 0
