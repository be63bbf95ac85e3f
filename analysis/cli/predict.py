"""`python -m analysis predict RUN --ms 1,2,4,8,16,32`: the profiled step time and the bubble at other m.

Replays the run's step model at each m (analysis.attribution.predict), prints a table beside the run's
own measured step, each row with the assumptions its figures rest on (what each means below the table),
and writes RUN/predict.json: a list of {m, step_time_ms, step_time_low_ms, step_time_high_ms,
bubble_formula, bubble_predicted, assumptions} (beside analysis/, which `analyze` replaces as a whole).
Without run.json, or without its calibration, it predicts from the trace alone (analysis.attribution.from_trace).
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from analysis import results
from analysis.attribution.predict import predict_each
from analysis.errors import InputError, LimitExceeded, TraceWarning
from analysis.job.run_dir import analysis_of
from analysis.schema import Prediction, Summary
from analysis.traces import limits
from analysis.traces.run_config import read_run_config
from analysis.vocabulary import ASSUMED, Assumption
from runners.arguments import whole_number
from runners.presets import CALIBRATED_MS


def microbatch_counts(text: str) -> list[int]:
    try:
        counts = sorted({whole_number(part.strip()) for part in text.split(",") if part.strip()})
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {error}") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"microbatch counts must be >= 1: {text!r}")
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="an analysed run directory")
    parser.add_argument(
        "--ms",
        type=microbatch_counts,
        default=list(CALIBRATED_MS),
        help="microbatch counts to predict (default: those every run calibrates, %(default)s)",
    )


def check_limit(ms: list[int]) -> None:
    """Each m is replayed: m=10**9 would fill the machine."""
    if ms[-1] > limits.current().microbatches:
        raise LimitExceeded("--ms", f"m={ms[-1]:,} is past {limits.current().describe('microbatches')}")


def predictions(run_dir: Path, ms: list[int]) -> tuple[Summary, list[Prediction]]:
    """The run's summary and its step predicted at each of `ms`."""
    path = Path(run_dir) / "run.json"
    check_limit(ms)
    config = read_run_config(path)
    analysis = analysis_of(run_dir)
    found, skipped = predict_each(analysis, config, ms, path)
    for m, why in skipped.items():
        warnings.warn(f"m={m} skipped: {why}", TraceWarning, stacklevel=2)
    if not found:
        raise InputError(path, f"none of m={','.join(map(str, ms))} can be predicted from this run")
    return analysis.summary, found


def legend(names) -> list[str]:
    """One line per assumption among `names`, in the vocabulary's order: its name and what it means."""
    named = set(names)
    return [f"  assumed {a}: {ASSUMED[a]}" for a in Assumption if str(a) in named]


def run(args: argparse.Namespace) -> int:
    summary, found = predictions(args.run_dir, args.ms)
    print(
        f"{summary.schedule} p={summary.p} v={summary.v}: measured at m={summary.m}, "
        f"{summary.step_time_ms:.3f} ms a step (the model replays it as {summary.typical_step_ms:.3f})"
    )
    print(
        f"  {'m':>4}  {'step ms':>10}  {'interval ms':>19}  {'bubble formula':>14}  {'bubble predicted':>16}"
        "  assumes"
    )
    for p in found:
        own = "   <- measured run" if p.m == summary.m else ""
        interval = f"{p.step_time_low_ms:.1f} - {p.step_time_high_ms:.1f}"
        print(
            f"  {p.m:>4}  {p.step_time_ms:>10.3f}  {interval:>19}  {p.bubble_formula:>14.3f}"
            f"  {p.bubble_predicted:>16.3f}  {', '.join(p.assumptions) or '-'}{own}"
        )
    best = min(found, key=lambda p: p.step_time_ms)
    assumes = f", assuming {', '.join(best.assumptions)}" if best.assumptions else ""
    print(f"  predicted best m: {best.m} ({best.step_time_ms:.3f} ms{assumes})")
    for line in legend(name for p in found for name in p.assumptions):
        print(line)
    print(f"written: {results.write_predictions(args.run_dir, found)}")
    return 0
