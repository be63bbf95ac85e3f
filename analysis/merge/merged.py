"""One Perfetto-loadable trace of every rank, on one aligned clock.

Each rank becomes one process (pid = rank, named `rank r · stage s, s'`), its CPU threads and GPU
streams become that process's threads, so OS pids and GPU device indices of different ranks or hosts
cannot collide. Flow ids are renumbered densely across the file, so a profiler's launch arrows stay in
their rank, and each pipeline transfer gets an arrow from the sender's SEND (GPU: its NCCL kernel) to
the receiver's RECV. Clocks are aligned by analysis.timeline.clock; the offsets go into the trace's metadata
and into `analysis/clock.json` beside the output. Slices that overlap without nesting (real traces
have them) go to a named overlap thread instead of being silently moved by Perfetto.
Where `analyze` has run, each rank also gets analysis tracks (analysis.merge.analysis_tracks): the gap
classes, each compute cell's small-GEMM excess, and the simulated ideal step.
"""

from __future__ import annotations

import gzip
import sys
import time
from pathlib import Path

import msgspec
import polars as pl

from analysis.timeline import clock
from analysis.cells.labelled import rank_cells, step_spans
from analysis.errors import InputError
from analysis.traces.load import RawTrace, load_run, read_trace
from analysis.merge.analysis_tracks import analysis_tracks
from analysis.merge.tracks import layout, p2p_flows, profiler_flows
from analysis.files import write_atomically

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
    traces: dict[int, RawTrace], steps: tuple[int, ...] | None, analysis_dir: Path | None, align: bool = True
) -> tuple[dict, clock.ClockEstimate]:
    """The merged Chrome trace (as a dict) and the clock estimate that aligned it."""
    frames = {rank: trace.frame.with_columns(rank=pl.lit(rank, pl.Int64)) for rank, trace in traces.items()}
    cells = _pipeline_cells(traces, frames)
    events = pl.concat([f.select("rank", "name", "cat", "ph", "start_ns", "end_ns") for f in frames.values()])
    estimate = clock.estimate(list(traces), cells if align else None, events if align else events.clear())
    notes: list[str] = []
    kept = {rank: _within_steps(frame, steps, notes) for rank, frame in frames.items()}
    tracks = {rank: layout(frame, traces[rank].events_json) for rank, frame in kept.items()}
    shift = {rank: estimate.offset_ns(rank) for rank in traces}
    origin = min(t.slices["start_ns"].min() + shift[r] for r, t in tracks.items() if t.slices.height)
    out: list[dict] = []
    next_id = 0
    for rank, track in tracks.items():
        stages = sorted(set(cells.filter(pl.col("rank") == rank)["stage"].to_list())) if cells is not None else []
        out.extend(track.metadata_events(rank, _process_name(rank, stages)))
        out.extend(track.slice_events(rank, shift[rank] - origin))
        flows, next_id = profiler_flows(track, rank, shift[rank] - origin, next_id)
        out.extend(flows)
    if cells is not None:
        arrows, next_id = p2p_flows(clock.transfers(cells), tracks, shift, origin, next_id)
        out.extend(arrows)
    out.extend(analysis_tracks(analysis_dir, tracks, shift, origin, steps, notes))
    limited = _limits(steps, traces)
    meta = {"clock": estimate.to_json(), "origin_ns": origin, "limited": limited, "notes": notes,
            "events": len(out), "sources": {str(r): t.path.name for r, t in traces.items()}}  # fmt: skip
    return {"traceEvents": out, "displayTimeUnit": "ns", "pipelineMerge": meta}, estimate


def _pipeline_cells(traces: dict[int, RawTrace], frames: dict[int, pl.DataFrame]) -> pl.DataFrame | None:
    """All ranks' cells (analysis.cells.labelled), or None when no trace carries PP: labels."""
    found = [rank_cells(frames[r], traces[r].path).cells for r in traces]
    cells = pl.concat(found) if found else None
    return cells if cells is not None and cells.height else None


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
        print(f"warning: {path} is {len(data) / 1e9:.1f} GB of JSON; Perfetto's UI may not open it. "
              "Limit it with --steps or --ranks.", file=sys.stderr)  # fmt: skip
    return len(data)


def write_json(path: Path, document: dict) -> None:
    _atomic_write(path, msgspec.json.format(msgspec.json.encode(document)) + b"\n")


def _atomic_write(path: Path, data: bytes) -> None:
    try:
        write_atomically(path, data)
    except OSError as error:
        raise InputError(path.parent, f"cannot write here ({error.strerror}); choose another place with --out") from None
