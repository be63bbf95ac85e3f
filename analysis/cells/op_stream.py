"""What the op-stream inference of cells shares on CPU (analysis.cells.inferred) and GPU
(analysis.cells.inferred_gpu): the ops that mark p2p calls and matrix work, how p2p cells take their
kind and microbatch from the compute cells around them, and how a backward finds its forward.
"""

from __future__ import annotations

import polars as pl

RECV_OPS = ("c10d::recv_",)
SEND_OPS = ("c10d::send",)
# Ops that make a run of forward ops a forward: matrix work (a stage without it computes nothing).
GEMM_OPS = (
    "aten::linear",
    "aten::mm",
    "aten::addmm",
    "aten::matmul",
    "aten::bmm",
    "aten::baddbmm",
    "aten::convolution",
    "aten::scaled_dot_product_attention",
)


def comm_cells(runs: pl.DataFrame, compute: pl.DataFrame) -> pl.DataFrame:
    """A RECV feeds the next compute cell (RECV_F before an F); a SEND ships the previous one's result."""
    marks = compute.select("rank", "step", "run", "stage", next_kind="kind", next_microbatch="microbatch")
    found = []
    for role, strategy in (("RECV", "forward"), ("SEND", "backward")):
        comm = runs.filter(pl.col("role") == role).sort("run")
        joined = comm.join_asof(
            marks.sort("run"), on="run", by=["rank", "step"], strategy=strategy, check_sortedness=False
        )
        found.append(
            joined.drop_nulls("next_kind").select(
                "rank",
                "tid",
                "step",
                "run",
                "stage",
                pl.concat_str(pl.lit(f"{role}_"), "next_kind").alias("kind"),
                pl.col("next_microbatch").alias("microbatch"),
                "start_ns",
                "end_ns",
            )
        )
    return pl.concat(found)


def number_backwards(
    compute: pl.DataFrame, of_forward: pl.DataFrame, of_backward: pl.DataFrame
) -> pl.DataFrame:
    """Each unlabelled B takes the microbatch of the F whose ops carry its backward ops' sequence numbers
    (torch's forward-backward link); a B whose ops link to no F keeps its place in the order.

    `of_forward`: (rank, sequence, f_mb), the forward ops of each F; `of_backward`: (rank, step, run,
    sequence), the backward ops of each run; `compute` has the runs' cells with a `labelled` column.

    A run's F is the one its ops' sequences name most often (the smallest on a tie), every pair of a
    backward and a forward op sharing a sequence counted: as counts per (sequence, F) times counts per
    (run, sequence), since the pairs themselves can be billions (a real GPU trace whose one sequence
    number tags 115k forward and 252k backward kernels)."""
    forwards = of_forward.group_by("rank", "sequence", "f_mb").agg(n_f=pl.len().cast(pl.Int64))
    backwards = of_backward.group_by("rank", "step", "run", "sequence").agg(n_b=pl.len().cast(pl.Int64))
    run = ["rank", "step", "run"]
    pairs = (
        backwards.join(forwards, on=["rank", "sequence"])
        .group_by(*run, "f_mb")
        .agg(pairs=(pl.col("n_b") * pl.col("n_f")).sum())
    )
    linked = (
        pairs.filter(pl.col("pairs") == pl.col("pairs").max().over(run))
        .group_by(run)
        .agg(linked=pl.col("f_mb").min())
    )
    is_backward = (pl.col("kind") == "B") & ~pl.col("labelled") & pl.col("linked").is_not_null()
    return (
        compute.join(linked, on=["rank", "step", "run"], how="left")
        .with_columns(microbatch=pl.when(is_backward).then("linked").otherwise("microbatch"))
        .drop("linked", "labelled")
    )
