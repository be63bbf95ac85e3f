"""The op graph of an op-level timeline (analysis.traces.oplevel): what each op waits for.

Every (step, dp_rank) runs the same ops, so the graph is built once, from the first step of replica 0,
over ops keyed (stage, optype, seq_id); the values are arrays over (op, step, dp_rank). Dependencies,
as the StragglerAnalysis paper models a Megatron-LM step:
- same-rank order: a stage's forward and backward computes run one after another in their recorded
  order; each p2p optype is a stream of its own, in seq_id order; the k-th send of a direction follows
  the k-th compute of that direction, the k-th receive follows the (k-1)-th (it is posted once that
  compute has ended) and precedes the k-th; (Megatron batches a receive with a send, so it is posted
  later than that in fact: taking each p2p op after the last compute that had ended when it started
  replays the three published jobs 0.1-0.3% slower, their figures within 0.005 of these);
  params-all-gather precedes the first forward of its model chunk; every other op (gc, the gradient
  all-reduces and reduce-scatters, clipping, the optimizer) follows the last compute, one after
  another in their recorded order;
- p2p pairs: forward-send k of stage s with forward-recv k of stage s+1, backward-send k of stage s
  with backward-recv k of stage s-1, on the same replica;
- collectives: params-all-gather and grads-reduce-scatter over one stage's replicas, the embedding
  all-reduce between the first and last stage of a replica, gradient clipping over every stage and
  replica. A collective's members all end at the latest member's start plus their own transfer time.
layernorm-grads-all-reduce runs within a tensor-parallel group whose other ranks are not recorded: an
op of its own. A job with no-op p2p ops (counts that do not pair up) is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import numpy as np
import polars as pl

from analysis.errors import InputError
from analysis.traces.oplevel import CLIP, COMPUTE, DP_COLLECTIVES, EMBEDDING, P2P, PARAMS_GATHER

# send -> (the stage of its receiver, relative to its own; the receiver's optype)
RECEIVER = {"forward-send": (1, "forward-recv"), "backward-send": (-1, "backward-recv")}


@dataclass(frozen=True)
class Collective:
    """Ops that end together: at their latest start (over replicas too when `over_replicas`)."""

    members: tuple[int, ...]
    over_replicas: bool


@dataclass(frozen=True)
class OpGraph:
    """Ops in `keys` order (stage, optype, seq_id); `deps[i]` the ops op i waits for; `order` the units
    (one op, or a collective's members) in an order where every unit's dependencies come first."""

    keys: pl.DataFrame
    deps: tuple[tuple[int, ...], ...]
    units: tuple[Collective, ...]
    order: tuple[int, ...]

    @property
    def collective(self) -> np.ndarray:
        """Per op: whether its end is a collective's (its time is a transfer after the latest start)."""
        flags = np.zeros(self.keys.height, dtype=bool)
        for unit in self.units:
            if len(unit.members) > 1 or unit.over_replicas:
                flags[list(unit.members)] = True
        return flags


def _stage_deps(stage: pl.DataFrame, index: dict[tuple, int], deps: list[list[int]], source: Path) -> None:
    """Same-rank order within one stage's reference ops (sorted by start)."""
    node = [index[key] for key in stage.select("stage", "optype", "seq_id").iter_rows()]
    optypes = stage["optype"].to_list()
    computes = [i for i, kind in enumerate(optypes) if kind in COMPUTE]
    if not computes:
        raise InputError(source, f"stage {stage['stage'][0]} records no forward or backward compute")
    for before, after in zip(computes, computes[1:]):
        deps[node[after]].append(node[before])
    for kind in P2P:
        stream = [i for i, k in enumerate(optypes) if k == kind]
        for before, after in zip(stream, stream[1:]):
            deps[node[after]].append(node[before])
        direction = [i for i in computes if optypes[i] == P2P[kind]]
        if stream and len(direction) != len(stream):
            raise InputError(
                source, f"stage {stage['stage'][0]}: {len(stream)} {kind} for {len(direction)} computes"
            )
        if kind not in RECEIVER:
            for recv, compute in zip(stream, direction):
                deps[node[compute]].append(node[recv])
        for k, i in enumerate(stream):
            after = k if kind in RECEIVER else k - 1  # a send's own compute; the one before a receive's
            if 0 <= after < len(direction):
                deps[node[i]].append(node[direction[after]])
    mcs = stage["mc"].to_list()
    for i in (i for i, kind in enumerate(optypes) if kind == PARAMS_GATHER):
        first = next((c for c in computes if optypes[c] == COMPUTE[0] and mcs[c] == mcs[i]), computes[0])
        deps[node[first]].append(node[i])
    rest = [
        i
        for i, kind in enumerate(optypes)
        if kind not in COMPUTE and kind not in P2P and kind != PARAMS_GATHER
    ]
    for before, after in zip([computes[-1], *rest], rest):
        deps[node[after]].append(node[before])


def _units(keys: pl.DataFrame, index: dict[tuple, int], stages: int, source: Path) -> list[Collective]:
    grouped: set[int] = set()
    units = []
    for i, (stage, optype, seq) in enumerate(keys.iter_rows()):
        if optype in RECEIVER:
            peer = index.get((stage + RECEIVER[optype][0], RECEIVER[optype][1], seq))
            if peer is None:
                raise InputError(
                    source, f"{optype} {seq} of stage {stage} has no receiver on the stage it sends to"
                )
            units.append(Collective((i, peer), False))
            grouped |= {i, peer}
        elif optype in DP_COLLECTIVES:
            units.append(Collective((i,), True))
            grouped.add(i)
        elif optype == EMBEDDING and stage == 0:
            ends = [index[(s, optype, seq)] for s in {0, stages - 1} if (s, optype, seq) in index]
            units.append(Collective(tuple(ends), False))
            grouped |= set(ends)
        elif optype == CLIP and stage == 0:
            members = tuple(index[(s, optype, seq)] for s in range(stages) if (s, optype, seq) in index)
            units.append(Collective(members, True))
            grouped |= set(members)
    units += [Collective((i,), False) for i in range(keys.height) if i not in grouped]
    return units


def _topological(units: list[Collective], deps: list[list[int]], source: Path) -> tuple[int, ...]:
    unit_of = {op: u for u, unit in enumerate(units) for op in unit.members}
    waits = [{unit_of[d] for op in unit.members for d in deps[op]} - {u} for u, unit in enumerate(units)]
    try:
        return tuple(TopologicalSorter(dict(enumerate(waits))).static_order())
    except CycleError:
        raise InputError(
            source, "the ops' dependencies form a cycle: the recorded order is not one step's"
        ) from None


def build_graph(reference: pl.DataFrame, source: Path) -> OpGraph:
    """The graph of one replica's step (`reference`: its ops, with start_ts and end_ts, read from `source`)."""
    keys = reference.select("stage", "optype", "seq_id").sort("stage", "optype", "seq_id")
    index = {key: i for i, key in enumerate(keys.iter_rows())}
    deps: list[list[int]] = [[] for _ in index]
    for stage in reference.sort("start_ts", "seq_id").partition_by("stage", maintain_order=True):
        _stage_deps(stage, index, deps, source)
    units = _units(keys, index, int(keys["stage"].max()) + 1, source)
    return OpGraph(keys, tuple(tuple(d) for d in deps), tuple(units), _topological(units, deps, source))
