"""One row per executed pipeline action, from a rank's loaded trace frame (analysis.traces.load.load_trace).

A cell is a `PP:<action>` label. On CPU traces the label's span is the cell; on GPU traces the
kernels launched inside the label (runtime launch -> kernel, matched by correlation id) give the
device span, which is what counts. Time a cell spends blocked on a peer (a gloo recv on CPU, an NCCL
kernel on GPU) is kept as `waits`, one row per blocked interval, clipped to its cell.

Unlabelled traces yield no cells here; inferring cells from op patterns is a separate later pass that
appends rows with `inferred=True` (the column exists so that pass needs no schema change).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import polars as pl
import polars.selectors as cs

from analysis.cells.labels import TORCH_HOUSEKEEPING, label_spans
from analysis.traces.kineto import DEVICE_WORK_CATS, STEP_PREFIX
from analysis.traces.spans import assign_steps, rows, step_spans, union
from runners.schedules import COMPUTE_KINDS
from runners.schedules.trace_names import LABEL_PREFIX, OPERATOR_CATEGORY, STEP_END_BARRIER, WAIT_SENDS

# Blocking p2p waits on the host thread: the recv call and gloo's span of it (gloo may block inside the
# call before its span opens, or inside the span), until the data arrived.
HOST_WAIT_NAMES = ("gloo:recv", "c10d::recv_")
SYNCHRONIZE = r"^(cuda|hip)(Device|Stream|Event)Synchronize$"
# Host spans that are not work of the rank's own: labels, steps, waits on peers, and async comm spans
# that outlive the call that started them (gloo:send runs until the peer has the data).
NOT_HOST_WORK = (LABEL_PREFIX, STEP_PREFIX, WAIT_SENDS, STEP_END_BARRIER, "gloo:", "nccl:")

CELL_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "stage": pl.Int64,
    "kind": pl.Utf8,
    "microbatch": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "blocked_ns": pl.Int64,
    "inferred": pl.Boolean,
}
CELL_KEY = ["rank", "step", "stage", "kind", "microbatch"]


@dataclass(frozen=True)
class RankCells:
    """A rank's cells, the p2p waits inside them, its step windows (on the device's timeline), what ran
    inside its compute cells (GPU: the cells' kernels; CPU: its operators) and the work outside them."""

    cells: pl.DataFrame
    waits: pl.DataFrame  # CELL_KEY + start_ns, end_ns
    steps: pl.DataFrame  # rank, step, start_ns, end_ns
    kernels: (
        pl.DataFrame | None
    )  # GPU: CELL_KEY + start_ns, end_ns, launch_ns, issued_ns, is_p2p; None on CPU
    # rank, step, start_ns, end_ns: the union per step of the work outside every action (optimizer...)
    unscheduled: pl.DataFrame
    ops: pl.DataFrame | None = None  # CPU: CELL_KEY + start_ns, end_ns, the union of operator spans per cell
    # CPU, our executor: rank, step, start_ns, end_ns of its wait for pending sends after the last action
    send_waits: pl.DataFrame | None = None
    # GPU: rank, step, start_ns, end_ns of the host's synchronize calls (blocked until the device is done)
    host_syncs: pl.DataFrame | None = None
    # CPU, our runners: rank, step, start_ns, end_ns of the step-end barrier (absent: the loop has none)
    barriers: pl.DataFrame | None = None
    # GPU: rank, step, start_ns, end_ns of the next step's host getting to its first launch (next_heads)
    next_heads: pl.DataFrame | None = None
    # CPU, labelled: CELL_KEY + outlives for each SEND cell with a gloo:send span (send_spans)
    sends: pl.DataFrame | None = None
    # the cells are of a framework's phase labels (analysis.cells.phases): kind read, microbatch counted
    phase_labels: bool = False

    def map(self, change: Callable[[pl.DataFrame], pl.DataFrame]) -> RankCells:
        """The same rank with `change` applied to each of its frames."""
        frames = {field.name: getattr(self, field.name) for field in fields(self)}
        return replace(self, **{n: change(f) for n, f in frames.items() if isinstance(f, pl.DataFrame)})


@dataclass(frozen=True)
class RankEvents:
    """What the cell passes read of a rank's frame, each selected from it once."""

    frame: pl.DataFrame
    steps: pl.DataFrame  # step_spans: the host's
    device: pl.DataFrame | None  # device_events; None on a CPU trace (no kernels)
    ops: pl.DataFrame  # its CPU operators: rank, tid, name, sequence, start_ns, end_ns


def rank_events(frame: pl.DataFrame) -> RankEvents:
    # the op-stream inference reads `sequence`; a frame built by hand for the labels may lack it
    columns = cs.by_name("rank", "tid", "name", "sequence", "start_ns", "end_ns", require_all=False)
    ops = rows(frame, (pl.col("ph") == "X") & (pl.col("cat") == OPERATOR_CATEGORY), columns)
    device = device_events(frame) if is_gpu(frame) else None
    return RankEvents(frame, step_spans(frame), device, ops)


def cat_in(frame: pl.DataFrame, wanted: Callable[[str], bool]) -> pl.Expr:
    """`cat` is one of the frame's categories whose lower-cased name is `wanted`: the test runs once per
    distinct category, not once per event."""
    return pl.col("cat").is_in([c for c in frame["cat"].unique().drop_nulls() if wanted(c.lower())])


def is_gpu(frame: pl.DataFrame) -> bool:
    return any(c.lower() == "kernel" for c in frame["cat"].unique().drop_nulls())


def _device_windows(frame: pl.DataFrame, host: pl.DataFrame, cells: pl.DataFrame) -> pl.DataFrame:
    """GPU step windows: Kineto's device-side step spans, else the device's own: from the step's first
    cell to the next step's first cell; the last step runs to its last cell or its host span's end,
    whichever is later. The host runs ahead of the device, so host spans cut the device's work apart
    and two steps stretched over their cells would overlap."""
    device = step_spans(frame, on_device=True)
    if device.height:
        return device
    reach = cells.group_by("rank", "step").agg(
        pl.col("start_ns").min().alias("first"), pl.col("end_ns").max().alias("last")
    )
    return (
        host.join(reach, on=["rank", "step"], how="left")
        .sort("rank", "start_ns")
        .with_columns(
            start_ns=pl.coalesce("first", "start_ns"),
            end_ns=pl.coalesce(pl.col("first").shift(-1).over("rank"), pl.max_horizontal("end_ns", "last")),
        )
        .drop("first", "last")
    )


def _events_in_labels(
    events: pl.DataFrame,
    labels: pl.DataFrame,
    across_threads: bool = False,
    carried: Sequence[str] = CELL_KEY[1:],
) -> pl.DataFrame:
    """Host events that start inside a label on the same thread (PP labels never overlap there), with the
    label's `carried` columns, label_start and label_end. With `across_threads`, an event of a thread
    that holds no label belongs to the label open at that moment on its rank: on CUDA autograd's engine
    thread launches a backward's kernels while the B label waits on the main thread."""
    keyed = labels.select("rank", "tid", *carried, label_start="start_ns", label_end="end_ns")

    def inside(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
        return (
            frame.sort("start_ns")
            .join_asof(
                keyed.sort("label_start"),
                left_on="start_ns",
                right_on="label_start",
                by=by,
                check_sortedness=False,
                suffix="_label",
            )
            .filter(pl.col("start_ns") < pl.col("label_end"))
        )

    same_thread = inside(events, ["rank", "tid"])
    if not across_threads:
        return same_thread
    unlabelled = events.join(labels.select("rank", "tid").unique(), on=["rank", "tid"], how="anti")
    return pl.concat([same_thread, inside(unlabelled, ["rank"]).drop("tid_label")])


def _cell_ids(labels: pl.DataFrame) -> pl.DataFrame:
    """`labels` with `cell`: one number per CELL_KEY, a cheaper key to sort and merge spans by."""
    return labels.with_columns(cell=pl.struct(CELL_KEY).rank("dense"))


def _clipped(events: pl.DataFrame, cells: pl.DataFrame) -> pl.DataFrame:
    """The events inside the labels of `cells` (with _cell_ids), clipped to them: cell, start_ns, end_ns."""
    inside = _events_in_labels(events, cells, carried=["cell"])
    return inside.select("cell", "start_ns", pl.min_horizontal("end_ns", "label_end").alias("end_ns"))


def _cell_union(spans: pl.DataFrame, cells: pl.DataFrame) -> pl.DataFrame:
    """Per cell the union of `spans` (cell, start_ns, end_ns), each piece with its cell's CELL_KEY from
    `cells` (with _cell_ids; inferred cells may share a key): only the number travels through the union
    of the many spans."""
    pieces = union(spans, ["cell"])
    keys = cells.select(*CELL_KEY, "cell").unique()
    return pieces.join(keys, on="cell", how="left", maintain_order="left").select(
        *CELL_KEY, "start_ns", "end_ns"
    )


def operator_spans(ops: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """CPU: when each compute cell's work ran, the union of its operators' spans (RankEvents.ops) inside
    it on its thread, clipped to it (CELL_KEY, start_ns, end_ns); the host time between operators
    (Python, dispatch, a sleep) is not work. A cell with no operator inside (a trace of labels alone) is
    work throughout."""
    compute = _cell_ids(labels.filter(pl.col("kind").is_in(COMPUTE_KINDS)))
    inside = _clipped(ops.select("rank", "tid", "start_ns", "end_ns"), compute)
    bare = compute.filter(~pl.col("cell").is_in(inside["cell"].unique().implode())).select(
        "cell", "start_ns", "end_ns"
    )
    return _cell_union(pl.concat([inside, bare]), compute)


def _host_waits(frame: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """Each label's blocked time on the host: the union of the wait spans inside it, clipped to it."""
    waits = rows(frame, pl.col("name").is_in(HOST_WAIT_NAMES), "rank", "tid", "start_ns", "end_ns")
    cells = _cell_ids(labels)
    return _cell_union(_clipped(waits, cells), cells)


def host_syncs(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """The host's synchronize calls (cudaDeviceSynchronize, cudaStreamSynchronize, ...: the host blocked
    until the device's work is done, as Megatron's p2p waits for its sends), by step."""
    runtime = cat_in(frame, lambda cat: "runtime" in cat)
    calls = rows(frame, runtime & pl.col("name").str.contains(SYNCHRONIZE), "rank", "start_ns", "end_ns")
    return assign_steps(calls, steps).select("rank", "step", "start_ns", "end_ns")


def next_heads(host_steps: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """GPU: from each step's host span start to the end of its first launch call, under the previous
    step's number: the device's window of that step closes at this step's first kernel, so the host
    getting to it lies in that window. Only where that kernel ran as soon as it was issued: one that then
    waited (a host far ahead of its device, as op-level timelines are converted) did not wait for the host."""
    first = kernels.sort("issued_ns").group_by("rank", "step").first()
    issued = first.filter(pl.col("start_ns") <= pl.col("issued_ns")).select(
        "rank", "step", end_ns="issued_ns"
    )
    return (
        host_steps.select("rank", "step", "start_ns")
        .join(issued, on=["rank", "step"])
        .sort("rank", "step")
        .with_columns(step=pl.col("step").shift(1).over("rank"))
        .drop_nulls("step")
    )


def _named_spans(frame: pl.DataFrame, steps: pl.DataFrame, name: str) -> pl.DataFrame:
    """The rank's spans called `name`, by step."""
    spans = rows(frame, (pl.col("name") == name) & (pl.col("ph") == "X"), "rank", "start_ns", "end_ns")
    return assign_steps(spans, steps).select("rank", "step", "start_ns", "end_ns")


def send_spans(frame: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """CPU: per SEND cell whose gloo:send opened inside it (at its c10d::send call's end), whether that
    span outlived the cell (CELL_KEY, outlives). gloo closes it when a wait returns from the send: an
    isend's at the step's wait for sends, after its call; a blocking send's inside its call."""
    spans = rows(frame, pl.col("name") == "gloo:send", "rank", "tid", "start_ns", "end_ns")
    sends = labels.filter(pl.col("kind").is_in(["SEND_F", "SEND_B"]))
    inside = _events_in_labels(spans, sends)
    return inside.group_by(CELL_KEY).agg(outlives=(pl.col("end_ns") > pl.col("label_end")).any())


def step_end_barriers(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """The runner's `PP step-end barrier` spans (runners.schedules.trace_names), by step."""
    return _named_spans(frame, steps, STEP_END_BARRIER)


def device_events(frame: pl.DataFrame) -> pl.DataFrame:
    """GPU events with the host launch that issued them (start of the runtime call, same correlation)."""
    runtime = cat_in(frame, lambda cat: "runtime" in cat or "driver" in cat)
    launch = runtime & pl.col("correlation").is_not_null()
    launches = rows(frame, launch, "rank", "tid", "correlation", "start_ns", "end_ns")
    launches = launches.rename({"start_ns": "launch_ns", "end_ns": "issued_ns"})
    work = cat_in(frame, lambda cat: cat in DEVICE_WORK_CATS)
    kernels = rows(frame, work, "rank", "stream", "correlation", "start_ns", "end_ns", "name")
    kernels = kernels.with_columns(is_p2p=pl.col("name").str.contains("(?i)nccl"))
    return kernels.drop("name").join(launches, on=["rank", "correlation"], how="left")


def _device_cells(
    labels: pl.DataFrame, device: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Cell span = its kernels' span (host span where it launched none); waits = the device work of its
    receives. A send's kernel runs on the NCCL stream while the compute stream goes on: the rank does not
    wait for it (the hop is counted once, on the receiver). Whatever a SEND or RECV launches is the
    transfer, an NCCL kernel or (P ranks on one GPU: analysis.cells.virtual_ranks) a copy and the wait
    for it."""
    launched = device.drop_nulls("launch_ns").rename({"start_ns": "k_start", "end_ns": "k_end"})
    owned = _events_in_labels(launched.with_columns(start_ns="launch_ns"), labels, across_threads=True)
    owned = owned.with_columns(is_p2p=pl.col("is_p2p") | ~pl.col("kind").is_in(COMPUTE_KINDS))
    spans = owned.group_by(CELL_KEY).agg(pl.col("k_start").min(), pl.col("k_end").max())
    cells = (
        labels.join(spans, on=CELL_KEY, how="left")
        .with_columns(start_ns=pl.coalesce("k_start", "start_ns"), end_ns=pl.coalesce("k_end", "end_ns"))
        .drop("k_start", "k_end")
    )
    receiving = pl.col("is_p2p") & pl.col("kind").str.starts_with("RECV")
    waits = owned.filter(receiving).select(*CELL_KEY, start_ns="k_start", end_ns="k_end")
    kernels = owned.select(
        *CELL_KEY, "launch_ns", "issued_ns", "is_p2p", "correlation", start_ns="k_start", end_ns="k_end"
    )
    return cells, waits, kernels


def _unscheduled(
    events: RankEvents,
    labels: pl.DataFrame,
    kernels: pl.DataFrame | None,
    steps: pl.DataFrame,
    annotations_are_work: bool = True,
) -> pl.DataFrame:
    """Work outside every action, as its union per step (unscheduled_union): GPU kernels no label
    launched; on CPU, host spans on a label thread (its user annotations only where
    `annotations_are_work`: not a framework's phase labels and the blocks around them)."""
    if kernels is not None:
        work = events.device.join(
            kernels.select("rank", "correlation"), on=["rank", "correlation"], how="anti"
        )
    else:
        # one cheap test per label thread: a join on (rank, tid) of a 54 MB CPU trace's ~200k host spans
        # took 20 ms and 12 MiB
        threads = labels.select("rank", "tid").unique().iter_rows()
        on_label_thread = pl.any_horizontal(
            pl.lit(False), *((pl.col("rank") == rank) & (pl.col("tid") == tid) for rank, tid in threads)
        )
        housekeeping = pl.col("name").str.starts_with(LABEL_PREFIX) & pl.col("name").str.contains(
            TORCH_HOUSEKEEPING
        )
        work_cats = [OPERATOR_CATEGORY, "user_annotation"] if annotations_are_work else [OPERATOR_CATEGORY]
        host = (
            (pl.col("ph") == "X")
            & pl.col("cat").is_in(work_cats)
            & (
                ~pl.any_horizontal(pl.col("name").str.starts_with(prefix) for prefix in NOT_HOST_WORK)
                | housekeeping
            )
        )
        work = rows(events.frame, host & on_label_thread, "rank", "start_ns", "end_ns")
    return unscheduled_union(assign_steps(work.select("rank", "start_ns", "end_ns"), steps))


def unscheduled_union(work: pl.DataFrame) -> pl.DataFrame:
    """Work outside the actions (rank, step, start_ns, end_ns) as its union per step, all the timeline
    reads of it: a rank's table is kept until the pipeline is analysed, and on a 54 MB CPU trace its
    161k nested host spans are 28k pieces."""
    return union(work, ["rank", "step"]).select("rank", "step", "start_ns", "end_ns")


def rank_cells(frame: pl.DataFrame, source: str | Path | None = None) -> RankCells:
    """The cells of one rank's trace frame; `source` names the file in error messages."""
    events = rank_events(frame)
    return labelled_cells(events, step_labels(events, source))


def step_labels(events: RankEvents, source: str | Path | None = None) -> pl.DataFrame:
    """The rank's labels (label_spans) in its steps."""
    return assign_steps(label_spans(events.frame, source), events.steps)


def labelled_cells(events: RankEvents, labels: pl.DataFrame, annotations_are_work: bool = True) -> RankCells:
    """The cells of a rank's `step_labels` (or of labels in their shape: analysis.cells.phases; its
    annotations are no work of their own: _unscheduled)."""
    steps = events.steps
    if events.device is not None:
        labels, waits, kernels = _device_cells(labels, events.device)
        steps = _device_windows(events.frame, events.steps, labels)
    else:
        kernels = None
        waits = _host_waits(events.frame, labels)
    send_waits = None if kernels is not None else _named_spans(events.frame, events.steps, WAIT_SENDS)
    barriers = None if kernels is not None else step_end_barriers(events.frame, events.steps)
    blocked = waits.group_by(CELL_KEY).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("blocked_ns"))
    cells = (
        labels.join(blocked, on=CELL_KEY, how="left")
        .with_columns(pl.col("blocked_ns").fill_null(0))
        .select(pl.col(name).cast(dtype) for name, dtype in CELL_SCHEMA.items())
        .sort("rank", "start_ns")
    )
    unscheduled = _unscheduled(events, labels, kernels, steps, annotations_are_work)
    ops = None if kernels is not None else operator_spans(events.ops, labels)
    syncs = None if kernels is None else host_syncs(events.frame, events.steps)
    heads = None if kernels is None else next_heads(events.steps, kernels)
    sends = None if kernels is not None else send_spans(events.frame, labels)
    return RankCells(
        cells,
        waits.sort("rank", "start_ns"),
        steps,
        kernels,
        unscheduled,
        ops,
        send_waits,
        syncs,
        barriers,
        heads,
        sends,
    )


def recv_cell_ends(cells: pl.DataFrame) -> pl.DataFrame:
    """Each RECV cell's end (CELL_KEY, cell_end)."""
    return (
        cells.filter(pl.col("kind").str.starts_with("RECV"))
        .group_by(CELL_KEY)
        .agg(cell_end=pl.col("end_ns").max())
    )


def receives_only_posted(cells: pl.DataFrame, waits: pl.DataFrame) -> bool:
    """Whether the run's RECV cells only post their receives (torch.distributed.pipelining's irecv, waited
    for inside the consumer's forward or backward): a wait keyed by a RECV runs on past that RECV's cell."""
    keyed = waits.join(recv_cell_ends(cells), on=CELL_KEY)
    return bool((keyed["end_ns"] > keyed["cell_end"]).any())
