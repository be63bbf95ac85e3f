"""`python -m analysis merge RUN`: one Perfetto-loadable trace of every rank (analysis.merge)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis.merge.merged import merge, read_ranks, write_json, write_json_gz


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="RUN", type=Path, help="run directory (rank*.json.gz), a folder of traces, or one trace")
    parser.add_argument("--steps", type=_int_list, help="profiler steps to keep, e.g. 3,4 or 3-5 (default: all)")
    parser.add_argument("--ranks", type=_int_list, help="ranks to keep, e.g. 0,1 or 0-3 (default: all)")
    parser.add_argument("--out", type=Path, help="output file (default: RUN/merged.json.gz)")
    parser.add_argument("--no-align", action="store_true", help="keep each rank's own clock")


def run(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    traces = read_ranks(args.source, args.ranks)
    out = args.out or (args.source if args.source.is_dir() else args.source.parent) / "merged.json.gz"
    analysis_dir = args.source / "analysis" if args.source.is_dir() else None
    merged, estimate = merge(traces, args.steps, analysis_dir, align=not args.no_align)
    size = write_json_gz(out, merged)
    write_json(out.parent / "analysis" / "clock.json", estimate.to_json())
    notes = merged["pipelineMerge"]
    print(f"{out}: {len(traces)} rank(s), {notes['events']} events, {size / 1e6:.1f} MB of JSON, "
          f"{time.perf_counter() - began:.2f} s; {notes['limited']}")  # fmt: skip
    for line in notes["notes"]:
        print(f"note: {line}", file=sys.stderr)
    return 0


def _int_list(text: str) -> tuple[int, ...]:
    """"3,4" or "3-5" or "1,4-6" -> the integers, in order."""
    values: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            values.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r} (e.g. 3,4 or 3-5)") from None
    return tuple(values)


