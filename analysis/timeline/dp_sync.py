"""The data-parallel gradient sync: its collectives on each rank, their start skew across a DP group, and
the idle time they explain (dp_sync: the device's time in DP collectives that compute did not hide).

A rank's collectives are read from its trace alone (the DP:grad_sync span is not needed): on GPU the
NCCL all-reduce, reduce-scatter and all-gather kernels (they run on a comm stream: the time they explain
is the compute stream's idle time under them); on CPU each call (c10d::allreduce_ and the like) from its
start to the end of its run on the backend's thread (gloo:all_reduce, from the call until the result is
there), the k-th call with the k-th run. Ranks of a DP group issue their collectives in the same order
(c10d requires it), so the k-th collective of each member is the same one; its start skew on a rank is
its latest start in the group less this rank's start, at most the time it took on this rank: the wait
for a slower replica. Across pipelines the ranks are taken to share a clock (one host's, or NTP's).
"""

from __future__ import annotations

import polars as pl

from analysis.cells.labelled import cat_in
from analysis.traces.kineto import DEVICE_WORK_CATS

# CPU: the dispatcher's collective ops, and the span of each on gloo's worker thread.
CPU_CALLS = ("c10d::allreduce_", "c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::allgather_")
CPU_RUNS = ("gloo:all_reduce", "gloo:reduce_scatter", "gloo:all_gather")
# GPU: NCCL's collective kernels (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_AllGather_...).
GPU_KERNELS = r"^nccl.*(AllReduce|ReduceScatter|AllGather)"
INSTANCES = {"rank": pl.Int64, "k": pl.UInt32, "start_ns": pl.Int64, "end_ns": pl.Int64}


def collectives(frame: pl.DataFrame) -> pl.DataFrame:
    """One rank's collectives in issue order: rank, k, start_ns, end_ns (GPU kernels if it has any)."""
    spans = frame.select("rank", "name", "cat", "start_ns", "end_ns")
    device = spans.filter(cat_in(frame, lambda cat: cat in DEVICE_WORK_CATS))
    kernels = device.filter(pl.col("name").str.contains(GPU_KERNELS))
    if kernels.height:
        return _numbered(kernels.select("rank", "start_ns", "end_ns"))
    host = spans.filter(pl.col("name").is_in(CPU_CALLS + CPU_RUNS))
    calls = _numbered(host.filter(pl.col("name").is_in(CPU_CALLS)).select("rank", "start_ns", "end_ns"))
    runs = _numbered(host.filter(pl.col("name").is_in(CPU_RUNS)).select("rank", "start_ns", "end_ns"))
    if runs.height != calls.height:  # not one run per call: the calls alone
        return calls
    done = runs.select("k", run_end="end_ns")
    return calls.join(done, on="k").select(
        "rank", "k", "start_ns", end_ns=pl.max_horizontal("end_ns", "run_end")
    )


def _numbered(spans: pl.DataFrame) -> pl.DataFrame:
    return spans.sort("start_ns").with_row_index("k").select(list(INSTANCES)).cast(INSTANCES)


def with_skew(instances: pl.DataFrame, dp_groups: list[list[int]]) -> pl.DataFrame:
    """`instances` (every rank's `collectives`) with skew_end_ns: start_ns + the start skew in its DP group
    (null where a member lacks its k-th collective: nothing to compare)."""
    members = pl.DataFrame(
        {
            "rank": [r for group in dp_groups for r in group],
            "group": [i for i, g in enumerate(dp_groups) for _ in g],
        },
        schema={"rank": pl.Int64, "group": pl.Int64},
    )
    sizes = members.group_by("group").agg(size=pl.len())
    joined = instances.join(members, on="rank").join(sizes, on="group")
    latest = pl.col("start_ns").max().over("group", "k")
    whole = pl.len().over("group", "k") == pl.col("size")
    return joined.select(
        *INSTANCES, skew_end_ns=pl.when(whole).then(pl.min_horizontal(latest, "end_ns"))
    ).sort("rank", "k")


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


def with_dp_sync(gaps: pl.DataFrame, instances: pl.DataFrame) -> pl.DataFrame:
    """`gaps` (rank, step, start_ns, end_ns, class) with the idle time under the collectives classed
    dp_sync, whatever it was classed before."""
    pieces = cut(gaps, instances.select("rank", "start_ns", "end_ns"))
    return pieces.with_columns(
        pl.when("inside").then(pl.lit("dp_sync")).otherwise("class").alias("class")
    ).drop("inside")


def skew_ns(gaps: pl.DataFrame, instances: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step) with dp_sync time: dp_skew, the part of it within the collectives' start skews."""
    synced = gaps.filter(pl.col("class") == "dp_sync")
    skews = instances.drop_nulls("skew_end_ns").select("rank", "start_ns", end_ns="skew_end_ns")
    pieces = cut(synced, skews).filter("inside")
    waited = pieces.group_by("rank", "step").agg(dp_skew=(pl.col("end_ns") - pl.col("start_ns")).sum())
    return synced.select("rank", "step").unique().join(waited, on=["rank", "step"], how="left").fill_null(0)
