"""Name every idle nanosecond of a rank's step: bubble, p2p_wait, launch_overhead or other.

A wait on a peer (a RECV's blocked interval) is matched to the peer's SEND of the same microbatch on
the other rank: the part of the wait before the SEND started is bubble (the producer had not produced
yet), the rest is p2p_wait (transfer and latency). A CPU sender's own time inside a blocking SEND is
split at its receiver's posting of the RECV: bubble before (the partner was not ready), p2p_wait after
(the transfer); an isend's host call, over before its receiver posted, stays p2p_wait. A receive that
was only posted (torch.distributed.pipelining's irecv) waits in its consumer, not in its RECV. Idle
time that is not a wait is launch overhead when the host had not yet issued the next work (GPU: no
launched kernel pending, HTA's host-wait rule; CPU: framework time inside RECV actions or between
actions up to a threshold), else other. Idle before a rank's first action of the step or after its
last is bubble (the schedule had nothing for it: fill and drain) unless the rank was busy with work
outside the schedule there (optimizer step, kernels no action launched): other; a short idle before
the first action, or any before a first action that is compute (it waits on no peer: the first
stage's forward), is the host getting to it: launch_overhead.
"""

from __future__ import annotations

import functools

import polars as pl

from analysis.cells.labelled import CELL_KEY, device_events, receives_only_posted, recv_cell_ends
from analysis.schema import GAP_CLASSES, Rules
from analysis.timeline.gaps import INTERVAL, queued, runs, segments
from analysis.vocabulary import DeviceIdle, GapClass

GAP_SCHEMA = {"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "class": pl.Utf8}


# RECV kind -> (stage step to the producer, the producer's SEND kind, its compute kinds by preference)
_PRODUCER = {"RECV_F": (-1, "SEND_F", ("F",)), "RECV_B": (1, "SEND_B", ("B", "I"))}
# per RECV kind each cell that may mark its producer's sending, by preference (0 first)
_CANDIDATES = pl.DataFrame(
    [
        (recv_kind, stage_step, kind, preference)
        for recv_kind, (stage_step, send_kind, compute_kinds) in _PRODUCER.items()
        for preference, kind in enumerate((send_kind, *compute_kinds))
    ],
    schema={"kind": pl.Utf8, "stage_step": pl.Int64, "peer_kind": pl.Utf8, "preference": pl.Int64},
    orient="row",
)


def _producer_starts(cells: pl.DataFrame) -> pl.DataFrame:
    """Per RECV cell: when its producer began sending (None if unknown); all ranks on one clock.

    The SEND's start where the trace has SEND labels, else the producing compute cell's end.
    """
    marks = cells.select(
        "step",
        "stage",
        "kind",
        "microbatch",
        sent_ns=pl.when(pl.col("kind").str.starts_with("SEND")).then("start_ns").otherwise("end_ns"),
    )
    candidates = (
        cells.filter(pl.col("kind").is_in(list(_PRODUCER)))
        .join(_CANDIDATES, on="kind")
        .with_columns(peer_stage=pl.col("stage") + pl.col("stage_step"))
        .join(
            marks,
            left_on=["step", "peer_stage", "peer_kind", "microbatch"],
            right_on=["step", "stage", "kind", "microbatch"],
        )
    )
    return candidates.sort("preference").group_by(CELL_KEY).agg(pl.col("sent_ns").first())


# SEND kind -> (stage step to its receiver, the receiver's RECV kind)
_RECEIVER = {"SEND_F": (1, "RECV_F"), "SEND_B": (-1, "RECV_B")}


def _receivers_posted(sends: pl.DataFrame, cells: pl.DataFrame) -> pl.DataFrame:
    """`sends` (step, send_stage, send_kind, send_mb, ...) joined with posted_ns: when each one's
    receiver began its RECV."""
    receivers = cells.filter(pl.col("kind").str.starts_with("RECV")).select(
        "step", r_stage="stage", r_kind="kind", r_mb="microbatch", posted_ns="start_ns"
    )
    step_of = pl.col("send_kind").replace_strict(
        {k: v[0] for k, v in _RECEIVER.items()}, return_dtype=pl.Int64
    )
    kind_of = pl.col("send_kind").replace_strict({k: v[1] for k, v in _RECEIVER.items()})
    return sends.with_columns(r_stage=pl.col("send_stage") + step_of, r_kind=kind_of, r_mb="send_mb").join(
        receivers, on=["step", "r_stage", "r_kind", "r_mb"]
    )


def _send_posted(cells: pl.DataFrame) -> pl.DataFrame:
    """Per SEND cell (CELL_KEY): ready_ns, when its receiver posted its RECV."""
    sends = cells.filter(pl.col("kind").is_in(list(_RECEIVER))).select(
        "rank", "step", send_stage="stage", send_kind="kind", send_mb="microbatch"
    )
    return (
        _receivers_posted(sends, cells)
        .select(
            "rank", "step", stage="send_stage", kind="send_kind", microbatch="send_mb", ready_ns="posted_ns"
        )
        .group_by(CELL_KEY)
        .agg(pl.col("ready_ns").max())
    )


def _batched_ready(cells: pl.DataFrame, kernels: pl.DataFrame | None) -> pl.DataFrame:
    """Per RECV cell carried by one kernel with a SEND of its rank (batch_isend_irecv): when that send's
    receiver posted its receive. The kernel, and the rank's compute after it, waits for both halves, so
    until then the pair waits for a partner that is not ready: bubble."""
    schema = {name: pl.Int64 if name != "kind" else pl.Utf8 for name in CELL_KEY} | {"posted_ns": pl.Int64}
    if kernels is None or kernels.is_empty():
        return pl.DataFrame(schema=schema)
    p2p = kernels.filter("is_p2p").select(*CELL_KEY, "correlation")
    recvs = p2p.filter(pl.col("kind").str.starts_with("RECV"))
    sends = p2p.filter(pl.col("kind").str.starts_with("SEND")).select(
        "rank", "step", "correlation", send_stage="stage", send_kind="kind", send_mb="microbatch"
    )
    paired = recvs.join(sends, on=["rank", "step", "correlation"])
    return _receivers_posted(paired, cells).group_by(CELL_KEY).agg(pl.col("posted_ns").max())


def _unposted_sends(cells: pl.DataFrame) -> pl.DataFrame:
    """The `unposted` layer: a SEND cell from its start until its receiver posted the RECV, where the
    cell was still open then. A blocking send (Megatron's, a hand-written loop's c10d::send; gloo's send
    is a rendezvous) stays in its cell until the transfer is done, so it was open when its receiver came
    and waited for it until then: the partner not ready, bubble. A SEND that had ended before its
    receiver posted did not wait for it (the native executor's isend returns, its wait for the transfer
    is `PP wait for sends`): the layer leaves it alone."""
    return (
        cells.join(_send_posted(cells), on=CELL_KEY)
        .filter(pl.col("ready_ns") < pl.col("end_ns"))
        .with_columns(end_ns="ready_ns", layer=pl.lit("unposted"))
        .select(INTERVAL)
    )


def _send_wait_layers(cells: pl.DataFrame, send_waits: pl.DataFrame) -> pl.DataFrame:
    """The executor's wait for its pending sends after its last action: bubble until the last of its
    sends' receivers had posted its receive (a partner not ready), p2p_wait after (the transfer)."""
    sends = cells.filter(pl.col("kind").is_in(list(_RECEIVER))).select(
        "rank", "step", send_stage="stage", send_kind="kind", send_mb="microbatch"
    )
    posted = _receivers_posted(sends, cells).group_by("rank", "step").agg(pl.col("posted_ns").max())
    waits = send_waits.join(posted, on=["rank", "step"], how="left")
    cut = pl.col("posted_ns").fill_null(pl.col("end_ns")).clip(pl.col("start_ns"), pl.col("end_ns"))
    return pl.concat(
        [
            waits.with_columns(end_ns=cut, layer=pl.lit("bubble_wait")).select(INTERVAL),
            waits.with_columns(start_ns=cut, layer=pl.lit(GapClass.P2P_WAIT)).select(INTERVAL),
        ]
    )


def _posts_only(cells: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """`waits` less, where the run's receives were only posted (torch.distributed.pipelining's irecv: a
    wait keyed by a RECV runs on past its cell, into its consumer, analysis.cells.inferred.consumer_waits),
    each RECV's blocked time inside its own cell. That is the post, the c10d::recv_ call up to gloo's
    span of the receive opening at its end, and the host's time in the label after it: the own-step
    replay's RECV pre and post, host time (the rank's partner had often not begun its send: no data was
    in flight). The consumer's wait, after the cell, is the hop's."""
    if not receives_only_posted(cells, waits):
        return waits
    keyed = waits.join(recv_cell_ends(cells), on=CELL_KEY, how="left", maintain_order="left")
    after_post = pl.when(pl.col("cell_end").is_not_null()).then(pl.max_horizontal("start_ns", "cell_end"))
    return keyed.with_columns(start_ns=after_post.fill_null(pl.col("start_ns"))).select(waits.columns)


def split_waits(
    cells: pl.DataFrame,
    waits: pl.DataFrame,
    kernels: pl.DataFrame | None = None,
    send_waits: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Blocked intervals of all ranks as wait layers: bubble_wait before the peer sent, p2p_wait after.

    Waits inside SEND cells are bubble_wait before the receiver posted its RECV (the peer was not
    receiving yet), p2p_wait after; a RECV wait whose producer is not in the traces is unmatched_wait
    (classed `other`). Every SEND cell still open when its receiver posted also gives the `unposted`
    layer until then (_unposted_sends), which the CPU rules class bubble. A RECV coalesced with a SEND
    in one kernel (`kernels`: GPU, every rank's) waits as bubble also until that send's receiver had
    posted; so does the executor's wait for its pending sends after its last action (`send_waits`, CPU).
    A receive that was only posted waits in its consumer alone: its RECV's own time is host time (_posts_only).
    `cells`, `waits`, `kernels` and `send_waits` of all ranks, with times already on one clock
    (analysis.timeline.clock).
    """
    sent = (
        _posts_only(cells, waits)
        .join(_producer_starts(cells), on=CELL_KEY, how="left")
        .join(_send_posted(cells), on=CELL_KEY, how="left")
        .join(_batched_ready(cells, kernels), on=CELL_KEY, how="left")
        .with_columns(
            sent_ns=pl.when(pl.col("sent_ns").is_not_null()).then(pl.max_horizontal("sent_ns", "posted_ns"))
        )
        .drop("posted_ns")
    )
    cut = pl.col("sent_ns").clip(pl.col("start_ns"), pl.col("end_ns"))
    is_recv = pl.col("kind").str.starts_with("RECV")
    matched = sent.filter(is_recv & pl.col("sent_ns").is_not_null())
    bubble = matched.with_columns(end_ns=cut, layer=pl.lit("bubble_wait"))
    after = matched.with_columns(start_ns=cut, layer=pl.lit(GapClass.P2P_WAIT))
    sending = sent.filter(~is_recv)
    ready = pl.col("ready_ns").fill_null(pl.col("start_ns")).clip(pl.col("start_ns"), pl.col("end_ns"))
    send_bubble = sending.with_columns(end_ns=ready, layer=pl.lit("bubble_wait"))
    sends = sending.with_columns(start_ns=ready, layer=pl.lit(GapClass.P2P_WAIT))
    unmatched = sent.filter(is_recv & pl.col("sent_ns").is_null()).with_columns(
        layer=pl.lit("unmatched_wait")
    )
    parts = [frame.select(INTERVAL) for frame in (bubble, after, send_bubble, sends, unmatched)]
    parts.append(_unposted_sends(cells))
    if send_waits is not None:
        parts.append(_send_wait_layers(cells, send_waits))
    return pl.concat(parts).filter(pl.col("end_ns") > pl.col("start_ns"))


# a segment's class while it is classified: an Enum, cheaper to make and compare than strings (the
# gaps table's class is a string); busy, between and head are resolved before it is written
_SEGMENT_CLASS = pl.Enum(["busy", "between", "head", *GAP_CLASSES])


@functools.cache  # an Enum literal costs more to build than a string one: each is built once
def _class(name: str) -> pl.Expr:
    return pl.lit(name, dtype=_SEGMENT_CLASS)


def _edge() -> pl.Expr:
    """Idle outside the rank's first-to-last action: work outside the schedule, or the host getting to
    its first action (at any length where that is compute, else `head`, resolved by length), or nothing
    to do: fill and drain."""
    return (
        pl.when(pl.col("unscheduled") > 0)
        .then(_class(GapClass.OTHER))
        .when(pl.col("ready_head") > 0)
        .then(_class(GapClass.LAUNCH_OVERHEAD))
        .when(pl.col("head") > 0)
        .then(_class("head"))
        .otherwise(_class(GapClass.BUBBLE))
    )


def _queue_rule(host: pl.Expr, queued_class: pl.Expr) -> pl.Expr:
    """HTA's idle rule on one idle segment: a kernel launched but not yet running means the device
    waits on something else (an event, a peer); nothing launched means the host had not issued the
    next work yet."""
    return pl.when(pl.col("issued") > 0).then(queued_class).otherwise(host)


def _gpu_idle() -> pl.Expr:
    """The queue rule; with nothing queued, outside the actions it is the edge's, but once the next
    step's host began getting to its first launch (the window runs to the next step's first kernel) it
    is launch_overhead; work outside the schedule is other; a host blocked in a synchronize call while
    its own send is open waits for the receiver, the rendezvous rule of CPU sends (Megatron's p2p
    synchronizes after its sends): bubble before the receiver posted, p2p_wait after; else the host was
    late: launch_overhead. With work queued behind the rank's own send (a blocking send: the compute
    stream waits for the receiver to take the data) it is bubble, the pipeline partner not ready; queued
    behind anything else, other."""
    blocked = pl.col("host_sync") > 0
    host = (
        pl.when((pl.col("active") == 0) & (pl.col("next_head") > 0) & (pl.col("unscheduled") == 0))
        .then(_class(GapClass.LAUNCH_OVERHEAD))
        .when(pl.col("active") == 0)
        .then(_edge())
        .when(pl.col("unscheduled") > 0)
        .then(_class(GapClass.OTHER))
        .when(blocked & (pl.col("unposted") > 0))
        .then(_class(GapClass.BUBBLE))
        .when(blocked & (pl.col("sending") > 0))
        .then(_class(GapClass.P2P_WAIT))
        .otherwise(_class(GapClass.LAUNCH_OVERHEAD))
    )
    queued = pl.when(pl.col("sending") > 0).then(_class(GapClass.BUBBLE)).otherwise(_class(GapClass.OTHER))
    return _queue_rule(host, queued)


def _cpu_idle() -> pl.Expr:
    """The main thread: in a blocking send before its receiver posted (`unposted`) it waits for a partner
    not ready, bubble; sending after that is p2p; framework time inside actions is launch overhead,
    stretches between actions (`between`) are resolved by length."""
    return (
        pl.when(pl.col("unposted") > 0)
        .then(_class(GapClass.BUBBLE))
        .when(pl.col("sending") > 0)
        .then(_class(GapClass.P2P_WAIT))
        .when(pl.col("action") > 0)
        .then(_class(GapClass.LAUNCH_OVERHEAD))
        .when(pl.col("active") == 0)
        .then(_edge())
        .otherwise(_class("between"))
    )


def _segment_class(on_gpu: bool) -> pl.Expr:
    return (
        pl.when(~pl.col("idle"))
        .then(_class("busy"))
        .when(pl.col("bubble_wait") > 0)
        .then(_class(GapClass.BUBBLE))
        .when(pl.col(GapClass.P2P_WAIT) > 0)
        .then(_class(GapClass.P2P_WAIT))
        .when(pl.col("unmatched_wait") > 0)
        .then(_class(GapClass.OTHER))
        .otherwise(_gpu_idle() if on_gpu else _cpu_idle())
        .alias("class")
    )


def classify(timeline: pl.DataFrame, rules: Rules, on_gpu: bool) -> pl.DataFrame:
    """The gaps table: maximal idle stretches of one class (GAP_SCHEMA), busy time left out."""
    classes = timeline.select("rank", "step", "start_ns", "end_ns", _segment_class(on_gpu))
    idle = classes.filter(pl.col("class") != "busy")
    labelled = runs(idle, "class")  # busy time between two stretches keeps them apart: they do not touch
    short = (pl.col("end_ns") - pl.col("start_ns")) <= rules.host_gap_max_ns
    resolved = labelled.with_columns(
        pl.when(pl.col("class").is_in(["between", "head"]) & short)
        .then(_class(GapClass.LAUNCH_OVERHEAD))
        .when(pl.col("class") == "between")
        .then(_class(GapClass.OTHER))
        .when(pl.col("class") == "head")
        .then(_class(GapClass.BUBBLE))
        .otherwise("class")
        .alias("class")
    )
    gaps = runs(resolved, "class")
    return gaps.select(pl.col(name).cast(dtype) for name, dtype in GAP_SCHEMA.items())


def device_idle(frame: pl.DataFrame, rules: Rules = Rules()) -> pl.DataFrame:
    """Idle stretches of every GPU stream of a loaded trace (analysis.traces.load), no pipeline labels needed:
    rank, stream, start_ns, end_ns, class in host_wait, kernel_wait, other.

    Between each stream's first and last kernel, idle time is split by the queue rule the pipeline
    classes use; a queued stretch shorter than `rules.kernel_wait_max_ns` is kernel_wait. Holistic Trace
    Analysis classes each whole gap by whether the next launch call *began* after the gap did; here a gap
    is cut where the launch call *ended*, so HTA's host wait also holds the launch call and the
    launch-to-start latency that follow it, which this counts as other (see tests/test_hta_idle.py).
    """
    keys = ("rank", "stream")
    kernels = device_events(frame)
    windows = kernels.group_by(keys).agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    intervals = pl.concat(
        [
            kernels.select(*keys, layer=pl.lit("busy"), start_ns="start_ns", end_ns="end_ns"),
            queued(kernels, keys)
            .with_columns(layer=pl.lit("issued"))
            .select(*keys, "layer", "start_ns", "end_ns"),
        ]
    )
    idle = segments(intervals, windows, ("busy", "issued"), keys).filter(pl.col("busy") == 0)
    stretches = runs(
        idle.with_columns(_queue_rule(pl.lit(DeviceIdle.HOST_WAIT), pl.lit(DeviceIdle.OTHER)).alias("class")),
        "class",
        keys,
    )
    short = (pl.col("end_ns") - pl.col("start_ns")) < rules.kernel_wait_max_ns
    return stretches.with_columns(
        pl.when((pl.col("class") == DeviceIdle.OTHER) & short)
        .then(pl.lit(DeviceIdle.KERNEL_WAIT))
        .otherwise("class")
        .alias("class")
    ).select(*keys, "start_ns", "end_ns", "class")
