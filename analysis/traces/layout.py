"""Which ranks form each pipeline of a job (PP x DP): lists of global ranks in stage order.

Found, in this order, from run.json's "pipelines" (our runner writes them); from the process groups
the traces record (Kineto's distributedInfo.pg_config): a pipeline's p2p groups (our runner's
`pp_activation_up` ..., torch DeviceMesh's and torchtitan's `mesh_pp`, Megatron's
`PIPELINE_MODEL_PARALLEL_GROUP`) hold its ranks, and without them the data-parallel groups (our
runner's `dp`, a mesh's `mesh_dp`, Megatron's `DATA_PARALLEL_GROUP`) do, pipeline j taking the j-th
rank of every one (a mesh that splits dp in two, dp_shard x dp_replicate, is read from its pp groups); from
the peers of the traces' p2p ops; else, when nothing says there is more than one pipeline, every rank
is one pipeline (as before DP). A job that says it has replicas but not where is refused. Within a
pipeline the stage order is the rank order: in the mesh layout with pp outermost (global rank =
stage * dp + replica, torchtitan's and our runner's) that is the pipeline's order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from analysis.errors import InputError

_MESH_PREFIX = "mesh_"  # torch's DeviceMesh names a dimension's groups mesh_<dim name>
# Megatron-LM's group_desc (megatron/core/parallel_state.py), as Kineto's pg_config carries it
MEGATRON_PIPELINE = "PIPELINE_MODEL_PARALLEL_GROUP"
MEGATRON_DP = "DATA_PARALLEL_GROUP"


@dataclass(frozen=True)
class Group:
    """A process group one rank's trace records: its description (group_desc) and its global ranks."""

    name: str
    ranks: tuple[int, ...]
    id: str | None = None  # pg_name: the "Process Group Name" a collective's record_param_comms gives


def groups_of(distributed_info: Any) -> tuple[Group, ...]:
    """The process groups of a trace's distributedInfo (its pg_config entries with a name and a list of
    rank numbers; others are skipped: they say nothing usable)."""
    config = getattr(distributed_info, "pg_config", None)
    if not isinstance(config, list):
        return ()
    found = []
    for entry in config:
        if not isinstance(entry, dict):
            continue
        name, ranks, id = entry.get("pg_desc"), entry.get("ranks"), entry.get("pg_name")
        if isinstance(name, str) and isinstance(ranks, list) and all(type(r) is int for r in ranks):
            found.append(Group(name, tuple(ranks), id if isinstance(id, str) else None))
    return tuple(found)


def _dimension(name: str) -> str:
    return name.removeprefix(_MESH_PREFIX)


def is_pipeline_group(name: str) -> bool:
    """Our runner's p2p groups (pp_activation_up, ...), a mesh's pp dimension, Megatron's pipeline group."""
    return _dimension(name) == "pp" or name.startswith("pp_") or name == MEGATRON_PIPELINE


def is_dp_group(name: str) -> bool:
    """One stage's replicas, all of them: our runner's DP groups (`dp`), a mesh's dp dimension (`mesh_dp`),
    Megatron's DATA_PARALLEL_GROUP."""
    return _dimension(name) == "dp" or name == MEGATRON_DP


# What a collective's group spans (analysis.timeline.dp_sync): one stage's replicas (the gradient sync),
# several stages (waiting for another stage), or one stage of one replica (tensor or context parallel)
DP, STAGES, STAGE = "dp", "stages", "stage"
# Megatron's groups across stages: the embedding group (first and last stage), the model-parallel group
# (tp x pp, the gradient norm's); torch's world group
_ACROSS_STAGES = ("EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP", "MODEL_PARALLEL_GROUP", "default_pg")
_IN_ONE_STAGE = ("TENSOR_MODEL_PARALLEL_GROUP", "CONTEXT_PARALLEL_GROUP", "tp", "cp")


def named_scope(name: str | None) -> str | None:
    """The scope a group's description says (our runner's, a DeviceMesh's or torchtitan's mesh_<dim>,
    Megatron's group_desc); None where it says none known."""
    if name is None:
        return None
    if is_pipeline_group(name) or name in _ACROSS_STAGES:
        return STAGES
    if _dimension(name) in _IN_ONE_STAGE or name in _IN_ONE_STAGE:
        return STAGE
    if _dimension(name).startswith("dp") or "DATA_PARALLEL" in name:
        return DP
    return None


def group_scope(members: Sequence[int] | None, name: str | None, pipelines: list[list[int]]) -> str:
    """What a collective's group spans: by the stages and replicas of its members that are traced, where
    two or more are; else by its name; else, where it lists members (one traced: its partners are not
    traced replicas), one stage; where it lists none (gloo records no group), DP: the gradient sync."""
    place = {rank: (stage, j) for j, ranks in enumerate(pipelines) for stage, rank in enumerate(ranks)}
    known = [place[rank] for rank in members or () if rank in place]
    if len(known) > 1:
        stages, replicas = {stage for stage, _ in known}, {j for _, j in known}
        return STAGES if len(stages) > 1 else DP if len(replicas) > 1 else STAGE
    return named_scope(name) or (DP if members is None else STAGE)


def find_pipelines(
    world: int,
    run_json: Mapping[str, Any] | None,
    groups: Mapping[int, Sequence[Group]],
    peers: Mapping[int, set[int]],
    where: Path | None = None,
) -> list[list[int]]:
    """The job's pipelines, each its global ranks in stage order, ordered by their first rank (the
    replica index j). `groups`, `peers`: per rank, what its trace records. InputError naming `where`
    (the run directory) when the sources disagree with the ranks present or say nothing usable."""
    if run_json is not None and "pipelines" in run_json:
        return _checked(world, run_json["pipelines"], (where or Path(".")) / "run.json", "its pipelines")
    everyone = {group for rank_groups in groups.values() for group in rank_groups}
    in_pp = {g.ranks for g in everyone if is_pipeline_group(g.name)}
    in_dp = {g.ranks for g in everyone if is_dp_group(g.name)}
    if in_pp:
        return _checked(world, [sorted(ranks) for ranks in in_pp], where, "the pp process groups")
    if in_dp:
        by_stage = sorted(sorted(ranks) for ranks in in_dp)
        across = [list(column) for column in zip(*by_stage)] if _same_size(by_stage) else by_stage
        return _checked(world, across, where, "the dp process groups")
    if any(peers.values()):
        return _checked(world, _components(world, peers), where, "the p2p peers")
    dp = 1 if run_json is None else run_json.get("dp", 1)
    if dp == 1:
        return [list(range(world))]
    raise InputError(
        where,
        f'run.json says dp={dp!r:.20} but not which ranks form each pipeline: no "pipelines" in it, '
        "no pp or dp process groups (distributedInfo.pg_config) and no p2p peers in the traces",
    )


def _same_size(lists: list[list[int]]) -> bool:
    return len({len(ranks) for ranks in lists}) == 1


def _components(world: int, peers: Mapping[int, set[int]]) -> list[list[int]]:
    """Ranks linked by p2p, each set sorted: the connected components of the peer graph."""
    seen: set[int] = set()
    found = []
    for start in range(world):
        if start in seen:
            continue
        component, todo = set(), [start]
        while todo:
            rank = todo.pop()
            if rank not in component:
                component.add(rank)
                todo += [peer for peer in peers.get(rank, ()) if peer not in component and 0 <= peer < world]
        seen |= component
        found.append(sorted(component))
    return found


def _checked(world: int, pipelines: Any, where: Path | None, source: str) -> list[list[int]]:
    """`pipelines` as lists of ranks ordered by their first, each of the world's ranks in exactly one,
    all of one depth; else InputError naming `source`."""
    if not isinstance(pipelines, list) or not all(
        isinstance(ranks, list) and ranks and all(type(r) is int for r in ranks) for ranks in pipelines
    ):
        raise InputError(where, f"{source}: not lists of rank numbers")
    listed = sorted(rank for ranks in pipelines for rank in ranks)
    if listed != list(range(world)):
        raise InputError(
            where, f"{source} do not hold each of the {world} traced ranks exactly once: {pipelines!r:.80}"
        )
    if not _same_size(pipelines):
        raise InputError(
            where, f"{source}: pipelines of different depths {sorted({len(r) for r in pipelines})}"
        )
    return sorted(pipelines, key=lambda ranks: ranks[0])


def to_local(frame: pl.DataFrame | None, ranks: list[int]) -> pl.DataFrame | None:
    """The rows of a pipeline's `ranks` (global, in stage order), renumbered to their local rank."""
    if frame is None:
        return None
    local = {rank: index for index, rank in enumerate(ranks)}
    renumbered = pl.col("rank").replace_strict(local, return_dtype=pl.Int64)
    return frame.filter(pl.col("rank").is_in(ranks)).with_columns(renumbered)


def to_global(frame: pl.DataFrame | None, ranks: list[int]) -> pl.DataFrame | None:
    """A pipeline's rows on local ranks renumbered to its global `ranks`."""
    if frame is None:
        return None
    return frame.with_columns(pl.col("rank").replace_strict(dict(enumerate(ranks)), return_dtype=pl.Int64))
