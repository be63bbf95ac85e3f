"""Which ranks a merge writes, and where each one's trace comes from while it is written.

The merged trace's first bytes depend on every rank: its time origin is the earliest kept slice of all
ranks on the aligned clock, whether times are written as exact decimals depends on the last, and
without an analysis the clock itself is estimated from every rank's collectives. So the merge reads the
ranks twice: a first pass keeps of each rank only a `Skim` (those bounds, its collectives and the
size of what it keeps), then each rank is read again while it is written (`MergeRanks.trace`), one at a
time, so the merge holds one rank's trace, not the run's. A run the merge analyses first is loaded
without its text (`FramesRead`) and skimmed from its frames; a trace file merged alone is held and
handed over rather than read again.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import polars as pl

from analysis.errors import InputError, TraceWarning
from analysis.timeline.clock import collective_events
from analysis.traces import limits
from analysis.traces.load import Budget, RawTrace, read_trace, with_rank
from analysis.traces.run import RunTraces, load_run, one_trace_run
from analysis.traces.run_files import rank_from_name, trace_files
from analysis.traces.spans import step_spans

_Found = TypeVar("_Found", RawTrace, Path)  # a rank's trace, or its file not yet read
_DRAWN = pl.col("ph").is_in(["X", "i"])  # the events the merged trace draws, whose times set its origin


@dataclass(frozen=True)
class Skim:
    """What the first pass keeps of one rank's trace."""

    path: Path
    first_ns: int | None  # the earliest start of its kept drawn events, on its own clock; None: none kept
    last_ns: int | None  # the latest end of them
    steps_found: bool  # whether any of the chosen steps is in the trace (True where none are chosen)
    kept_bytes: int  # its JSON text's bytes, in the share of its events kept: what the merge rewrites
    collectives: pl.DataFrame  # its collectives (analysis.timeline.clock.collective_events), rank unset


@dataclass
class MergeRanks:
    """The ranks to merge, in order, each one's Skim; `held` the traces in memory, each given up as it is
    written (the others are read again from their files)."""

    skims: dict[int, Skim]
    held: dict[int, RawTrace]
    # the run the ranks were chosen from (its traces emptied), where every file was read
    job: RunTraces | None = None

    def trace(self, rank: int) -> RawTrace:
        """Rank `rank`'s trace, for writing: the first pass warned of what it found already."""
        if rank in self.held:
            return self.held.pop(rank)
        path = self.skims[rank].path
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            trace = read_trace(path)
        if trace.rank is None and len(self.skims) == 1:
            trace = with_rank(trace, rank)
        if trace.rank != rank:
            raise InputError(path, f"changed while it was merged: it was rank {rank}, now {trace.rank}")
        return trace


def within_steps(frame: pl.DataFrame, steps: tuple[int, ...] | None) -> pl.DataFrame | None:
    """Events overlapping the chosen profiler steps (metadata always kept); all events when no choice;
    None where none of the steps is in the trace.
    An event is kept when it starts inside a chosen step's span or overlaps it (steps touch, so the
    overlap must be strict); the spans are merged into disjoint intervals, so each event meets at most
    one candidate: the first interval ending after it starts."""
    if steps is None:
        return frame
    windows = step_spans(frame).filter(pl.col("step").is_in(steps)).sort("start_ns")
    if windows.height == 0:
        return None
    merged = (
        windows.with_columns(
            group=(pl.col("start_ns") > pl.col("end_ns").shift(1).cum_max()).fill_null(True).cum_sum()
        )
        .group_by("group", maintain_order=True)
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    )
    starts, ends = merged["start_ns"], merged["end_ns"]
    candidate = ends.search_sorted(frame["start_ns"].fill_null(0), side="right")
    found = candidate < len(ends)
    at = candidate.clip(upper_bound=len(ends) - 1)
    start, end = starts.gather(at), ends.gather(at)
    event_start, event_end = frame["start_ns"], frame["end_ns"]
    overlaps = (event_start < end) & ((event_end > start) | (event_start >= start))
    inside = (found & overlaps).fill_null(False)
    return frame.filter(inside | (frame["ph"] == "M"))


def kept_events(frame: pl.DataFrame, steps: tuple[int, ...] | None) -> pl.DataFrame:
    """The events of a rank's frame the merge writes: within_steps, only metadata where none is found."""
    kept = within_steps(frame, steps)
    return frame.filter(pl.col("ph") == "M") if kept is None else kept


def skim(trace: RawTrace, steps: tuple[int, ...] | None, text_bytes: int) -> Skim:
    """Rank `trace`'s Skim, whose JSON text was `text_bytes` long."""
    frame = trace.frame
    kept = within_steps(frame, steps)
    shown = frame.filter(pl.col("ph") == "M") if kept is None else kept
    first, last = shown.select(
        pl.col("start_ns").filter(_DRAWN).min(), pl.col("end_ns").filter(_DRAWN).max()
    ).row(0)
    return Skim(
        trace.path,
        first,
        last,
        kept is not None,
        text_bytes * shown.height // max(frame.height, 1),
        collective_events(frame).drop("rank"),
    )


class FramesRead:
    """read_trace as load_run calls it, the text let go as it is read (analysis.traces.stream: the merge
    reads it again to write the rank), each file's bytes of JSON text noted in `text_bytes`."""

    def __init__(self) -> None:
        self.text_bytes: dict[Path, int] = {}

    def __call__(self, path: Path, budget: Budget) -> RawTrace:
        left = budget.bytes
        trace = read_trace(path, budget, keep_text=False)
        self.text_bytes[path] = left - budget.bytes
        return trace


def held_ranks(traces: dict[int, RawTrace], steps: tuple[int, ...] | None) -> MergeRanks:
    """Traces in memory with their text, skimmed where they are and handed over."""
    skims = {rank: skim(trace, steps, len(trace.events_json)) for rank, trace in traces.items()}
    return MergeRanks(skims, dict(traces))


def read_again(
    source: Path,
    job: RunTraces,
    read: FramesRead,
    ranks: tuple[int, ...] | None,
    steps: tuple[int, ...] | None,
) -> MergeRanks:
    """`ranks` (all where None) of a run `read` has loaded without their text, each to be read again."""
    chosen = kept_ranks(source, {trace.rank: trace for trace in job.traces}, ranks)
    return MergeRanks(
        {rank: skim(trace, steps, read.text_bytes[trace.path]) for rank, trace in chosen.items()}, {}
    )


def skimmed_run(source: Path, ranks: tuple[int, ...] | None, steps: tuple[int, ...] | None) -> MergeRanks:
    """Every trace of run directory `source` read (and checked, as load_run does) one at a time, its Skim
    kept and its trace let go; the ranks kept are `ranks` (all where None)."""
    read, skims = FramesRead(), {}

    def skimming(path: Path, budget: Budget) -> RawTrace:
        trace = read(path, budget)
        skims[path] = skim(trace, steps, read.text_bytes[path])
        # What load_run checks (rank, world size, header) stays; the rest goes, metadata too: where a
        # file is read whole, its members are views of the whole text.
        emptied = {"frame": trace.frame.clear(), "counters": trace.counters.clear(), "comms": []}
        return replace(trace, metadata={}, **emptied)

    job = load_run(source.resolve(), skimming)
    chosen = kept_ranks(source, {trace.rank: trace.path for trace in job.traces}, ranks)
    return MergeRanks({rank: skims[path] for rank, path in chosen.items()}, {}, job)


def skimmed_named_ranks(
    source: Path, ranks: tuple[int, ...], steps: tuple[int, ...] | None
) -> MergeRanks | None:
    """Only `ranks`' traces of run directory `source` skimmed, the other files left unread, where the file
    names tell which is which: every trace file named with its own rank (rank3.json.gz) and each one read
    saying that rank. None where they do not (an unnamed file, two names of one rank, or a trace whose
    own distributedInfo.rank differs from its name's): only reading every file says which rank each is,
    so the caller reads the whole run. The run-wide checks (one file per rank, one run id) were made when
    the run was analysed, which is what told the caller the ranks to keep."""
    files = trace_files(source.resolve())
    named = {rank_from_name(path): path for path in files}
    if not files or None in named or len(named) != len(files) or len(files) > limits.current().ranks:
        return None
    read, budget, skims = FramesRead(), Budget.of_run(), {}
    for rank, path in kept_ranks(source, named, ranks).items():
        trace = read(path, budget)
        if trace.rank != rank:
            return None
        skims[rank] = skim(trace, steps, read.text_bytes[path])
    return MergeRanks(skims, {})


def read_run(source: Path) -> RunTraces:
    """The traces of a run directory (analysis.traces.run.load_run: ranks of one job, any of them) or of
    one trace file (rank 0 unless it says otherwise)."""
    if not source.is_file():
        return load_run(source)
    trace = read_trace(source)
    return one_trace_run(trace if trace.rank is not None else with_rank(trace, 0))


def read_ranks(source: Path, ranks: tuple[int, ...] | None) -> dict[int, RawTrace]:
    """rank -> trace of `source` (read_run), keeping only `ranks` when given."""
    return kept_ranks(source, {trace.rank: trace for trace in read_run(source).traces}, ranks)


def kept_ranks(source: Path, found: dict[int, _Found], ranks: tuple[int, ...] | None) -> dict[int, _Found]:
    kept = {rank: trace for rank, trace in sorted(found.items()) if ranks is None or rank in ranks}
    if not kept:
        raise InputError(source, f"has none of ranks {shown(ranks or ())} (it has {sorted(found)})")
    return kept


def shown(values: tuple[int, ...] | list[int]) -> str:
    """[1] -> "[1]"; a long selection as its runs: "[0-99999]"."""
    values = list(values)
    if len(values) <= 20:
        return str(values)
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return "[" + ", ".join(parts[:10]) + (f", ... ({len(parts)} runs)" if len(parts) > 10 else "") + "]"
