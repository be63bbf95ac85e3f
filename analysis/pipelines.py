"""Which ranks form each pipeline of a job (PP x DP): lists of global ranks in stage order.

Found, in this order, from run.json's "pipelines" (our runner writes them); from the process groups
the traces record (Kineto's distributedInfo.pg_config): a pipeline's p2p groups (our runner's
`pp_activation_up` ... and torch DeviceMesh's `mesh_pp`) hold its ranks, and without them the
data-parallel groups (our runner's `dp`, a mesh's `mesh_dp`) do, pipeline j taking the j-th rank of
every one (a mesh that splits dp in two, dp_shard x dp_replicate, is read from its pp groups); from
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


@dataclass(frozen=True)
class Group:
    """A process group one rank's trace records: its description (group_desc) and its global ranks."""

    name: str
    ranks: tuple[int, ...]


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
        name, ranks = entry.get("pg_desc"), entry.get("ranks")
        if isinstance(name, str) and isinstance(ranks, list) and all(type(r) is int for r in ranks):
            found.append(Group(name, tuple(ranks)))
    return tuple(found)


def _dimension(name: str) -> str:
    return name.removeprefix(_MESH_PREFIX)


def is_pipeline_group(name: str) -> bool:
    """Our runner's p2p groups (pp_activation_up, ...) and a mesh's pp dimension."""
    return _dimension(name) == "pp" or name.startswith("pp_")


def is_dp_group(name: str) -> bool:
    """Our runner's DP groups (`dp`) and a mesh's dp dimension (`mesh_dp`)."""
    return _dimension(name) == "dp"


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
