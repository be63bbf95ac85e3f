"""`python -m analysis merge RUN`: one Perfetto-loadable trace of every rank (analysis.merge)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis.errors import InputError
from analysis.merge.merged import merge, read_ranks, write_json_gz
from analysis.pipeline import analysis_of
from analysis.results import Analysis


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        metavar="RUN",
        type=Path,
        help="run directory (rank*.json.gz), a folder of traces, or one trace",
    )
    parser.add_argument(
        "--steps", type=_int_list, help="profiler steps to keep, e.g. 3,4 or 3-5 (default: all)"
    )
    parser.add_argument("--ranks", type=_int_list, help="ranks to keep, e.g. 0,1 or 0-3 (default: all)")
    parser.add_argument("--out", type=Path, help="output file (default: RUN/merged.json.gz)")
    parser.add_argument("--no-align", action="store_true", help="keep each rank's own clock")


def run(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    traces = read_ranks(args.source, args.ranks)
    out = args.out or (args.source if args.source.is_dir() else args.source.parent) / "merged.json.gz"
    merged = merge(traces, args.steps, _analysis(args.source), align=not args.no_align)
    size = write_json_gz(out, merged)
    notes = merged["pipelineMerge"]
    print(
        f"{out}: {len(traces)} rank(s), {notes['events']} events, {size / 1e6:.1f} MB of JSON, "
        f"{time.perf_counter() - began:.2f} s; {notes['limited']}"
    )
    for line in notes["notes"]:
        print(f"note: {line}", file=sys.stderr)
    return 0


def _analysis(source: Path) -> Analysis | None:
    """The run's analysis (made first where it is missing); None for one trace file or traces that are
    not a pipeline the analysis can read."""
    if not source.is_dir():
        return None
    try:
        return analysis_of(source)
    except InputError as error:
        print(f"note: merged without the analysis: {error}", file=sys.stderr)
        return None


def _int_list(text: str) -> tuple[int, ...]:
    """ "3,4" or "3-5" or "1,4-6" -> the integers, in order."""
    values: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            values.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r} (e.g. 3,4 or 3-5)") from None
    return tuple(values)
