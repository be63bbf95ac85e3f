"""Cells for traces whose pipeline labels are missing or partial, inferred from the op stream.

Three shapes of trace this project did not write (torch.distributed.pipelining, hand-written loops):

- torch's multi-stage runtime labels every action `PP:<action>`, but its RECV only posts the receive;
  the rank waits inside the consuming F or B. `consumer_waits` finds that wait: from the consumer's
  start until the posted receive's data arrived (the end of its `gloo:recv`), keyed by the RECV so the
  wait is matched to its producer like any other.
- ScheduleGPipe labels `Forward i` / `Backward i` around recv + compute + send: the label gives the
  kind and microbatch, the ops inside give the cells (a RECV, the compute, a SEND).
- no labels at all (Schedule1F1B, the seed's 60-line GPipe): the rank's main-thread top-level ops are
  cut at every p2p op (`c10d::recv_`, `c10d::send`) and wherever autograd's backward ops
  (`autograd::engine::evaluate_function: ...`) start or stop; a run of backward ops is a B, a run of
  other ops holding a GEMM is an F (runs of neither, e.g. the optimizer or gradient scaling, are not
  cells). Each rank holds one stage (its rank), and the k-th F of a step is microbatch k. A B is the
  microbatch of the F it differentiates: autograd gives every backward op the sequence number of the
  forward op it belongs to, so a loop that runs its backwards in reverse (the seed's) is numbered as
  it ran; where no sequence number links them, the k-th B is microbatch k (FIFO, torch's GPipe and
  1F1B).

A recv's RECV cell runs from the recv call to its data's arrival (the later of the call's end and its
`gloo:recv` end, cut at the next op), all of it blocked; a blocking send's SEND cell from the send call
until its `gloo:send` ended (its wait included); an isend's, whose `gloo:send` runs past the next op
(until the step's wait for sends returns from it), is the call alone. Inferred cells carry `inferred=True`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl

from analysis.cells.inferred_gpu import gpu_cells
from analysis.cells.labelled import (
    CELL_KEY,
    CELL_SCHEMA,
    RankCells,
    RankEvents,
    labelled_cells,
    operator_spans,
    rank_events,
    step_end_barriers,
    step_labels,
    unscheduled_union,
)
from analysis.cells.op_stream import GEMM_OPS, RECV_OPS, SEND_OPS, comm_cells, number_backwards
from analysis.cells.phases import phase_cells, phase_labels
from analysis.traces.kineto import BACKWARD_OP_PREFIX, STEP_PREFIX
from analysis.traces.spans import assign_steps, rows
from runners.schedules.trace_names import OPERATOR_CATEGORY

TORCH_LABEL = r"^(Forward|Backward) (\d+)$"
# async spans a p2p call opens: gloo:recv until its data arrived; gloo:send until the wait returned from
# it, for an isend the step's wait for sends (real gloo traces), not its transfer
ARRIVALS = ("gloo:recv", "gloo:send")


def cells_of(
    frame: pl.DataFrame, source: str | Path | None = None, events: RankEvents | None = None
) -> RankCells:
    """A rank's cells: from `PP:` labels where the trace has them, else from a framework's phase labels
    (analysis.cells.phases), else inferred from the op stream. `events`: the frame's rank_events, where
    the caller has them."""
    events = rank_events(frame) if events is None else events
    labels = step_labels(events, source)
    if labels.height:
        return _with_consumer_waits(labelled_cells(events, labels), frame)
    phases = phase_labels(events)
    if phases.height:
        return phase_cells(events, phases)
    if events.device is not None:
        return gpu_cells(events)
    if frame.height == 0:
        return labelled_cells(events, labels)
    steps = events.steps
    ops = assign_steps(_top_level_ops(events), steps)
    labels = _cells_from_ops(_with_torch_labels(ops, frame), frame)
    waits = labels.filter(pl.col("kind").str.starts_with("RECV")).select(*CELL_KEY, "start_ns", "end_ns")
    cells = (
        labels.with_columns(
            blocked_ns=pl.when(pl.col("kind").str.starts_with("RECV"))
            .then(pl.col("end_ns") - pl.col("start_ns"))
            .otherwise(0),
            inferred=pl.lit(True),
        )
        .select(pl.col(name).cast(dtype) for name, dtype in CELL_SCHEMA.items())
        .sort("rank", "start_ns")
    )
    unscheduled = _unscheduled_ops(ops, labels)
    return RankCells(
        cells,
        waits.sort("rank", "start_ns"),
        steps,
        None,
        unscheduled,
        operator_spans(events.ops, labels),
        barriers=step_end_barriers(frame, steps),
    )


def _main_thread(frame: pl.DataFrame) -> pl.Expr:
    """The thread that ran the steps (else the one with the most ops)."""
    marked = rows(frame, pl.col("name").str.starts_with(STEP_PREFIX), "tid")["tid"]
    if marked.len():
        return pl.col("tid") == marked[0]
    busiest = rows(frame, pl.col("cat") == OPERATOR_CATEGORY, "tid")["tid"].mode()
    return (
        pl.col("tid") == busiest[0] if busiest.len() else pl.lit(False)
    )  # no CPU ops: nothing to infer from


def _top_level_ops(events: RankEvents) -> pl.DataFrame:
    """CPU ops on the main thread not nested in another op, with the async end of each p2p call.

    Of spans that start together the longer holds the others (Chrome's rule), except a p2p call that
    took no time (whole microseconds, or a clock too coarse): it is taken to end where it starts, before
    the op starting with it, so it still cuts the op stream there."""
    frame = events.frame
    is_p2p = pl.col("name").is_in(RECV_OPS + SEND_OPS)
    is_send = pl.col("name").is_in(SEND_OPS)
    # an isend's gloo:send outlives the next op: it ends when the step's wait returns from it (real gloo
    # traces), not when its data moved, so the call alone is the send; a blocking send's ends before
    outlives = (pl.col("arrival_ns") > pl.col("next_start")).fill_null(True)
    ops = (
        events.ops.filter(_main_thread(frame))
        .sort(
            "start_ns",
            is_p2p & (pl.col("end_ns") == pl.col("start_ns")),
            "end_ns",
            descending=[False, True, True],
        )
        .with_columns(outer_end=pl.col("end_ns").cum_max().shift(1))
        .filter(pl.col("outer_end").is_null() | (pl.col("start_ns") >= pl.col("outer_end")))
        .select("rank", "tid", "name", "sequence", "start_ns", "end_ns")
    )
    arrivals = rows(frame, pl.col("name").is_in(ARRIVALS), "rank", "tid", "start_ns", "end_ns").rename(
        {"start_ns": "arrival_start", "end_ns": "arrival_ns"}
    )
    return (
        ops.join_asof(
            arrivals.sort("arrival_start"),
            left_on="start_ns",
            right_on="arrival_start",
            by=["rank", "tid"],
            strategy="forward",
            check_sortedness=False,
        )
        .with_columns(next_start=pl.col("start_ns").shift(-1))
        .with_columns(
            # a p2p op's span reaches its data's arrival (gloo's span that the call opened, not a later
            # call's), but never into the next op
            end_ns=pl.when(is_p2p & (pl.col("arrival_start") <= pl.col("end_ns")) & ~(is_send & outlives))
            .then(pl.max_horizontal("end_ns", "arrival_ns"))
            .otherwise("end_ns"),
        )
        .with_columns(end_ns=pl.min_horizontal("end_ns", pl.col("next_start").fill_null(pl.col("end_ns"))))
        .drop("arrival_start", "arrival_ns", "next_start")
    )


def _with_torch_labels(ops: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """Each op's enclosing `Forward i`/`Backward i` label as (label_kind, label_microbatch), else null."""
    parts = pl.col("name").str.extract_groups(TORCH_LABEL)
    labels = (
        rows(
            frame,
            pl.col("name").str.contains(TORCH_LABEL) & (pl.col("ph") == "X"),
            "rank",
            "tid",
            "name",
            "start_ns",
            "end_ns",
        )
        .select(
            "rank",
            "tid",
            label_start="start_ns",
            label_end="end_ns",
            label_kind=parts.struct.field("1").str.slice(0, 1),
            label_microbatch=parts.struct.field("2").cast(pl.Int64),
        )
        .sort("label_start")
    )
    joined = ops.sort("start_ns").join_asof(
        labels, left_on="start_ns", right_on="label_start", by=["rank", "tid"], check_sortedness=False
    )
    inside = pl.col("start_ns") < pl.col("label_end")
    return joined.with_columns(
        label_kind=pl.when(inside).then("label_kind"),
        label_microbatch=pl.when(inside).then("label_microbatch"),
    ).drop("label_start", "label_end")


def _runs(ops: pl.DataFrame) -> pl.DataFrame:
    """Ops tagged with a role (RECV, SEND, F, B) and a run: consecutive compute ops of one role and
    one label, cut at every p2p op."""
    role = (
        pl.when(pl.col("name").is_in(RECV_OPS))
        .then(pl.lit("RECV"))
        .when(pl.col("name").is_in(SEND_OPS))
        .then(pl.lit("SEND"))
        .when(pl.col("label_kind").is_not_null())
        .then("label_kind")
        .when(pl.col("name").str.starts_with(BACKWARD_OP_PREFIX))
        .then(pl.lit("B"))
        .otherwise(pl.lit("F"))
    )
    ops = ops.sort("rank", "start_ns", "end_ns").with_columns(role=role)  # (a p2p call of no time first)
    changed = (
        (pl.col("role") != pl.col("role").shift(1))
        | pl.col("role").is_in(["RECV", "SEND"])
        | (pl.col("label_microbatch") != pl.col("label_microbatch").shift(1)).fill_null(False)
    )
    return ops.with_columns(run=changed.fill_null(True).cum_sum().over("rank", "step"))


def _compute_cells(runs: pl.DataFrame) -> pl.DataFrame:
    """One cell per run of backward ops, or of forward ops holding a GEMM (or inside a torch label)."""
    per_run = (
        runs.filter(pl.col("role").is_in(["F", "B"]))
        .group_by("rank", "step", "run")
        .agg(
            pl.col("tid", "role", "label_microbatch").first(),
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            has_gemm=pl.col("name").is_in(GEMM_OPS).any(),
        )
        .filter((pl.col("role") == "B") | pl.col("has_gemm") | pl.col("label_microbatch").is_not_null())
        .sort("rank", "step", "start_ns")
    )
    order = pl.int_range(pl.len()).over("rank", "step", "role")
    return per_run.with_columns(
        stage=pl.col("rank"),
        kind=pl.col("role"),
        microbatch=pl.coalesce("label_microbatch", order),
        labelled=pl.col("label_microbatch").is_not_null(),
    ).select("rank", "tid", "step", "run", "stage", "kind", "microbatch", "labelled", "start_ns", "end_ns")


def _cells_from_ops(ops: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    runs = _runs(ops)
    compute = _linked_backwards(_compute_cells(runs), runs, frame)
    return pl.concat([compute, comm_cells(runs, compute)]).sort("rank", "start_ns")


def _linked_backwards(compute: pl.DataFrame, runs: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """The B's numbered by their forwards (`number_backwards`): a forward op belongs to the F cell whose
    span holds its start, a backward op to its run."""
    forwards = compute.filter(pl.col("kind") == "F").select(
        "rank", f_start="start_ns", f_end="end_ns", f_mb="microbatch"
    )
    forward_ops = rows(
        frame,
        (pl.col("cat") == OPERATOR_CATEGORY)
        & pl.col("sequence").is_not_null()
        & ~pl.col("name").str.starts_with(BACKWARD_OP_PREFIX),
        "rank",
        "sequence",
        "start_ns",
    )
    of_forward = (
        forward_ops.sort("start_ns")
        .join_asof(
            forwards.sort("f_start"),
            left_on="start_ns",
            right_on="f_start",
            by="rank",
            check_sortedness=False,
        )
        .filter(pl.col("start_ns") < pl.col("f_end"))
        .select("rank", "sequence", "f_mb")
    )
    backward_ops = runs.filter((pl.col("role") == "B") & pl.col("sequence").is_not_null())
    return number_backwards(compute, of_forward, backward_ops.select("rank", "step", "run", "sequence"))


def _unscheduled_ops(ops: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """Top-level ops outside every inferred cell (loss, gradient scaling, the optimizer...)."""
    cells = labels.select("rank", "step", cell_start="start_ns", cell_end="end_ns").sort("cell_start")
    outside = (
        ops.sort("start_ns")
        .join_asof(
            cells, left_on="start_ns", right_on="cell_start", by=["rank", "step"], check_sortedness=False
        )
        .filter(pl.col("cell_end").is_null() | (pl.col("start_ns") >= pl.col("cell_end")))
        .select("rank", "step", "start_ns", "end_ns")
    )
    return unscheduled_union(outside)


def consumer_waits(frame: pl.DataFrame, cells: pl.DataFrame) -> pl.DataFrame:
    """Waits of posted receives inside their consumer: from the F (or B/I) start until the data arrived.

    A receive is posted inside its RECV label (its `gloo:recv` starts there) and arrives at that span's
    end; where that is after the consumer started, the consumer waited. Keyed by the RECV cell (so the
    wait is matched to its producer), with the consumer's kind in `consumer`."""
    recvs = cells.filter(pl.col("kind").str.starts_with("RECV")).select(
        *CELL_KEY, recv_start="start_ns", recv_end="end_ns"
    )
    posted = rows(frame, pl.col("name") == "gloo:recv", "rank", "start_ns", "end_ns").rename(
        {"start_ns": "post_ns", "end_ns": "arrival_ns"}
    )
    arrivals = (
        posted.sort("post_ns")
        .join_asof(
            recvs.sort("recv_start"),
            left_on="post_ns",
            right_on="recv_start",
            by="rank",
            check_sortedness=False,
        )
        .filter(pl.col("post_ns") < pl.col("recv_end"))
        .with_columns(
            consumer=pl.when(pl.col("kind") == "RECV_F").then(pl.lit(["F"])).otherwise(pl.lit(["B", "I"]))
        )
        .explode("consumer")
    )
    consumers = cells.select(
        "rank", "step", "stage", "microbatch", consumer="kind", c_start="start_ns", c_end="end_ns"
    )
    return (
        arrivals.join(consumers, on=["rank", "step", "stage", "microbatch", "consumer"])
        .select(*CELL_KEY, "consumer", start_ns="c_start", end_ns=pl.min_horizontal("arrival_ns", "c_end"))
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )


def _with_consumer_waits(labelled: RankCells, frame: pl.DataFrame) -> RankCells:
    """The consumer waits join the rank's waits (keyed by their RECV) and count as blocked time of the
    consumer, the cell that spent it waiting (a replay must not take it for compute)."""
    extra = consumer_waits(frame, labelled.cells)
    if extra.height == 0:
        return labelled
    waits = pl.concat([labelled.waits, extra.drop("consumer")]).sort("rank", "start_ns")
    blocked = extra.group_by("rank", "step", "stage", "microbatch", kind="consumer").agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("extra")
    )
    cells = (
        labelled.cells.join(blocked, on=CELL_KEY, how="left")
        .with_columns(blocked_ns=pl.col("blocked_ns") + pl.col("extra").fill_null(0))
        .drop("extra")
    )
    return replace(labelled, cells=cells, waits=waits)
