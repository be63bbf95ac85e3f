"""An op-level job's measured times as arrays over (op, step, dp_rank), and its replay on the op graph.

Each step is replayed alone from its own start: an op starts when the ops it waits for have ended (plus
its launch delay, where one is given) and runs its time; a collective's members end at their latest
start plus each one's transfer time. Times are seconds from the step's first start; one lane per stage
and replica (OpTimeline.lanes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from analysis.errors import InputError
from analysis.whatif.graph import OpGraph, build_graph


@dataclass(frozen=True)
class Measured:
    """`time`: an op's duration, or for a collective's member its transfer (its end less the latest
    start among its partners, at least 0); `delay`: its start less the latest end of what it waits for
    (the step's start for the first ops), at least 0; `step_s`: each step's recorded span; `rank`: the
    recorded global rank of each (stage, dp_rank)."""

    graph: OpGraph
    steps: np.ndarray
    time: np.ndarray
    delay: np.ndarray
    step_s: np.ndarray
    rank: dict[tuple[int, int], int]


def _arrays(ops: pl.DataFrame, graph: OpGraph, source: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    nodes = graph.keys.with_row_index("node")
    placed = ops.join(nodes, on=["stage", "optype", "seq_id"], how="left")
    if placed["node"].null_count():
        row = placed.filter(pl.col("node").is_null()).row(0, named=True)
        raise InputError(
            source,
            f"step {row['step']} runs {row['optype']} {row['seq_id']} on stage "
            f"{row['stage']}, which the first step of replica 0 does not",
        )
    steps = np.sort(placed["step"].unique().to_numpy())
    replicas = int(placed["dp_rank"].max()) + 1
    shape = (len(steps), replicas, graph.keys.height)
    placed = placed.unique(["step", "dp_rank", "node"]).sort("step", "dp_rank", "node")
    if placed.height != np.prod(shape):
        raise InputError(source, "its steps and replicas do not all run the same ops")
    start = placed["start_ts"].to_numpy().reshape(shape).transpose(2, 0, 1)
    end = placed["end_ts"].to_numpy().reshape(shape).transpose(2, 0, 1)
    first = start.min(axis=(0, 2), keepdims=True)
    return steps, start - first, end - first


def measure(ops: pl.DataFrame, source: Path) -> Measured:
    """The op graph of `ops` (an OpTimeline's lanes) and every op's measured time and launch delay."""
    reference = ops.filter(pl.col("dp_rank") == 0, pl.col("step") == pl.col("step").min())
    graph = build_graph(reference, source)
    steps, start, end = _arrays(ops, graph, source)
    time = end - start
    for unit in graph.units:
        if len(unit.members) > 1 or unit.over_replicas:
            members = list(unit.members)
            latest = start[members].max(axis=0, keepdims=True)
            latest = latest.max(axis=2, keepdims=True) if unit.over_replicas else latest
            time[members] = np.maximum(end[members] - latest, 0.0)
    ready = np.stack([end[list(d)].max(axis=0) if d else np.zeros(start.shape[1:]) for d in graph.deps])
    rank = {(s, d): r for s, d, r in ops.select("stage", "dp_rank", "rank").unique().iter_rows()}
    return Measured(graph, steps, time, np.maximum(start - ready, 0.0), end.max(axis=(0, 2)), rank)


def replay(graph: OpGraph, time: np.ndarray, delay: np.ndarray | None = None) -> np.ndarray:
    """Each step's span replayed with these times (and launch delays; none when None), in seconds."""
    end = np.zeros_like(time)
    origin = np.zeros(time.shape[1:])
    for u in graph.order:
        unit = graph.units[u]
        starts = []
        for op in unit.members:
            ready = end[list(graph.deps[op])].max(axis=0) if graph.deps[op] else origin
            starts.append(ready + (0.0 if delay is None else delay[op]))
        if len(unit.members) == 1 and not unit.over_replicas:
            end[unit.members[0]] = starts[0] + time[unit.members[0]]
            continue
        latest = np.max(starts, axis=0)
        latest = latest.max(axis=1, keepdims=True) if unit.over_replicas else latest
        for op in unit.members:
            end[op] = latest + time[op]
    return end.max(axis=(0, 2))
