"""The merged trace's analysis tracks, from what `analyze` wrote (analysis.results): per rank one thread
each for the classified gaps, the small-GEMM excess of every compute cell, the ideal timeline of the
median step and the median step's critical path (its segments on the ranks they run on, an arrow where
the path passes from one rank to another).

The analysis tables are on the analysis's clock (each rank's own plus its offset in summary.json
`clock`); `Placement` takes them to the merged trace's clock (each rank's own plus the merge's shift,
minus the trace's origin).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl

from analysis.merge.flows import Placed
from analysis.merge.tracks import batched, micros, nesting_layers, thread_events
from analysis.results import Analysis

GAPS_TRACK = "analysis · gaps (bubble, p2p wait, launch overhead, other)"
SMALL_GEMM_TRACK = "analysis · small-GEMM excess"
IDEAL_TRACK = "analysis · ideal"
CRITICAL_TRACK = "analysis · critical path"
_ACTION = pl.format("{}{}{}", "stage", "kind", "microbatch")  # the IR's compact form, as in PP: labels


def applied_offsets(analysis: Analysis) -> dict[int, int]:
    """rank -> the offset the analysis added to its times (0 for every rank when they share a clock)."""
    clock = analysis.summary.clock
    return {} if clock is None else {r.rank: r.offset_ns for r in clock.ranks}


@dataclass(frozen=True)
class Placement:
    """How analysis times of each rank become merged-trace times: + delta_ns (a frame: rank, delta_ns)."""

    delta: pl.DataFrame
    steps: tuple[int, ...] | None

    def place(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Rows of the kept steps, start_ns and end_ns moved onto the merged trace's clock."""
        if self.steps is not None:
            frame = frame.filter(pl.col("step").is_in(self.steps))
        moved = frame.join(self.delta, on="rank")
        return moved.with_columns(pl.col("start_ns", "end_ns") + pl.col("delta_ns")).drop("delta_ns")


def analysis_tracks(
    analysis: Analysis,
    tracks: dict[int, Placed],
    shift: dict[int, int],
    origin: int,
    steps: tuple[int, ...] | None,
    notes: list[str],
    next_id: int,
    us=micros,
) -> Iterator[list[dict]]:
    """Every analysis track's thread names and slices, in batches, then the critical path's arrows (ids
    from `next_id`); what is left out, and why, goes to `notes` (as the first batch is made)."""
    applied = applied_offsets(analysis)
    delta = pl.DataFrame(
        {"rank": list(tracks), "delta_ns": [shift[r] - applied.get(r, 0) - origin for r in tracks]},
        schema={"rank": pl.Int64, "delta_ns": pl.Int64},
    )
    placement = Placement(delta, steps)
    named = {
        GAPS_TRACK: placement.place(analysis.gaps).select("rank", "start_ns", "end_ns", "step", name="class"),
        SMALL_GEMM_TRACK: _small_gemm(analysis.cells, placement, notes),
        IDEAL_TRACK: _ideal(analysis, placement, notes),
        CRITICAL_TRACK: _critical(analysis, placement, notes),
    }
    critical_tid: dict[int, int] = {}
    for rank, track in tracks.items():
        next_tid = max((t for t, _ in track.threads), default=0) + 1
        threads, drawn = [], []
        for name, frame in named.items():
            if frame is None:
                continue
            layered = _layered(frame.filter(pl.col("rank") == rank))
            for layer in range(layered["layer"].max() + 1 if layered.height else 1):
                threads.append((next_tid + layer, name + (f" · overlap {layer}" if layer else "")))
            drawn.append(layered.with_columns(tid=pl.col("layer") + next_tid))
            if name == CRITICAL_TRACK:
                critical_tid[rank] = next_tid  # the path's segments are sequential: one layer
            next_tid += layered["layer"].max() + 1 if layered.height else 1
        yield thread_events(rank, threads)
        for frame in drawn:
            yield from batched(frame, lambda chunk, _: _slices(chunk, us))
    if named[CRITICAL_TRACK] is not None:
        pipeline_of = {rank: j for j, line in enumerate(analysis.summary.pipelines) for rank in line.ranks}
        yield _crossings(named[CRITICAL_TRACK], critical_tid, pipeline_of, next_id, us)


def _layered(frame: pl.DataFrame) -> pl.DataFrame:
    """A track's slices with the overlap layer each nests in (0 for all but slices that overlap without
    nesting, which Perfetto would otherwise move silently): as the traces' own threads are laid out."""
    ordered = frame.sort(["start_ns", "end_ns"], descending=[False, True])
    keyed = ordered.select(pl.lit(0).alias("pid_key"), pl.lit(0).alias("tid_key"), "start_ns", "end_ns")
    return ordered.with_columns(pl.Series("layer", nesting_layers(keyed), dtype=pl.Int64))


def _small_gemm(cells: pl.DataFrame, placement: Placement, notes: list[str]) -> pl.DataFrame | None:
    """Per compute cell with an excess, a slice over the cell's last `small_gemm_ns` (the part beyond
    the reference), named with its action."""
    if cells["small_gemm_ns"].is_null().all():
        notes.append(
            "no calibration in run.json, so no reference to measure excess against: small-GEMM track left out"
        )
        return None
    excess = placement.place(cells.filter(pl.col("small_gemm_ns") > 0))
    return excess.select(
        "rank",
        "step",
        "end_ns",
        name=_ACTION,
        start_ns=pl.col("end_ns") - pl.col("small_gemm_ns").round().cast(pl.Int64),
    )


def _ideal(analysis: Analysis, placement: Placement, notes: list[str]) -> pl.DataFrame | None:
    """The ideal timeline (analysis.attribution.waterfall) of the median step, from where that step began."""
    step = analysis.summary.median_step
    if placement.steps is not None and step not in placement.steps:
        notes.append(
            f"ideal track left out: it is of step {step} (the median step), which --steps leaves out"
        )
        return None
    notes.append(
        f"ideal track: step {step}, the executed schedule at reference durations, no host gaps, no p2p "
        f"latency (the waterfall's reference rung)"
    )
    return placement.place(analysis.ideal).select("rank", "step", "start_ns", "end_ns", name=_ACTION)


def _critical(analysis: Analysis, placement: Placement, notes: list[str]) -> pl.DataFrame | None:
    """The median step's critical path (analysis.attribution.critical): one slice per segment, named by
    its part and, where it has one, its action. Only that step: it is the one the summary explains, and
    every step's path would double the analysis threads of a long run."""
    step = analysis.summary.median_step
    if placement.steps is not None and step not in placement.steps:
        notes.append(
            f"critical path track left out: it is of step {step} (the median step), which --steps leaves out"
        )
        return None
    path = placement.place(analysis.critical.filter(pl.col("step") == step))
    action = pl.when(pl.col("kind").is_not_null()).then(pl.format(" {}", _ACTION)).otherwise(pl.lit(""))
    return path.sort("start_ns").select(
        "rank", "step", "start_ns", "end_ns", name=pl.concat_str("part", action)
    )


def _crossings(
    path: pl.DataFrame, tids: dict[int, int], pipeline_of: dict[int, int], first_id: int, us
) -> list[dict]:
    """An arrow from a segment's last nanosecond to the next one's start wherever a pipeline's path
    changes rank (each pipeline of a job has its own path)."""
    rows = [r for r in path.sort("start_ns").iter_rows(named=True) if r["rank"] in tids]
    lines: dict[int, list[dict]] = {}
    for row in rows:
        lines.setdefault(pipeline_of.get(row["rank"], 0), []).append(row)
    handovers = [(a, b) for line in lines.values() for a, b in zip(line, line[1:]) if a["rank"] != b["rank"]]
    out = []
    for number, (before, after) in enumerate(handovers):
        common = {"id": first_id + number, "cat": "critical", "name": "critical path"}
        leave = max(before["start_ns"], before["end_ns"] - 1)
        out.append({"ph": "s", "pid": before["rank"], "tid": tids[before["rank"]], "ts": us(leave)} | common)
        out.append(
            {
                "ph": "f",
                "bp": "e",
                "pid": after["rank"],
                "tid": tids[after["rank"]],
                "ts": us(after["start_ns"]),
            }
            | common
        )
    return out


def _slices(frame: pl.DataFrame, us) -> list[dict]:
    """Chrome complete events from rows (rank, tid, name, start_ns, end_ns, step)."""
    return [
        {
            "ph": "X",
            "name": name,
            "cat": "analysis",
            "pid": rank,
            "tid": tid,
            "ts": us(start),
            "dur": us(end - start),
            "args": {"step": step},
        }
        for rank, tid, name, start, end, step in frame.select(
            "rank", "tid", "name", "start_ns", "end_ns", "step"
        ).iter_rows()
    ]
