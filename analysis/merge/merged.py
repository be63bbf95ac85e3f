"""One Perfetto-loadable trace of every rank, on one aligned clock.

Each rank becomes one process (pid = rank, named `rank r · stage s, s'`, after `pipeline j · ` in a
job of several, shown sorted by pipeline, then stage), its CPU threads and GPU
streams become that process's threads, so OS pids and GPU device indices of different ranks or hosts
cannot collide. Flow ids are renumbered densely across the file, so a profiler's launch arrows stay in
their rank, and each pipeline transfer gets an arrow from the sender's SEND (GPU: its NCCL kernel) to
the receiver's RECV. The clock, the cells behind the arrows and the analysis tracks (the gap classes,
each compute cell's small-GEMM excess, the ideal timeline: analysis.merge.analysis_tracks) are what
`analyze` wrote (analysis.results); the clock offsets also go into the trace's metadata. Slices that
overlap without nesting (real traces have them) go to a named overlap thread instead of being
silently moved by Perfetto.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import msgspec
import polars as pl

from analysis.errors import InputError
from analysis.files import atomic_file
from analysis.merge.analysis_tracks import analysis_tracks, applied_offsets
from analysis.merge.flows import Placed, p2p_flows, placed, profiler_flows
from analysis.merge.output import GzipStream
from analysis.merge.tracks import exact_micros, layout, micros
from analysis.results import Analysis
from analysis.timeline import clock
from analysis.traces import limits
from analysis.traces.load import Budget, RawTrace, read_trace, with_rank
from analysis.traces.run import RunTraces, load_run, one_trace_run
from analysis.traces.run_files import rank_from_name, trace_files
from analysis.traces.spans import step_spans
from analysis.traces.times import WHOLE_NS_LIMIT_US

BROWSER_LIMIT_BYTES = 1 << 30  # Perfetto's UI struggles to open JSON traces past about this size
_ENCODER = msgspec.json.Encoder()
_Found = TypeVar("_Found", RawTrace, Path)  # a rank's trace, or its file not yet read


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


def read_named_ranks(source: Path, ranks: tuple[int, ...]) -> dict[int, RawTrace] | None:
    """Only `ranks`' traces of run directory `source`, the other files left unread, where the file names tell
    which is which: every trace file named with its own rank (rank3.json.gz) and each one read saying
    that rank. None where they do not (an unnamed file, two names of one rank, or a trace whose own
    distributedInfo.rank differs from its name's): only reading every file says which rank each is, so
    the caller loads the whole run. The run-wide checks (one file per rank, one run id) were made when
    the run was analysed, which is what told the caller the ranks to keep."""
    files = trace_files(source.resolve())
    named = {rank_from_name(path): path for path in files}
    if not files or None in named or len(named) != len(files) or len(files) > limits.current().ranks:
        return None
    budget = Budget.of_run()
    kept = {}
    for rank, path in kept_ranks(source, named, ranks).items():
        trace = read_trace(path, budget)
        if trace.rank != rank:
            return None
        kept[rank] = trace
    return kept


def kept_ranks(source: Path, found: dict[int, _Found], ranks: tuple[int, ...] | None) -> dict[int, _Found]:
    kept = {rank: trace for rank, trace in sorted(found.items()) if ranks is None or rank in ranks}
    if not kept:
        raise InputError(source, f"has none of ranks {_shown(ranks or ())} (it has {sorted(found)})")
    return kept


@dataclass(frozen=True)
class _Plan:
    """Everything of the merged trace but its events: where each rank's events go and what is noted."""

    traces: dict[int, RawTrace]
    frames: dict[int, pl.DataFrame]  # each rank's kept events
    shift: dict[int, int]
    origin: int
    analysis: Analysis | None
    cells: pl.DataFrame | None
    steps: tuple[int, ...] | None
    estimate: clock.ClockEstimate | None
    notes: list[str]
    us: object = micros  # how times are written (exact_micros where a double would round them)

    def meta(self, events: int) -> dict:
        return {
            "clock": msgspec.to_builtins(self.estimate),
            "origin_ns": self.origin,
            "limited": _limits(self.steps, self.traces),
            "notes": self.notes,
            "events": events,
            "sources": {str(r): t.path.name for r, t in self.traces.items()},
        }


def _plan(
    traces: dict[int, RawTrace], steps: tuple[int, ...] | None, analysis: Analysis | None, align: bool
) -> _Plan:
    frames = {rank: trace.frame.with_columns(rank=pl.lit(rank, pl.Int64)) for rank, trace in traces.items()}
    notes: list[str] = []
    cells, estimate = _own_clock_cells(analysis), analysis.summary.clock if analysis is not None else None
    if analysis is None and align:
        events = pl.concat(
            [f.select("rank", "name", "cat", "ph", "start_ns", "end_ns") for f in frames.values()]
        )
        estimate = clock.estimate(list(traces), None, events)
    kept = {rank: _within_steps(frame, steps, notes) for rank, frame in frames.items()}
    shift = {rank: estimate.offset_ns(rank) if align and estimate is not None else 0 for rank in traces}
    drawn = pl.col("ph").is_in(["X", "i"])
    bounds = {
        rank: frame.select(pl.col("start_ns").filter(drawn).min(), pl.col("end_ns").filter(drawn).max()).row(
            0
        )
        for rank, frame in kept.items()
    }
    known = [(first + shift[r], last + shift[r]) for r, (first, last) in bounds.items() if first is not None]
    origin = min((first for first, _ in known), default=0)
    reach_us = max((last - origin for _, last in known), default=0) / 1000
    us = exact_micros if reach_us >= WHOLE_NS_LIMIT_US else micros
    return _Plan(traces, kept, shift, origin, analysis, cells, steps, estimate, notes, us)


def _batches(plan: _Plan) -> Iterator[list[dict]]:
    """The merged trace's events, a list at a time (a rank's piece of events, its flows, ...). One rank
    is laid out at a time, and only what the arrows and analysis tracks need of it is kept after."""
    next_id = 0
    origin, shift = plan.origin, plan.shift
    done: dict[int, Placed] = {}
    places = _places(plan.analysis)
    for rank, frame in plan.frames.items():
        trace = plan.traces[rank]
        track = layout(frame, trace.events_json, trace.path)
        place = places.get(rank)
        yield track.metadata_events(rank, _process_name(rank, place), rank if place is None else place.order)
        yield from track.slice_events(rank, shift[rank] - origin, plan.us)
        flows, next_id = profiler_flows(track, rank, shift[rank] - origin, next_id, plan.us)
        yield from flows
        done[rank] = placed(track)
        del track, flows
    if plan.analysis is not None:
        pairs = _within_pipelines(clock.transfers(plan.cells), places)
        arrows, next_id = p2p_flows(pairs, done, shift, origin, next_id, plan.us)
        yield from arrows
        yield from analysis_tracks(
            plan.analysis, done, shift, origin, plan.steps, plan.notes, next_id, plan.us
        )
    else:
        plan.notes.append("no analysis of these traces: no transfer arrows or analysis tracks")


def merge(
    traces: dict[int, RawTrace], steps: tuple[int, ...] | None, analysis: Analysis | None, align: bool = True
) -> dict:
    """The merged Chrome trace (as a dict). With `analysis` (what `analyze` wrote for these traces) the
    ranks go onto its clock and get its transfer arrows and analysis tracks; without it (traces that are
    not a pipeline) clocks are aligned by their collectives alone (analysis.timeline.clock). The CLI
    writes the same trace without holding it whole: `write_merged`."""
    plan = _plan(traces, steps, analysis, align)
    out = [event for batch in _batches(plan) for event in batch]
    return {"traceEvents": out, "displayTimeUnit": "ns", "pipelineMerge": plan.meta(len(out))}


def write_merged(
    path: Path,
    traces: dict[int, RawTrace],
    steps: tuple[int, ...] | None,
    analysis: Analysis | None,
    align: bool = True,
) -> tuple[int, dict]:
    """`merge`'s trace streamed into gzipped JSON at `path` (a temporary file renamed into place: readers
    never see half of it; analysis.files.atomic_file), a piece of events at a time. Returns the size of
    the uncompressed JSON (the number the browser's limit applies to) and the trace's pipelineMerge
    metadata."""
    plan = _plan(traces, steps, analysis, align)
    with atomic_file(path) as file:
        out = GzipStream(file)
        out.write(b'{"traceEvents":[')
        count = 0
        for batch in _batches(plan):
            if batch:
                out.write((b"," if count else b"") + _ENCODER.encode(batch)[1:-1])
                count += len(batch)
        meta = plan.meta(count)
        out.write(b'],"displayTimeUnit":"ns","pipelineMerge":' + _ENCODER.encode(meta) + b"}")
        out.finish()
    if out.size > BROWSER_LIMIT_BYTES:
        print(
            f"warning: {path} is {out.size / 1e9:.1f} GB of JSON; Perfetto's UI may not open it. "
            "Limit it with --steps or --ranks.",
            file=sys.stderr,
        )
    return out.size, meta


def _own_clock_cells(analysis: Analysis | None) -> pl.DataFrame | None:
    """The analysis's cells back on each rank's own clock, where the traces' slices are."""
    if analysis is None:
        return None
    offsets = applied_offsets(analysis)
    offset = pl.col("rank").replace_strict(offsets, default=0, return_dtype=pl.Int64)
    return analysis.cells.with_columns(pl.col("start_ns", "end_ns") - offset)


def _within_steps(frame: pl.DataFrame, steps: tuple[int, ...] | None, notes: list[str]) -> pl.DataFrame:
    """Events overlapping the chosen profiler steps (metadata always kept); all events when no choice.
    An event is kept when it starts inside a chosen step's span or overlaps it (steps touch, so the
    overlap must be strict); the spans are merged into disjoint intervals, so each event meets at most
    one candidate: the first interval ending after it starts."""
    if steps is None:
        return frame
    windows = step_spans(frame).filter(pl.col("step").is_in(steps)).sort("start_ns")
    rank = frame["rank"][0] if frame.height else None
    if windows.height == 0:
        notes.append(f"rank {rank}: none of steps {_shown(steps)} is in the trace; rank left empty")
        return frame.filter(pl.col("ph") == "M")
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


@dataclass(frozen=True)
class _Place:
    """Where a rank sits in the job: its pipeline (None with one), its stages, its place in the order
    processes are shown in (by pipeline, then stage)."""

    pipeline: int | None
    stages: list[int]
    order: int


def _places(analysis: Analysis | None) -> dict[int, _Place]:
    if analysis is None:
        return {}
    summary = analysis.summary
    depth = len(summary.ranks) // max(len(summary.pipelines), 1)
    where = {rank: (j, s) for j, line in enumerate(summary.pipelines) for s, rank in enumerate(line.ranks)}
    return {
        entry.rank: _Place(
            entry.pipeline if summary.dp > 1 else None,
            entry.stage_ids,
            where[entry.rank][0] * depth + where[entry.rank][1] if entry.rank in where else entry.rank,
        )
        for entry in summary.ranks
    }


def _within_pipelines(pairs: pl.DataFrame, places: dict[int, _Place]) -> pl.DataFrame:
    """Transfers between ranks of one pipeline (stage numbers repeat in every pipeline)."""
    pipeline = {rank: place.pipeline or 0 for rank, place in places.items()}
    if len(set(pipeline.values())) <= 1:
        return pairs
    of = {"default": -1, "return_dtype": pl.Int64}
    same = pl.col("src_rank").replace_strict(pipeline, **of) == pl.col("dst_rank").replace_strict(
        pipeline, **of
    )
    return pairs.filter(same)


def _process_name(rank: int, place: _Place | None) -> str:
    if place is None or not place.stages:
        return f"rank {rank}"
    stages = place.stages
    named = f"rank {rank} · stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))}"
    return named if place.pipeline is None else f"pipeline {place.pipeline} · {named}"


def _shown(values: tuple[int, ...] | list[int]) -> str:
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
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return "[" + ", ".join(shown[:10]) + (f", ... ({len(shown)} runs)" if len(shown) > 10 else "") + "]"


def _limits(steps: tuple[int, ...] | None, traces: dict[int, RawTrace]) -> str:
    which = f"steps {_shown(steps)}" if steps is not None else "all steps"
    return f"{which} of ranks {_shown(list(traces))}" + (
        " (limited by --steps/--ranks)" if steps is not None else ""
    )
