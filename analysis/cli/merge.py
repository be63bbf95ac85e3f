"""`python -m analysis merge RUN`: one Perfetto-loadable trace of every rank (analysis.merge).

Where a run directory's analysis/ is on disk, the merge reads each rank's trace twice, one rank at a
time: once for what the whole trace's first bytes depend on, once to write it
(analysis.merge.sources), so it holds one rank's trace, not the run's; where --pipelines or --ranks
keeps some ranks, only their files are read. Where the analysis is missing (or unreadable), the run
is first loaded without its text (each rank's events in columns, as `analyze` reads them) and analysed,
then each rank is read again to be written (analysis.merge.merged.write_merged).
Any of a job's ranks merge (one rank of a big job, a run with a rank's file lost): the summary line says
which are missing, and where the analysis does not cover the ranks merged (a run lacking ranks is not
analysed), they merge without it.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

from analysis import results
from analysis.errors import InputError, LimitExceeded, TraceWarning, printable
from analysis.job.join import analyze_job
from analysis.job.run_dir import run_input
from analysis.merge.merged import write_merged
from analysis.merge.output import MERGED_FILE, check_out
from analysis.merge.sources import (
    FramesRead,
    held_ranks,
    kept_ranks,
    read_again,
    read_run,
    skimmed_named_ranks,
    skimmed_run,
)
from analysis.results import Analysis
from analysis.traces import limits
from analysis.traces.run import RunTraces, listed, load_run
from analysis.traces.run_files import run_in
from runners.arguments import whole_number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        metavar="RUN",
        type=Path,
        help="run directory (rank*.json.gz), a folder of traces, or one trace",
    )
    parser.add_argument(
        "--steps", type=_ranges, help="profiler steps to keep, e.g. 3,4 or 3-5 (default: all)"
    )
    parser.add_argument("--ranks", type=_ranges, help="ranks to keep, e.g. 0,1 or 0-3 (default: all)")
    parser.add_argument(
        "--pipelines",
        type=_ranges,
        help="pipelines of a PP x DP job to keep (their ranks, as the analysis found them), e.g. 0,3 or 0-1",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="output file (default: RUN/merged.json.gz): a new one or one merge wrote, never a run's file",
    )
    parser.add_argument("--no-align", action="store_true", help="keep each rank's own clock")


def run(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    steps = _selection(args.steps, "--steps", "steps")
    ranks = _selection(args.ranks, "--ranks", "ranks")
    source: Path = run_in(args.source)
    out = args.out or (source if source.is_dir() else source.parent) / MERGED_FILE
    check_out(out)
    analysis, without = None, None
    pipelines = _selection(args.pipelines, "--pipelines", "ranks")
    if source.is_dir():
        stored = _stored_analysis(source.resolve())
        read = FramesRead()
        loaded = None if stored is not None else load_run(source.resolve(), read)
        analysis, without = (stored, None) if loaded is None else _analysed(source.resolve(), loaded)
        ranks = _of_pipelines(source, analysis, without, pipelines, ranks)
        if loaded is not None:
            chosen, missing = read_again(source, loaded, read, ranks, steps), _missing(loaded, ranks)
            del loaded  # every rank's frame, before the first rank is read again to be written
        else:
            # A selection read alone where the stored analysis already holds what the other ranks gave it.
            named = skimmed_named_ranks(source, ranks, steps) if ranks is not None else None
            chosen = named or skimmed_run(source, ranks, steps)
            missing = _missing(chosen.job, ranks)
    elif pipelines is not None:
        raise InputError(
            source, "--pipelines needs a run directory (its analysis says which ranks form each)"
        )
    else:
        job = read_run(source)
        chosen = held_ranks(kept_ranks(source, {trace.rank: trace for trace in job.traces}, ranks), steps)
        missing = _missing(job, ranks)
        del job  # its one trace is handed over
    if analysis is not None:
        analysis, without = _covering(source, analysis, chosen.skims)
    size, notes = write_merged(out, chosen, steps, analysis, align=not args.no_align)
    print(
        f"{printable(out)}: {len(chosen.skims)} rank(s), {notes['events']} events, {size / 1e6:.1f} MB of "
        f"JSON, {time.perf_counter() - began:.2f} s; {notes['limited']}{missing}"
    )
    if without is not None:
        print(f"note: merged without the analysis: {without}", file=sys.stderr)
    for line in notes["notes"]:
        print(f"note: {printable(line)}", file=sys.stderr)
    return 0


def _stored_analysis(run_dir: Path) -> Analysis | None:
    """What `analyze` wrote; None where it is missing, or unreadable or from another version (a warning):
    the run is then analysed again (_analysed)."""
    if results.exists(run_dir):
        try:
            stored = results.read_stored(run_dir)
        except InputError as error:
            warnings.warn(f"{error}; analysed again", TraceWarning, stacklevel=2)
            return None
        return stored if isinstance(stored, Analysis) else None  # some ranks' figures draw no tracks
    return None


def _analysed(run_dir: Path, loaded: RunTraces) -> tuple[Analysis | None, InputError | None]:
    """The run's analysis made from the traces already loaded and written as `analyze` would, or why
    there is none: an InputError of the analysis (traces that are not a pipeline it can read) means a
    merge without it."""
    try:
        analysis = analyze_job(run_input(loaded))
    except InputError as error:
        return None, error
    results.write(run_dir, analysis)
    return analysis, None


def _covering(
    source: Path, analysis: Analysis, ranks: Iterable[int]
) -> tuple[Analysis | None, InputError | None]:
    """The analysis where it has every rank merged; else none, and why (RUN/analysis written before
    another rank's trace was added)."""
    uncovered = sorted(set(ranks) - {entry.rank for entry in analysis.summary.ranks})
    if not uncovered:
        return analysis, None
    return None, InputError(source, f"its analysis has no rank {listed(uncovered)} (analyse the run again)")


def _missing(job: RunTraces | None, ranks: tuple[int, ...] | None) -> str:
    """ "; missing rank(s) 1-63 (the job has 64)": the job's ranks without a trace, of `ranks` where
    chosen. Empty where none is, or where only the chosen ranks' files were read (job None)."""
    if job is None:
        return ""
    missing: list[tuple[int, int]] | list[int] = job.missing
    if ranks is not None:
        missing = [rank for rank in ranks if any(first <= rank <= last for first, last in missing)]
    return f"; missing rank(s) {listed(missing)} (the job has {job.world_size})" if missing else ""


def _of_pipelines(
    source: Path,
    analysis: Analysis | None,
    without: InputError | None,
    pipelines: tuple[int, ...] | None,
    ranks: tuple[int, ...] | None,
) -> tuple[int, ...] | None:
    """The ranks to keep: `ranks`, narrowed to the chosen pipelines' ranks where --pipelines is given."""
    if pipelines is None:
        return ranks
    if analysis is None:
        raise InputError(source, f"--pipelines needs the run's analysis, which failed: {without}")
    found = [entry.ranks for entry in analysis.summary.pipelines]
    missing = sorted(set(pipelines) - set(range(len(found))))
    if missing:
        raise InputError(source, f"has no pipeline {missing[0]} (its analysis found {len(found)}, from 0)")
    chosen = sorted(rank for index in pipelines for rank in found[index])
    return tuple(rank for rank in chosen if ranks is None or rank in ranks)


def _ranges(text: str) -> tuple[tuple[int, int], ...]:
    """ "3,4" or "3-5" or "1,4-6" -> the (first, last) runs, not yet expanded (a range may be huge)."""
    runs: list[tuple[int, int]] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            first, last = whole_number(low), whole_number(high or low)
            if last < first:
                raise argparse.ArgumentTypeError(part)
            runs.append((first, last))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r} (e.g. 3,4 or 3-5)") from None
    return tuple(runs)


def _selection(runs: tuple[tuple[int, int], ...] | None, flag: str, limit: str) -> tuple[int, ...] | None:
    """The integers a --steps / --ranks selection names, in order; refused past its limit before any is
    listed (`--steps 0-2000000000` would be a list of two billion)."""
    if runs is None:
        return None
    count = sum(last - first + 1 for first, last in runs)
    most = getattr(limits.current(), limit)
    if count > most:
        raise LimitExceeded(flag, f"names {count:,} {limit}, more than {limits.current().describe(limit)}")
    return tuple(value for first, last in runs for value in range(first, last + 1))
