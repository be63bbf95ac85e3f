"""Torch's fused forward+backward (DualPipeV's `PP:(0F3;3B1)OVERLAP_F_B`) cut into its two cells.

torch runs the two sub-actions one after the other inside one label, with no label of their own. The
cut is where the backward's ops begin: the forward's cell ends with the last op on the label's thread
that ended before the first autograd backward op (`autograd::engine::evaluate_function: ...`, on any
thread: on GPU the autograd engine runs on its own), and the backward's cell runs from there to the
label's end, so a wait for the backward's gradient counts to the backward. The loss gradient's seed
(`aten::ones_like`, a few microseconds) lands in the forward. Both cells carry `inferred=True`: their
boundary comes from the op stream, not from a label. A fused label with no backward op in it keeps
the whole span as its forward and gives the backward a zero-length cell at its end.
"""

from __future__ import annotations

import polars as pl

from analysis.traces.kineto import BACKWARD_OP_PREFIX
from analysis.traces.spans import rows
from runners.schedules.trace_names import OPERATOR_CATEGORY

FUSED = r"^PP:\((\d+F\d+);(\d+[BI]\d+)\)OVERLAP_F_B$"
SUB_ACTION = r"^(\d+)([A-Z]+)(\d+)$"


def _fused_labels(labels: pl.DataFrame) -> pl.DataFrame:
    parts = pl.col("name").str.extract_groups(FUSED)
    return labels.filter(
        pl.col("name").str.contains(FUSED) & (pl.col("ph") == "X") & (pl.col("cat") != "gpu_user_annotation")
    ).select(
        "rank", "tid", "start_ns", "end_ns", forward=parts.struct.field("1"), backward=parts.struct.field("2")
    )


def _cuts(frame: pl.DataFrame, fused: pl.DataFrame) -> pl.DataFrame:
    """Each fused label with `cut_ns`, where its backward begins."""
    labels = fused.with_row_index("label").with_columns(pl.col("label").cast(pl.Int64))
    ops = rows(
        frame,
        (pl.col("ph") == "X") & (pl.col("cat") == OPERATOR_CATEGORY),
        "rank",
        "name",
        "tid",
        "start_ns",
        "end_ns",
    ).rename({"tid": "op_tid", "start_ns": "op_start", "end_ns": "op_end"})
    # fused labels never overlap on a rank, so each op belongs to the latest one started before it
    inside = (
        ops.sort("op_start")
        .join_asof(
            labels.sort("start_ns"),
            left_on="op_start",
            right_on="start_ns",
            by="rank",
            check_sortedness=False,
        )
        .filter(pl.col("op_end") <= pl.col("end_ns"))
    )
    first_backward = (
        inside.filter(pl.col("name").str.starts_with(BACKWARD_OP_PREFIX))
        .group_by("label")
        .agg(backward_ns=pl.col("op_start").min())
    )
    forward_end = (
        inside.join(first_backward, on="label")
        .filter((pl.col("op_tid") == pl.col("tid")) & (pl.col("op_end") <= pl.col("backward_ns")))
        .group_by("label")
        .agg(forward_end_ns=pl.col("op_end").max())
    )
    return (
        labels.join(first_backward, on="label", how="left")
        .join(forward_end, on="label", how="left")
        .with_columns(cut_ns=pl.coalesce("forward_end_ns", "backward_ns", "end_ns"))
        .drop("label", "backward_ns", "forward_end_ns")
    )


def fused_halves(labels: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """The F and B (or I) cells inside every fused label: rank, tid, stage, kind, microbatch, start_ns,
    end_ns, as `analysis.cells.labels.label_spans` gives for plain labels. `labels`: the frame's host
    `PP:` spans (rank, tid, name, ph, start_ns, end_ns at least)."""
    fused = _fused_labels(labels)
    if fused.height == 0:
        return pl.DataFrame(
            schema={
                "rank": pl.Int64,
                "tid": pl.Int64,
                "stage": pl.Int64,
                "kind": pl.Utf8,
                "microbatch": pl.Int64,
                "start_ns": pl.Int64,
                "end_ns": pl.Int64,
            }
        )
    cut = _cuts(frame, fused)
    halves = pl.concat(
        [
            cut.select("rank", "tid", action="forward", start_ns="start_ns", end_ns="cut_ns"),
            cut.select("rank", "tid", action="backward", start_ns="cut_ns", end_ns="end_ns"),
        ]
    )
    parts = pl.col("action").str.extract_groups(SUB_ACTION)
    return halves.select(
        "rank",
        "tid",
        stage=parts.struct.field("1").cast(pl.Int64),
        kind=parts.struct.field("2"),
        microbatch=parts.struct.field("3").cast(pl.Int64),
        start_ns="start_ns",
        end_ns="end_ns",
    ).with_columns(pl.col("rank", "tid").cast(pl.Int64))
