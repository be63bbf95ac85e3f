"""Cells of a trace without `PP:` labels whose framework labels the phase of each piece of work:
`<name>(F)`, `<name>(B)`, `<name>(W)` (DeepSeek's DualPipe: `attn(F)`, `mlp(B)`, `mlp(W)`, `dispatch(F)`...).

Such a label says the kind of work, not its microbatch or stage, and one chunk of work is many of them:
DualPipe's `1F1B` annotation holds the forward chunk of one microbatch and the backward chunk of
another, overlapped, as four repeated layer blocks of ten phases. Layers are never read as
microbatches: the phases of one kind inside one enclosing annotation that is no phase label (the
innermost; with none, the step) are ONE cell of that kind; within a step the k-th cell of a kind is
microbatch k, and the stage is the rank's own (the op-stream inference's rules, analysis.cells.inferred;
RankInput.stage_is_rank). A cell spans its phases as a `PP:` label spans its action
(analysis.cells.labelled): on GPU the kernels launched inside them (by correlation id, on any thread:
autograd's engine thread launches the backward's), on CPU the operators inside them. Cells of different
kinds may overlap in time: DualPipe overlaps one chunk's F with another's B. The cells say they came
from phase labels (RankCells.phase_labels): their kind was read, their microbatch counted.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from analysis.cells.labelled import CELL_KEY, RankCells, RankEvents, labelled_cells
from analysis.traces.kineto import STEP_PREFIX
from analysis.traces.spans import assign_steps, rows

# A name (letters, digits, _ and ., not starting with a digit) and the kind in parentheses, nothing else:
# `forward(F)` and `moe.dispatch(B)` are phases; `step (F)`, `f(x)`, `attn(F) layer 3` are not.
PHASE_LABEL = r"^[A-Za-z_][A-Za-z0-9_.]*\(([FBW])\)$"
HOST_ANNOTATION = "user_annotation"


def phase_labels(events: RankEvents) -> pl.DataFrame:
    """One row per phase label in a step, as analysis.cells.labelled.step_labels gives `PP:` labels
    (rank, tid, step, stage, kind, microbatch, start_ns, end_ns, inferred): the kind its own, stage and
    microbatch its cell's (the module docstring). Empty where the trace has none."""
    annotations = rows(
        events.frame,
        (pl.col("cat") == HOST_ANNOTATION) & (pl.col("ph") == "X"),
        "rank",
        "tid",
        "name",
        "start_ns",
        "end_ns",
    ).with_columns(kind=pl.col("name").str.extract(PHASE_LABEL, 1))
    phases = annotations.filter(pl.col("kind").is_not_null())
    others = annotations.filter(pl.col("kind").is_null() & ~pl.col("name").str.starts_with(STEP_PREFIX))
    stepped = assign_steps(_enclosed(phases, others), events.steps)
    cell = ["rank", "step", "kind", "block_tid", "block_start"]
    return (
        stepped.with_columns(first=pl.col("start_ns").min().over(cell))
        .with_columns(
            stage=pl.col("rank"),
            microbatch=(pl.col("first").rank("dense").over("rank", "step", "kind") - 1).cast(pl.Int64),
            inferred=pl.lit(False),
        )
        .select("rank", "tid", "step", "stage", "kind", "microbatch", "start_ns", "end_ns", "inferred")
    )


def _enclosed(phases: pl.DataFrame, others: pl.DataFrame) -> pl.DataFrame:
    """`phases` with the innermost of `others` open on their thread at their start (block_tid,
    block_start; null where none is). Spans on a thread nest, so that one is the latest-started of
    those one level out: each span's level (how many others are open as it starts) comes from one sweep
    over their starts and ends, in time order, an end before a start at the same time, and of spans
    starting together the longer first (it holds the others)."""
    marks = pl.concat(
        [
            others.select("rank", "tid", "start_ns", "end_ns", at="end_ns", order=pl.lit(0), step=pl.lit(-1)),
            others.select(
                "rank", "tid", "start_ns", "end_ns", at="start_ns", order=pl.lit(1), step=pl.lit(1)
            ),
            phases.select(
                "rank", "tid", "start_ns", "end_ns", at="start_ns", order=pl.lit(2), step=pl.lit(0)
            ),
        ]
    ).sort("rank", "tid", "at", "order", "end_ns", descending=[False, False, False, False, True])
    marks = marks.with_columns(open=pl.col("step").cum_sum().over("rank", "tid"))
    blocks = marks.filter(pl.col("order") == 1).select(
        "rank", "tid", block_start="start_ns", level=pl.col("open") - 1
    )
    found = (
        marks.filter(pl.col("order") == 2)
        .select("rank", "tid", "start_ns", level=pl.col("open") - 1)
        .sort("start_ns")
        .join_asof(
            blocks.sort("block_start"),
            left_on="start_ns",
            right_on="block_start",
            by=["rank", "tid", "level"],
            check_sortedness=False,
        )
        .select(
            "rank",
            "tid",
            "start_ns",
            "block_start",
            block_tid=pl.when(pl.col("block_start").is_not_null()).then("tid"),
        )
        .unique(["rank", "tid", "start_ns"])
    )
    return phases.join(found, on=["rank", "tid", "start_ns"], how="left")


def phase_cells(events: RankEvents, labels: pl.DataFrame) -> RankCells:
    """The cells of a rank's phase_labels: each label a span of its cell (analysis.cells.labelled), then
    one row per cell from its first phase's start to its last's end (on GPU its kernels' span)."""
    found = labelled_cells(events, labels, annotations_are_work=False)
    cells = (
        found.cells.group_by(CELL_KEY)
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.col("blocked_ns", "inferred").first())
        .select(found.cells.columns)
        .sort("rank", "start_ns")
    )
    return replace(found, cells=cells, phase_labels=True)
