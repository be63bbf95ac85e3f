"""One Perfetto-loadable trace of every rank, on one aligned clock.

Each rank becomes one process (pid = rank, named `rank r · stage s, s'`), its CPU threads and GPU
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

import gzip
import sys
from pathlib import Path

import msgspec
import polars as pl

from analysis.cells.labelled import step_spans
from analysis.errors import InputError
from analysis.files import write_atomically
from analysis.merge.analysis_tracks import analysis_tracks, applied_offsets
from analysis.merge.tracks import layout, p2p_flows, profiler_flows
from analysis.results import Analysis
from analysis.timeline import clock
from analysis.traces.load import RawTrace, load_run, read_trace

BROWSER_LIMIT_BYTES = 1 << 30  # Perfetto's UI struggles to open JSON traces past about this size


def read_ranks(source: Path, ranks: tuple[int, ...] | None) -> dict[int, RawTrace]:
    """rank -> trace for a run directory (analysis.traces.load.load_run: one whole run) or one trace file (rank 0
    unless it says otherwise), keeping only `ranks` when given."""
    if source.is_file():
        trace = read_trace(source)
        found = {trace.rank if trace.rank is not None else 0: trace}
    else:
        found = {trace.rank if trace.rank is not None else 0: trace for trace in load_run(source).traces}
    kept = {rank: trace for rank, trace in sorted(found.items()) if ranks is None or rank in ranks}
    if not kept:
        raise InputError(source, f"has none of ranks {list(ranks or [])} (it has {sorted(found)})")
    return kept


def merge(
    traces: dict[int, RawTrace], steps: tuple[int, ...] | None, analysis: Analysis | None, align: bool = True
) -> dict:
    """The merged Chrome trace (as a dict). With `analysis` (what `analyze` wrote for these traces) the
    ranks go onto its clock and get its transfer arrows and analysis tracks; without it (traces that are
    not a pipeline) clocks are aligned by their collectives alone (analysis.timeline.clock)."""
    frames = {rank: trace.frame.with_columns(rank=pl.lit(rank, pl.Int64)) for rank, trace in traces.items()}
    notes: list[str] = []
    cells, estimate = _own_clock_cells(analysis), analysis.summary.clock if analysis is not None else None
    if analysis is None and align:
        events = pl.concat(
            [f.select("rank", "name", "cat", "ph", "start_ns", "end_ns") for f in frames.values()]
        )
        estimate = clock.estimate(list(traces), None, events)
    kept = {rank: _within_steps(frame, steps, notes) for rank, frame in frames.items()}
    tracks = {rank: layout(frame, traces[rank].events_json) for rank, frame in kept.items()}
    shift = {rank: estimate.offset_ns(rank) if align and estimate is not None else 0 for rank in traces}
    origin = min(t.slices["start_ns"].min() + shift[r] for r, t in tracks.items() if t.slices.height)
    out: list[dict] = []
    next_id = 0
    for rank, track in tracks.items():
        stages = [] if analysis is None else list(analysis.schedule.stages_of(rank))
        out.extend(track.metadata_events(rank, _process_name(rank, stages)))
        out.extend(track.slice_events(rank, shift[rank] - origin))
        flows, next_id = profiler_flows(track, rank, shift[rank] - origin, next_id)
        out.extend(flows)
    if analysis is not None:
        arrows, next_id = p2p_flows(clock.transfers(cells), tracks, shift, origin, next_id)
        out.extend(arrows)
        out.extend(analysis_tracks(analysis, tracks, shift, origin, steps, notes))
    else:
        notes.append("no analysis of these traces: no transfer arrows or analysis tracks")
    meta = {
        "clock": msgspec.to_builtins(estimate),
        "origin_ns": origin,
        "limited": _limits(steps, traces),
        "notes": notes,
        "events": len(out),
        "sources": {str(r): t.path.name for r, t in traces.items()},
    }
    return {"traceEvents": out, "displayTimeUnit": "ns", "pipelineMerge": meta}


def _own_clock_cells(analysis: Analysis | None) -> pl.DataFrame | None:
    """The analysis's cells back on each rank's own clock, where the traces' slices are."""
    if analysis is None:
        return None
    offsets = applied_offsets(analysis)
    offset = pl.col("rank").replace_strict(offsets, default=0, return_dtype=pl.Int64)
    return analysis.cells.with_columns(pl.col("start_ns", "end_ns") - offset)


def _within_steps(frame: pl.DataFrame, steps: tuple[int, ...] | None, notes: list[str]) -> pl.DataFrame:
    """Events overlapping the chosen profiler steps (metadata always kept); all events when no choice."""
    if steps is None:
        return frame
    windows = step_spans(frame).filter(pl.col("step").is_in(steps))
    rank = frame["rank"][0]
    if windows.height == 0:
        notes.append(f"rank {rank}: none of steps {list(steps)} is in the trace; rank left empty")
    inside = pl.lit(False)
    for start, end in windows.select("start_ns", "end_ns").iter_rows():  # steps touch: overlap must be strict
        overlaps = (pl.col("start_ns") < end) & (pl.col("end_ns") > start)
        inside = inside | overlaps | pl.col("start_ns").is_between(start, end, closed="left")
    return frame.filter(inside | (pl.col("ph") == "M"))


def _process_name(rank: int, stages: list[int]) -> str:
    if not stages:
        return f"rank {rank}"
    return f"rank {rank} · stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))}"


def _limits(steps: tuple[int, ...] | None, traces: dict[int, RawTrace]) -> str:
    which = f"steps {list(steps)}" if steps is not None else "all steps"
    return f"{which} of ranks {list(traces)}" + (" (limited by --steps/--ranks)" if steps is not None else "")


def write_json_gz(path: Path, document: dict) -> int:
    """Gzipped JSON written to a temporary file in the same folder, then renamed: readers never see half.

    Returns the size of the uncompressed JSON, the number the browser's limit applies to.
    """
    data = msgspec.json.encode(document)
    _atomic_write(path, gzip.compress(data, compresslevel=5))
    if len(data) > BROWSER_LIMIT_BYTES:
        print(
            f"warning: {path} is {len(data) / 1e9:.1f} GB of JSON; Perfetto's UI may not open it. "
            "Limit it with --steps or --ranks.",
            file=sys.stderr,
        )
    return len(data)


def _atomic_write(path: Path, data: bytes) -> None:
    try:
        write_atomically(path, data)
    except OSError as error:
        raise InputError(
            path.parent, f"cannot write here ({error.strerror}); choose another place with --out"
        ) from None
