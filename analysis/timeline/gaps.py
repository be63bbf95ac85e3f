"""A rank's device timeline per step: when it computed, and the idle gaps in between.

Busy is the device doing schedule work: on GPU the non-NCCL kernels of compute cells, on CPU the
main thread inside compute cells minus any time blocked on a peer there. Everything else in the
rank's step span is idle. Other facts about the timeline (waits on a peer, host actions, launched
but not yet running kernels) come in as named layers; the timeline is cut into elementary segments
where every layer's coverage is constant, so classification is a per-segment expression.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from analysis.cells.labelled import RankCells
from analysis.vocabulary import GapClass
from runners.schedules import COMPUTE_KINDS

INTERVAL = ["rank", "step", "layer", "start_ns", "end_ns"]


def layer(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    """Intervals (rank, step, start_ns, end_ns) tagged as one named layer."""
    return frame.select("rank", "step", pl.lit(name).alias("layer"), "start_ns", "end_ns")


def busy_intervals(rank: RankCells) -> pl.DataFrame:
    """Time work ran, the `busy` layer: on GPU the compute kernels of compute cells, on CPU the operators
    inside them (minus blocked time, which the segments subtract)."""
    compute = pl.col("kind").is_in(COMPUTE_KINDS)
    if rank.kernels is not None:
        return layer(rank.kernels.filter(compute & ~pl.col("is_p2p")), "busy")
    if rank.ops is not None:
        return layer(rank.ops, "busy")
    return layer(rank.cells.filter(compute), "busy")


def issued_intervals(rank: RankCells) -> pl.DataFrame:
    """GPU only: from the end of a compute kernel's launch call to its start (queued, not running)."""
    if rank.kernels is None:
        return pl.DataFrame(
            schema={
                "rank": pl.Int64,
                "step": pl.Int64,
                "layer": pl.Utf8,
                "start_ns": pl.Int64,
                "end_ns": pl.Int64,
            }
        )
    return layer(queued(rank.kernels.filter(~pl.col("is_p2p")), ("rank", "step")), "issued")


def queued(kernels: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    """Per kernel (analysis.cells.labelled.device_events columns) the stretch from its launch call's end to its
    start: issued by the host, not yet running."""
    return kernels.drop_nulls("issued_ns").select(*keys, start_ns="issued_ns", end_ns="start_ns")


def segments(
    intervals: pl.DataFrame,
    windows: pl.DataFrame,
    names: tuple[str, ...],
    keys: tuple[str, ...] = ("rank", "step"),
) -> pl.DataFrame:
    """Cut each window (one per `keys`: a rank's step, or a stream) at every interval edge; one column
    per layer with its coverage, in order of keys and start_ns.

    `intervals` has the keys, layer, start_ns, end_ns; `windows` the keys, start_ns, end_ns. Intervals
    are clipped to their window. Coverage is a running sum of +1 at starts and -1 at ends: each window's
    edges sum to zero, so one running sum over the windows in order serves them all.
    """
    numbered = windows.select(keys).unique().sort(keys).with_row_index("window")  # in order of keys
    bounds = windows.select(*keys, w0="start_ns", w1="end_ns").join(numbered, on=list(keys))
    clipped = (
        intervals.rechunk()  # a concatenation's chunks make the join slower than copying them once
        .join(bounds, on=list(keys))
        .with_columns(
            start_ns=pl.max_horizontal("start_ns", "w0"),
            end_ns=pl.min_horizontal("end_ns", "w1"),
            layer=pl.col("layer").cast(pl.Enum(names), strict=False).to_physical(),  # names' index
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )
    edges = pl.concat(
        [
            clipped.select("window", "layer", t="start_ns", delta=pl.lit(1)),
            clipped.select("window", "layer", t="end_ns", delta=pl.lit(-1)),
            bounds.select("window", layer=pl.lit(None), t="w0", delta=pl.lit(0)),
            bounds.select("window", layer=pl.lit(None), t="w1", delta=pl.lit(0)),
        ],
        how="vertical_relaxed",
    )
    coverage = [  # layers compared as integers: a string comparison per edge and layer costs more
        pl.when(pl.col("layer") == index).then(pl.col("delta")).otherwise(0).cum_sum().alias(name)
        for index, name in enumerate(names)
    ]
    same_window = pl.col("window") == pl.col("window").shift(-1)
    return (
        edges.sort("t")  # two single-key sorts, the second stable: cheaper than one on (window, t)
        .sort("window", maintain_order=True)
        .with_columns(coverage)
        .filter(~(same_window & (pl.col("t") == pl.col("t").shift(-1))).fill_null(False))  # an edge's last
        .with_columns(end_ns=pl.when(same_window).then(pl.col("t").shift(-1)))
        .filter(pl.col("end_ns") > pl.col("t"))
        .select(
            *(pl.lit(numbered[key]).gather(pl.col("window")) for key in keys),  # window w is numbered's row w
            pl.col("t").alias("start_ns"),
            "end_ns",
            *names,
        )
    )


def runs(labelled: pl.DataFrame, column: str, keys: tuple[str, ...] = ("rank", "step")) -> pl.DataFrame:
    """Merge adjacent segments of a window (one per `keys`) that carry the same value of `column`;
    `labelled` in order of keys and start_ns, as segments returns it (and so do runs). A run opens at
    a row where the keys or the value change or a hole precedes it, and ends at the row before the next."""
    differs = [pl.col(name) != pl.col(name).shift(1) for name in (*keys, column)]
    first = pl.any_horizontal(*differs, pl.col("start_ns") != pl.col("end_ns").shift(1)).fill_null(True)
    marked = labelled.select(*keys, column, "start_ns", "end_ns", first=first)  # only what is kept
    ends = marked.filter(pl.col("first").shift(-1).fill_null(True))["end_ns"]
    return marked.filter("first").select(*keys, column, "start_ns", end_ns=ends)


WAIT_LAYERS = ("bubble_wait", GapClass.P2P_WAIT, "unmatched_wait")
# unposted (analysis.timeline.waits.split_waits): a blocking SEND before its receiver posted; not a wait layer, it makes
# nothing idle (a SEND cell is idle on CPU anyway)
# host_sync: GPU, the host blocked in a synchronize call (RankCells.host_syncs); next_head: GPU, the next
# step's host getting to its first launch (RankCells.next_heads)
LAYERS = (
    "busy",
    "issued",
    "action",
    "sending",
    "unposted",
    "active",
    "head",
    "ready_head",
    "unscheduled",
    "host_sync",
    "next_head",
    *WAIT_LAYERS,
)


def windows(rank: RankCells) -> pl.DataFrame:
    """The rank's analysed steps: ProfilerStep spans holding cells (one span if the trace has none)."""
    if rank.steps.height == 0:
        return rank.cells.group_by("rank", "step").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    return rank.steps.join(rank.cells.select("rank", "step").unique(), on=["rank", "step"])


def aligned_starts(ranks: list[RankCells]) -> list[RankCells]:
    """The ranks (on one clock) with step windows that open no earlier than the step's last-opening
    window, unless the rank computes before that. In a loop without a barrier at the end of a step
    (others' traces; our runners add one), a rank that finished the previous step early opens its next
    ProfilerStep at once and waits in it for the ranks still finishing. That wait is the previous step's;
    counted in this one, it would make the step time, the longest window, read long."""
    opened = (
        pl.concat([rank.steps for rank in ranks]).group_by("step").agg(last_open=pl.col("start_ns").max())
    )
    aligned = []
    for rank in ranks:
        first_compute = (
            rank.cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
            .group_by("rank", "step")
            .agg(first_compute=pl.col("start_ns").min())
        )
        steps = (
            rank.steps.join(opened, on="step", how="left")
            .join(first_compute, on=["rank", "step"], how="left")
            .with_columns(
                start_ns=pl.max_horizontal("start_ns", pl.min_horizontal("last_open", "first_compute"))
            )
            .select(rank.steps.columns)
        )
        aligned.append(replace(rank, steps=steps))
    return aligned


def _active(cells: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step) from the first action's start to the last one's end; outside it the rank had
    nothing of the schedule to do (the pipeline's fill and drain)."""
    return cells.group_by("rank", "step").agg(pl.col("start_ns").min(), pl.col("end_ns").max())


def _compute_stream_work(cells: pl.DataFrame) -> pl.DataFrame:
    """GPU: the cells the compute stream runs or waits for; a send runs on the NCCL stream, so once the
    last of these is done the rank's work of the step is over (drain), whatever its sends still do."""
    return cells.filter(~pl.col("kind").str.starts_with("SEND"))


def _head(cells: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step) everything before the first action (the step window clips the open start)."""
    first = pl.col("start_ns").min()
    return cells.group_by("rank", "step").agg((first - 2**62).alias("start_ns"), first.alias("end_ns"))


def _ready_head(cells: pl.DataFrame) -> pl.DataFrame:
    """The heads (`_head`) of the steps whose first action is compute, which waits on no peer's cell: the
    rank had work from the step's start (the first stage's forward)."""
    first = cells.sort("start_ns").group_by("rank", "step").first()
    return _head(first.filter(pl.col("kind").is_in(COMPUTE_KINDS)))


def timeline(rank: RankCells, waits: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Elementary segments of each step window with coverage of LAYERS (the work outside the schedule
    as the union of its spans per step, as the rank's cells keep it: only whether some runs matters,
    and nested operators are most of a CPU trace's spans).

    `waits` are this rank's blocked intervals already split into WAIT_LAYERS (analysis.timeline.waits.split_waits),
    INTERVAL columns; `steps` its `windows`. A segment is idle when nothing busy covers it or a wait
    does.
    """
    intervals = pl.concat(
        [
            busy_intervals(rank),
            issued_intervals(rank),
            layer(rank.cells, "action"),
            layer(rank.cells.filter(pl.col("kind").str.starts_with("SEND")), "sending"),
            layer(
                _active(rank.cells if rank.kernels is None else _compute_stream_work(rank.cells)), "active"
            ),
            layer(_head(rank.cells), "head"),
            layer(_ready_head(rank.cells), "ready_head"),
            layer(rank.unscheduled, "unscheduled"),  # (a union per step already: RankCells)
            *([] if rank.host_syncs is None else [layer(rank.host_syncs, "host_sync")]),
            *([] if rank.next_heads is None else [layer(rank.next_heads, "next_head")]),
            waits.select(INTERVAL),
        ],
        how="vertical_relaxed",
    )
    cut = segments(intervals, steps, LAYERS)
    if rank.kernels is not None:  # a compute kernel running is busy, whatever a comm stream does meanwhile
        return cut.with_columns(idle=pl.col("busy") == 0)
    # one host thread: blocked on a peer inside a compute cell (a posted receive's wait) is not work
    return cut.with_columns(idle=(pl.col("busy") == 0) | (pl.sum_horizontal(WAIT_LAYERS) > 0))
