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
silently moved by Perfetto. The ranks are read one at a time, twice (analysis.merge.sources): the
whole trace's origin and time format (analysis.merge.plan) depend on every rank before the first is written.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import polars as pl

from analysis.errors import printable
from analysis.files import atomic_file
from analysis.merge.analysis_tracks import analysis_tracks
from analysis.merge.flows import Placed, p2p_flows, placed, profiler_flows
from analysis.merge.output import GzipStream
from analysis.merge.plan import MergePlan, plan
from analysis.merge.sources import MergeRanks, held_ranks, kept_events
from analysis.merge.tracks import layout
from analysis.results import Analysis
from analysis.timeline import clock
from analysis.traces.load import RawTrace

BROWSER_LIMIT_BYTES = 1 << 30  # Perfetto's UI struggles to open JSON traces past about this size
_ENCODER = msgspec.json.Encoder()


def _batches(plan: MergePlan) -> Iterator[list[dict]]:
    """The merged trace's events, a list at a time (a rank's piece of events, its flows, ...). One rank
    is read and laid out at a time, and only what the arrows and analysis tracks need of it is kept after."""
    next_id = 0
    origin, shift = plan.origin, plan.shift
    done: dict[int, Placed] = {}
    places = _places(plan.analysis)
    for rank in plan.ranks.skims:
        trace = plan.ranks.trace(rank)
        frame = kept_events(trace.frame.with_columns(rank=pl.lit(rank, pl.Int64)), plan.steps)
        track = layout(frame, trace.events_json, trace.path)
        del trace, frame  # the track holds what it needs of them
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
    merging = plan(held_ranks(traces, steps), steps, analysis, align)
    out = [event for batch in _batches(merging) for event in batch]
    return {"traceEvents": out, "displayTimeUnit": "ns", "pipelineMerge": merging.meta(len(out))}


def write_merged(
    path: Path,
    ranks: MergeRanks,
    steps: tuple[int, ...] | None,
    analysis: Analysis | None,
    align: bool = True,
) -> tuple[int, dict]:
    """`merge`'s trace streamed into gzipped JSON at `path` (a temporary file renamed into place: readers
    never see half of it; analysis.files.atomic_file), a piece of events at a time, reading one rank at
    a time (analysis.merge.sources). Says the JSON's expected size first; returns its size (the number
    the browser's limit applies to) and the trace's pipelineMerge metadata."""
    merging = plan(ranks, steps, analysis, align)
    # An estimate from the first pass (a trace's indenting, dropped in the output, inflates it). On stdout:
    # stderr carries nothing but the one error line where the writing fails.
    estimate = f"about {merging.kept_bytes / 1e6:.1f} MB of JSON"
    print(f"writing {printable(path)}: {estimate} (the kept events' share of the traces' text)", flush=True)
    with atomic_file(path) as file:
        out = GzipStream(file)
        out.write(b'{"traceEvents":[')
        count = 0
        for batch in _batches(merging):
            if batch:
                out.write((b"," if count else b"") + _ENCODER.encode(batch)[1:-1])
                count += len(batch)
        meta = merging.meta(count)
        out.write(b'],"displayTimeUnit":"ns","pipelineMerge":' + _ENCODER.encode(meta) + b"}")
        out.finish()
    if out.size > BROWSER_LIMIT_BYTES:
        print(
            f"warning: {path} is {out.size / 1e9:.1f} GB of JSON; Perfetto's UI may not open it. "
            "Limit it with --steps or --ranks.",
            file=sys.stderr,
        )
    return out.size, meta


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
