"""Cells of an unlabelled GPU trace (the seed's GPipe on NCCL, torch's Schedule1F1B), from its op stream.

The host says what each piece of device work is, the device says when it ran:
- every kernel is tied to the host call that launched it (same correlation id) and so to the host ops
  around that call, on whichever thread made it: under an autograd backward op
  (`autograd::engine::evaluate_function: ...`, on CUDA run by the autograd engine's own thread) it is
  backward work, else forward work; forward work counts only where a GEMM op launched some of it (the
  optimizer's kernels are not a forward);
- the p2p calls (`c10d::recv_`, `c10d::send`) are cut points; each is carried by the first NCCL kernel
  its thread launches from the call's start on: its own, or for `batch_isend_irecv` the one coalesced
  SendRecv kernel that carries the send and the receive together.
In host order, work and p2p calls are cut as on CPU (analysis.cells.inferred): a run of backward
kernels is a B, a run of forward kernels an F, a receive feeds the next cell and a send ships the one
before. Each rank holds one stage (its rank); the k-th F is microbatch k and each B takes its F's
microbatch through autograd's sequence numbers. A compute cell spans its kernels, a p2p cell its NCCL
kernel; the rank waits on its receives' kernels (a send's kernel runs beside the compute stream).
"""

from __future__ import annotations

import polars as pl

from analysis.cells.labelled import (
    CELL_KEY,
    CELL_SCHEMA,
    RankCells,
    RankEvents,
    _device_windows,
    _unscheduled,
    host_syncs,
    next_heads,
)
from analysis.cells.op_stream import GEMM_OPS, RECV_OPS, SEND_OPS, comm_cells, number_backwards
from analysis.traces.kineto import BACKWARD_OP_PREFIX
from analysis.traces.spans import assign_steps, union


def _inside(points: pl.DataFrame, spans: pl.DataFrame, name: str) -> pl.DataFrame:
    """`points` (rank, tid, launch_ns, ...) with a boolean column `name`: inside one of `spans` on its
    thread."""
    merged = (
        union(spans, ["rank", "tid"])
        .select("rank", "tid", span_start="start_ns", span_end="end_ns")
        .sort("span_start")
    )
    found = points.sort("launch_ns").join_asof(
        merged, left_on="launch_ns", right_on="span_start", by=["rank", "tid"], check_sortedness=False
    )
    return found.with_columns((pl.col("launch_ns") < pl.col("span_end")).fill_null(False).alias(name)).drop(
        "span_start", "span_end"
    )


def _innermost_sequence(points: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """`points` with `sequence`: the autograd sequence number of the latest-started op around the launch
    that has one (backward kernels look only at backward ops: their inner ops number other nodes)."""
    numbered = ops.filter(pl.col("sequence").is_not_null()).with_columns(
        backward_op=pl.col("name").str.starts_with(BACKWARD_OP_PREFIX)
    )
    found = []
    for backward in (False, True):
        candidates = numbered.filter(pl.col("backward_op") | pl.lit(not backward)).select(
            "rank", "tid", "sequence", op_start="start_ns", op_end="end_ns"
        )
        mine = points.filter(pl.col("backward") == backward).sort("launch_ns")
        joined = mine.join_asof(
            candidates.sort("op_start"),
            left_on="launch_ns",
            right_on="op_start",
            by=["rank", "tid"],
            check_sortedness=False,
        )
        found.append(
            joined.with_columns(
                sequence=pl.when(pl.col("launch_ns") < pl.col("op_end")).then("sequence")
            ).drop("op_start", "op_end")
        )
    return pl.concat(found)


def _work(launched: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Compute kernels with their launch, role (F or B), whether a GEMM op launched them, and sequence."""
    kernels = launched.filter(~pl.col("is_p2p"))
    kernels = _inside(kernels, ops.filter(pl.col("name").str.starts_with(BACKWARD_OP_PREFIX)), "backward")
    kernels = _inside(kernels, ops.filter(pl.col("name").is_in(GEMM_OPS)), "gemm")
    return _innermost_sequence(kernels, ops).with_columns(
        role=pl.when("backward").then(pl.lit("B")).otherwise(pl.lit("F")), at_ns="launch_ns"
    )


def _p2p_calls(launched: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Each c10d p2p call with the NCCL kernel that carries it (k_start, k_end, correlation)."""
    calls = ops.filter(pl.col("name").is_in(RECV_OPS + SEND_OPS)).select(
        "rank",
        "tid",
        at_ns="start_ns",
        call_end="end_ns",
        role=pl.when(pl.col("name").is_in(RECV_OPS)).then(pl.lit("RECV")).otherwise(pl.lit("SEND")),
    )
    nccl = launched.filter("is_p2p")
    carried = calls.sort("at_ns").join_asof(
        nccl.select(
            "rank", "tid", "launch_ns", "correlation", "issued_ns", k_start="start_ns", k_end="end_ns"
        ).sort("launch_ns"),
        left_on="at_ns",
        right_on="launch_ns",
        by=["rank", "tid"],
        strategy="forward",
        check_sortedness=False,
    )
    return carried


def _runs(work: pl.DataFrame, calls: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Work and calls in host order, each with its step and run: a run is one p2p call, or consecutive
    kernels of one role."""
    items = pl.concat(
        [
            work.select("rank", "tid", "role", "at_ns", "correlation", "gemm", "sequence"),
            calls.select("rank", "tid", "role", "at_ns", "correlation", "call_end"),
        ],
        how="diagonal_relaxed",
    )
    stepped = assign_steps(items.with_columns(start_ns="at_ns"), steps).sort("rank", "at_ns")
    changed = (pl.col("role") != pl.col("role").shift(1)) | pl.col("role").is_in(["RECV", "SEND"])
    return stepped.with_columns(run=changed.fill_null(True).cum_sum().over("rank", "step"))


def gpu_cells(events: RankEvents) -> RankCells:
    """The cells of one rank's unlabelled GPU trace (analysis.traces.load), from its rank_events."""
    host_steps, ops, device = events.steps, events.ops, events.device
    launched = device.drop_nulls("launch_ns")
    work, calls = _work(launched, ops), _p2p_calls(launched, ops)
    runs = _runs(work, calls, host_steps)
    kernel_times = device.select("rank", "correlation", k_start="start_ns", k_end="end_ns")
    timed = runs.join(kernel_times, on=["rank", "correlation"], how="left")
    compute = _compute_cells(timed)
    p2p = timed.filter(pl.col("role").is_in(["RECV", "SEND"])).with_columns(
        start_ns=pl.coalesce("k_start", "at_ns"), end_ns=pl.coalesce("k_end", "call_end")
    )
    comm = comm_cells(p2p, compute)
    cells_by_run = pl.concat(
        [
            compute.select(*CELL_KEY, "run", "start_ns", "end_ns"),
            comm.select(*CELL_KEY, "run", "start_ns", "end_ns"),
        ]
    )
    kernels = _cell_kernels(timed, cells_by_run, launched)
    waits = kernels.filter(pl.col("is_p2p") & pl.col("kind").str.starts_with("RECV")).select(
        *CELL_KEY, "start_ns", "end_ns"
    )
    blocked = waits.group_by(CELL_KEY).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("blocked_ns"))
    cells = (
        cells_by_run.join(blocked, on=CELL_KEY, how="left")
        .with_columns(pl.col("blocked_ns").fill_null(0), inferred=pl.lit(True))
        .select(pl.col(name).cast(dtype) for name, dtype in CELL_SCHEMA.items())
        .sort("rank", "start_ns")
    )
    steps = _device_windows(events.frame, host_steps, cells)
    unscheduled = _unscheduled(events, cells, kernels, steps)
    syncs = host_syncs(events.frame, host_steps)
    heads = next_heads(host_steps, kernels)
    return RankCells(
        cells, waits.sort("rank", "start_ns"), steps, kernels, unscheduled, host_syncs=syncs, next_heads=heads
    )


def _compute_cells(timed: pl.DataFrame) -> pl.DataFrame:
    """One cell per run of backward kernels, or of forward kernels some GEMM op launched."""
    per_run = (
        timed.filter(pl.col("role").is_in(["F", "B"]))
        .group_by("rank", "step", "run")
        .agg(
            pl.col("tid", "role").first(),
            start_ns=pl.col("k_start").min(),
            end_ns=pl.col("k_end").max(),
            gemm=pl.col("gemm").any(),
        )
        .filter((pl.col("role") == "B") | pl.col("gemm"))
        .sort("rank", "step", "start_ns")
    )
    numbered = per_run.with_columns(
        stage=pl.col("rank"),
        kind=pl.col("role"),
        microbatch=pl.int_range(pl.len()).over("rank", "step", "role"),
        labelled=pl.lit(False),
    )
    forwards = numbered.filter(pl.col("kind") == "F").select("rank", "step", "run", f_mb="microbatch")
    sequences = timed.drop_nulls("sequence").select("rank", "step", "run", "role", "sequence")
    of_forward = sequences.filter(pl.col("role") == "F").join(forwards, on=["rank", "step", "run"])
    of_backward = sequences.filter(pl.col("role") == "B").select("rank", "step", "run", "sequence")
    return number_backwards(numbered, of_forward.select("rank", "sequence", "f_mb"), of_backward).select(
        "rank", "tid", "step", "run", "stage", "kind", "microbatch", "start_ns", "end_ns"
    )


def _cell_kernels(timed: pl.DataFrame, cells: pl.DataFrame, launched: pl.DataFrame) -> pl.DataFrame:
    """Every kernel of a cell: CELL_KEY, launch_ns, issued_ns, is_p2p, correlation, start_ns, end_ns;
    `launched`: the device events with a launch."""
    owner = timed.select("rank", "step", "run", "correlation").drop_nulls("correlation").unique()
    return (
        owner.join(cells.select(*CELL_KEY, "run"), on=["rank", "step", "run"])
        .join(launched, on=["rank", "correlation"])
        .unique([*CELL_KEY, "correlation"])
        .select(*CELL_KEY, "launch_ns", "issued_ns", "is_p2p", "correlation", "start_ns", "end_ns")
    )
