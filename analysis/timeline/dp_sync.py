"""The collectives of a job of several pipelines: each one's process group, its start skew across the
group, and the idle time it explains. On a DP group (one stage's replicas) that is dp_sync (the device's
time in DP collectives that compute did not hide); on a group across stages (Megatron's embedding or
model-parallel group, the world group of a gradient-norm all-reduce) it is waiting for another stage.

A rank's collectives are read from its trace alone (the DP:grad_sync span is not needed): on GPU the
NCCL all-reduce, reduce-scatter and all-gather kernels (they run on a comm stream: the time they explain
is the compute stream's idle time under them); on CPU each call (c10d::allreduce_ and the like) from its
start to the end of its run on the backend's thread (gloo:all_reduce, from the call until the result is
there), the k-th call with the k-th run. A collective's group is what the record_param_comms around its
launch (GPU) or inside its call (CPU) says (analysis.traces.comms), its members looked up in the rank's
pg_config by the group's id where the op does not list them; never the kernel's name. Ranks of a group
issue its collectives in the same order (c10d requires it), so the k-th collective of the group on each
member is the same one; its start skew on a rank is its latest start in the group less this rank's
start, at most the time it took on this rank: the wait for a slower member. Across pipelines the ranks
are taken to share a clock (one host's, or NTP's).
"""

from __future__ import annotations

import polars as pl

from analysis.cells.labelled import cat_in, rows
from analysis.traces.comms import GROUP_SCHEMA
from analysis.traces.kineto import DEVICE_WORK_CATS, RECORD_PARAM_COMMS
from analysis.traces.layout import DP, Group, group_scope
from analysis.vocabulary import GapClass

# CPU: the dispatcher's collective ops, and the span of each on gloo's worker thread.
CPU_CALLS = ("c10d::allreduce_", "c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::allgather_")
CPU_RUNS = ("gloo:all_reduce", "gloo:reduce_scatter", "gloo:all_gather")
# GPU: NCCL's collective kernels (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_AllGather_...).
GPU_KERNELS = r"^nccl.*(AllReduce|ReduceScatter|AllGather)"
# one rank's collectives (`collectives`): members null where its trace does not say its group
COLLECTIVES = {"rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64} | {
    "members": GROUP_SCHEMA["members"],
    "group_desc": pl.Utf8,
}
INSTANCES = {"rank": pl.Int64, "k": pl.UInt32, "start_ns": pl.Int64, "end_ns": pl.Int64, "scope": pl.Utf8}


def is_collective(name: pl.Expr) -> pl.Expr:
    """An event's name is a collective's: an NCCL collective kernel or a c10d call."""
    return name.str.contains(GPU_KERNELS) | name.is_in(CPU_CALLS)


def collectives(
    frame: pl.DataFrame, said: pl.DataFrame | None = None, groups: tuple[Group, ...] = ()
) -> pl.DataFrame:
    """One rank's collectives in issue order (COLLECTIVES; GPU kernels if it has any), each with the group
    that `said` (analysis.traces.comms.comm_groups, of the same trace) and its `groups` (pg_config) give."""
    device = cat_in(frame, lambda cat: cat in DEVICE_WORK_CATS)
    named = pl.col("name").str.contains(GPU_KERNELS)
    kernels = rows(frame, device & named, "rank", "correlation", "start_ns", "end_ns")
    if kernels.height:  # found where the record_param_comms holds the kernel's launch (at its start)
        launches = rows(
            frame, ~device & pl.col("correlation").is_not_null(), "rank", "correlation", "tid", "start_ns"
        )
        anchored = kernels.join(launches.rename({"start_ns": "t"}), on=["rank", "correlation"], how="left")
        return _grouped(anchored.drop("correlation"), frame, said, groups, "backward")
    host = rows(
        frame, pl.col("name").is_in(CPU_CALLS + CPU_RUNS), "rank", "name", "tid", "start_ns", "end_ns"
    )
    calls = host.filter(pl.col("name").is_in(CPU_CALLS)).sort("start_ns")
    runs = host.filter(pl.col("name").is_in(CPU_RUNS)).sort("start_ns")
    if runs.height == calls.height:  # one run per call: the call lasts until its run is done
        calls = calls.with_columns(end_ns=pl.max_horizontal("end_ns", runs["end_ns"]))
    # found where a record_param_comms opens inside the call
    return _grouped(calls.with_columns(t="start_ns").drop("name"), frame, said, groups, "forward")


def _grouped(
    spans: pl.DataFrame, frame: pl.DataFrame, said: pl.DataFrame | None, groups: tuple[Group, ...], look: str
) -> pl.DataFrame:
    """`spans` (rank, tid, t, start_ns, end_ns) with the group of the record_param_comms on thread tid
    nearest t in the direction `look` that holds t (backward) or opens within the span (forward)."""
    ops = rows(frame, pl.col("name") == RECORD_PARAM_COMMS, "index", "tid", "start_ns", "end_ns")
    ops = ops.join(said if said is not None else pl.DataFrame(schema=GROUP_SCHEMA), on="index")
    ops = ops.select(
        "tid", "members", "group_id", "group_desc", t="start_ns", op_start="start_ns", op_end="end_ns"
    )
    found = spans.sort("t").join_asof(ops.sort("t"), on="t", by="tid", strategy=look, check_sortedness=False)
    held = pl.col("op_end") >= pl.col("t") if look == "backward" else pl.col("op_start") <= pl.col("end_ns")
    found = found.with_columns(
        pl.when(held).then(pl.col(name)).alias(name) for name in ("members", "group_id", "group_desc")
    )
    known = pl.DataFrame(
        [(g.id, list(g.ranks), g.name) for g in groups if g.id is not None],
        schema={"group_id": pl.Utf8, "listed": GROUP_SCHEMA["members"], "listed_desc": pl.Utf8},
        orient="row",
    ).unique("group_id", keep="first")
    return (
        found.join(known, on="group_id", how="left")
        .select(
            "rank",
            "start_ns",
            "end_ns",
            members=pl.coalesce("members", "listed"),
            group_desc=pl.coalesce("group_desc", "listed_desc"),
        )
        .sort("start_ns")
        .cast(COLLECTIVES)
    )


def with_skew(found: pl.DataFrame, pipelines: list[list[int]], cells: pl.DataFrame) -> pl.DataFrame:
    """INSTANCES, ready_ns and skew_end_ns: every rank's `collectives` numbered k within their group,
    with the group's scope (analysis.traces.layout.group_scope), when the rank was ready for it (_ready) and
    the end of its wait for the group's other members: their latest readiness, at most its end (null
    where a member lacks its k-th collective: nothing to compare). A collective whose trace names no
    members is taken to be on the rank's DP group (every pipeline's rank of its stage) where it is DP.
    `cells`: every rank's (rank, step, start_ns, done_ns: when it stopped holding the rank), on the
    collectives' clocks."""
    said = found.select("members", "group_desc").unique()
    scopes = [group_scope(members, desc, pipelines) for members, desc in said.iter_rows()]
    said = said.with_columns(scope=pl.Series(scopes, dtype=pl.Utf8))
    dp_group = {
        rank: sorted(one[s] for one in pipelines) for ranks in pipelines for s, rank in enumerate(ranks)
    }
    own = pl.col("rank").replace_strict(dp_group, return_dtype=GROUP_SCHEMA["members"], default=None)
    resolved = pl.when(pl.col("scope") == DP).then(own).otherwise(pl.concat_list(pl.col("rank")))
    instances = (
        found.join(said, on=["members", "group_desc"], how="left", nulls_equal=True)
        .with_columns(members=pl.coalesce(pl.col("members").list.sort(), resolved))
        .with_columns(key=pl.col("members").cast(pl.List(pl.Utf8)).list.join(","))
        .sort("rank", "start_ns")
        .with_columns(k=pl.int_range(pl.len(), dtype=pl.UInt32).over("rank", "key"))
    )
    instances = _ready(instances, cells)
    latest = pl.col("ready_ns").max().over("key", "k")
    whole = pl.len().over("key", "k") == pl.col("members").list.len()
    return instances.select(
        *INSTANCES, "ready_ns", skew_end_ns=pl.when(whole).then(pl.min_horizontal(latest, "end_ns"))
    ).sort("rank", "start_ns")


def _ready(instances: pl.DataFrame, cells: pl.DataFrame) -> pl.DataFrame:
    """`instances` with ready_ns: for a DP collective launched after the rank's last action of a step and
    before its next step began, the end of that action (the device had nothing left to do: a launch held
    back until the replicas arrive, as Megatron's converted jobs show, is waiting for them); else its
    start."""
    steps = (
        cells.group_by("rank", "step")
        .agg(last_ns=pl.col("done_ns").max(), first_ns=pl.col("start_ns").min())
        .sort("rank", "step")
        .with_columns(next_ns=pl.col("first_ns").shift(-1).over("rank"))
        .select("rank", "last_ns", "next_ns")
        .sort("last_ns")
    )
    found = instances.sort("start_ns").join_asof(
        steps, left_on="start_ns", right_on="last_ns", by="rank", check_sortedness=False
    )
    held = (pl.col("scope") == DP) & pl.col("last_ns").is_not_null()
    held &= pl.col("next_ns").is_null() | (pl.col("start_ns") < pl.col("next_ns"))
    return found.with_columns(ready_ns=pl.when(held).then("last_ns").otherwise("start_ns")).drop(
        "last_ns", "next_ns"
    )


def union(intervals: pl.DataFrame) -> pl.DataFrame:
    """Per rank, the union of intervals (rank, start_ns, end_ns) as disjoint ones, sorted."""
    ordered = intervals.filter(pl.col("end_ns") > pl.col("start_ns")).sort("rank", "start_ns")
    opens = pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1).over("rank")
    return (
        ordered.with_columns(piece=opens.fill_null(True).cast(pl.UInt32).cum_sum().over("rank"))
        .group_by("rank", "piece")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .select("rank", "start_ns", "end_ns")
        .sort("rank", "start_ns")
    )


def cut(gaps: pl.DataFrame, intervals: pl.DataFrame) -> pl.DataFrame:
    """`gaps` cut at the union of `intervals` (rank, start_ns, end_ns): each piece keeps its gap's columns
    and says whether it lies `inside` them."""
    indexed = gaps.with_row_index("gap")
    hits = (
        indexed.select("gap", "rank", g0="start_ns", g1="end_ns")
        .join(union(intervals).select("rank", a="start_ns", b="end_ns"), on="rank")
        .filter((pl.col("a") < pl.col("g1")) & (pl.col("b") > pl.col("g0")))
        .select("gap", a=pl.max_horizontal("a", "g0"), b=pl.min_horizontal("b", "g1"))
    )
    # Outside pieces run from the gap's start or an inside piece's end to the next inside start or the
    # gap's end: the k-th of the sorted froms with the k-th of the sorted tos.
    froms = pl.concat([indexed.select("gap", t="start_ns"), hits.select("gap", t="b")]).sort("gap", "t")
    tos = pl.concat([hits.select("gap", t="a"), indexed.select("gap", t="end_ns")]).sort("gap", "t")
    outside = froms.select("gap", start_ns="t", end_ns=tos["t"], inside=pl.lit(False))
    inside = hits.select("gap", start_ns="a", end_ns="b", inside=pl.lit(True))
    pieces = pl.concat([outside, inside]).filter(pl.col("end_ns") > pl.col("start_ns"))
    return (
        pieces.join(indexed.drop("start_ns", "end_ns"), on="gap")
        .sort("gap", "start_ns")
        .select(*gaps.columns, "inside")
    )


def skew_ns(gaps: pl.DataFrame, instances: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step) with dp_sync time: dp_skew, the part of it within the DP collectives' waits for
    their replicas (from ready_ns to skew_end_ns)."""
    synced = gaps.filter(pl.col("class") == GapClass.DP_SYNC)
    dp = instances.filter(pl.col("scope") == DP).drop_nulls("skew_end_ns")
    skews = dp.select("rank", start_ns="ready_ns", end_ns="skew_end_ns")
    pieces = cut(synced, skews).filter("inside")
    waited = pieces.group_by("rank", "step").agg(dp_skew=(pl.col("end_ns") - pl.col("start_ns")).sum())
    return synced.select("rank", "step").unique().join(waited, on=["rank", "step"], how="left").fill_null(0)
