"""A rank's blocked intervals split by what they waited for: the wait layers the classes read.

A wait on a peer (a RECV's blocked interval) is matched to the peer's SEND of the same microbatch on
the other rank: the part of the wait before the SEND started waited for a producer that had not
produced yet (`bubble_wait`), the rest for the transfer (`p2p_wait`). A CPU sender's own time inside a
blocking SEND is split at its receiver's posting of the RECV: before, the partner was not ready; after,
the transfer; an isend's host call, over before its receiver posted, stays the transfer. A receive that
was only posted (torch.distributed.pipelining's irecv) waits in its consumer, not in its RECV. A RECV
whose producer is not in the traces is `unmatched_wait`. analysis.timeline.classify makes the classes.
"""

from __future__ import annotations

import polars as pl

from analysis.cells.labelled import CELL_KEY, receives_only_posted, recv_cell_ends
from analysis.timeline.gaps import INTERVAL
from analysis.vocabulary import GapClass

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
