"""Each analysed step's own measurements, as the inputs of its replay (analysis.attribution.replay).

Per rank and step the cells run in order on one lane, each measured from the trace alone:

- `lead`: the host time between the previous action leaving the lane and this one's start, taken from
  the classified gaps there (launch_overhead, other, dp_sync: time the rank spent on its own work or
  host code). Waiting there (bubble, p2p_wait) is not an input: the replay must explain it through a
  dependency, and what it cannot shows in the completeness residual;
- compute: `work` is its busy time (analysis.attribution.parts), `pre` the rest of its span (host time
  between its operators, or the device idle inside it);
- RECV: `pre` up to its blocked interval, `post` after it, and `transfer` the blocked time after both
  sides had posted (the wait's end less the later of its start and the partner's post: the matching
  SEND's start, or the producer's end where the trace has no SEND). A receive that was only posted
  (torch's runtime: its wait, analysis.cells.inferred.consumer_waits, ends inside the consumer, after
  the RECV cell) has `pre` and `post` around its post inside the cell, a transfer no longer than its
  consumer waited (gloo ends the wait when the consumer asks, whenever the data came), and its
  consumer's `pre` leaves out the part of that wait the transfer reaches: a hop, or waiting for the
  partner, not host time;
- SEND: on the lane until it ends or the rank's next action starts (an NCCL send runs on its own
  stream); of that, the time classed as waiting on the peer is its `transfer` and the rest `pre`. A
  blocking send (one that waited for its receiver: it began before the receiver's wait and ended after
  it, CPU only) instead has `transfer` from the later of its start and the receiver's wait to its end;
- the tail: per class, the gaps after the rank's last action (dp_sync, other, launch_overhead) up to
  the step-end barrier where the trace labels one (else to the window's end); then the barrier: from the
  last rank's arrival to this rank's window end (the collective's own time, the rank's thread waking,
  the window closing), and how long after the step's first window this rank's opened (the previous
  barrier let it go later), where its lane starts.

Times stay integer ns until they are differences (a float at ~1.8e18 ns resolves only 256 ns).
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from analysis.attribution.parts import idle_before
from analysis.attribution.replay import Inputs, Step, Tail
from analysis.cells.labelled import receives_only_posted
from analysis.vocabulary import GapClass
from runners.schedules import Action, Kind, Schedule

KEY = ["stage", "kind", "microbatch"]
HOST_CLASSES = (
    GapClass.LAUNCH_OVERHEAD,
    GapClass.OTHER,
    GapClass.DP_SYNC,
)  # time the rank spends on its own: no dependency
WAIT_CLASSES = (GapClass.BUBBLE, GapClass.P2P_WAIT)  # time waiting on a peer
INPUT_COLUMNS = ("lead", "pre", "work", "transfer", "post")
TAIL_PARTS = (GapClass.DP_SYNC, GapClass.OTHER, GapClass.LAUNCH_OVERHEAD)  # the gap classes of a tail
TAIL_COLUMNS = (
    *TAIL_PARTS,
    "barrier",
    "opened",
)  # a rank's step-edge inputs (analysis.attribution.replay.Tail's fields)
# on the lane at one instant (an NCCL send and the receive after it): the send first, as the host
# issued it right after its producer
_LANE_ORDER = {"SEND_F": 0, "SEND_B": 0, "RECV_F": 1, "RECV_B": 1}


class OwnSteps(NamedTuple):
    """Every analysed step's inputs: `actions` (step, rank, position, KEY, INPUT_COLUMNS in ns; an eager
    receive that was posted after its data had left has no transfer of its own: null) in each rank's
    lane order, `tails` (step, rank, TAIL_COLUMNS in ns), whether sends block, receives are eager and
    receives are only posted."""

    actions: pl.DataFrame
    tails: pl.DataFrame
    blocking_sends: bool
    eager_receives: bool
    posted_receives: bool = False

    def step(self, number: int, p: int) -> Step:
        """One step's replay inputs."""
        return self._step(
            self.actions.filter(pl.col("step") == number), self.tails.filter(pl.col("step") == number), p
        )

    def steps(self, numbers: list[int], p: int) -> list[Step]:
        """The replay inputs of `numbers`, each step's rows taken in one pass over the tables (filtering
        them once a step took time in steps x rows: seconds at a few thousand steps)."""
        actions = self.actions.partition_by("step", as_dict=True)
        tails = self.tails.partition_by("step", as_dict=True)
        empty_actions, empty_tails = self.actions.clear(), self.tails.clear()
        return [
            self._step(actions.get((n,), empty_actions), tails.get((n,), empty_tails), p) for n in numbers
        ]

    def _step(self, rows: pl.DataFrame, tail_rows: pl.DataFrame, p: int) -> Step:
        """A step's replay inputs from its rows of `actions` and `tails`."""
        orders: list[list[Action]] = [[] for _ in range(p)]
        inputs = {}
        for rank, stage, kind, mb, *values in rows.select("rank", *KEY, *INPUT_COLUMNS).iter_rows():
            action = Action(stage, Kind(kind), mb)
            orders[rank].append(action)
            inputs[action] = Inputs(*(0.0 if value is None else value for value in values))
        tails = [Tail()] * p
        for rank, *values in tail_rows.select("rank", *TAIL_COLUMNS).iter_rows():
            tails[rank] = Tail(*values)
        return Step(
            tuple(map(tuple, orders)),
            inputs,
            tails,
            self.blocking_sends,
            self.eager_receives,
            self.posted_receives,
        )


def _class_time(
    gaps: pl.DataFrame, classes: tuple[str, ...], at: pl.DataFrame, ends: tuple[str, str]
) -> pl.Series:
    """Per row of `at` (rank and two time columns), the time the rank's gaps of `classes` cover between
    them (0 where the second is earlier)."""
    chosen = gaps.filter(pl.col("class").is_in(classes))
    first, second = ends
    times = pl.concat([at.select("rank", t_ns=first), at.select("rank", t_ns=second)])
    covered = idle_before(times, chosen)
    return (covered.slice(at.height) - covered.slice(0, at.height)).clip(lower_bound=0).cast(pl.Float64)


def _partner_posts(rows: pl.DataFrame, schedule: Schedule) -> pl.DataFrame:
    """Per RECV row (step, KEY): when its partner posted: the matching SEND's start, else the producing
    compute's end; and per SEND row when its receiver's wait began (recv_wait_ns)."""
    recvs = rows.filter(pl.col("kind").is_in(["RECV_F", "RECV_B"]))
    from_stage = pl.col("stage") + pl.when(pl.col("kind") == "RECV_F").then(-1).otherwise(1)
    send_kind = pl.when(pl.col("kind") == "RECV_F").then(pl.lit("SEND_F")).otherwise(pl.lit("SEND_B"))
    sends = rows.select(
        "step", peer_stage="stage", peer_kind="kind", microbatch="microbatch", send_ns="start_ns"
    )
    producers = rows.filter(pl.col("kind").is_in(["F", "B", "I"])).select(
        "step", peer_stage="stage", peer_kind="kind", microbatch="microbatch", made_ns="end_ns"
    )
    keyed = recvs.select("step", *KEY, peer_stage=from_stage, send_kind=send_kind)
    # a backward's output is B's, or I's where backward is split (the schedule has one or the other)
    backward = (
        pl.lit("I") if any(a.kind is Kind.I for order in schedule.orders for a in order) else pl.lit("B")
    )
    producer_kind = pl.when(pl.col("kind") == "RECV_F").then(pl.lit("F")).otherwise(backward)
    joined = (
        keyed.with_columns(producer_kind=producer_kind)
        .join(
            sends,
            left_on=["step", "peer_stage", "send_kind", "microbatch"],
            right_on=["step", "peer_stage", "peer_kind", "microbatch"],
            how="left",
        )
        .join(
            producers,
            left_on=["step", "peer_stage", "producer_kind", "microbatch"],
            right_on=["step", "peer_stage", "peer_kind", "microbatch"],
            how="left",
        )
    )
    return joined.select("step", *KEY, partner_ns=pl.coalesce("send_ns", "made_ns"))


def measure(
    schedule: Schedule,
    cells: pl.DataFrame,
    waits: pl.DataFrame,
    gaps: pl.DataFrame,
    windows: pl.DataFrame,
    on_gpu: bool,
    barriers: pl.DataFrame | None = None,
    sends: pl.DataFrame | None = None,
) -> OwnSteps:
    """The inputs of every step of `windows` (rank, step, start_ns, end_ns) from the cells (with busy_ns),
    their waits, the classified gaps, the step-end barriers (rank, step, start_ns, end_ns; None: the
    loop has none) and whether each SEND's gloo:send outlived it (analysis.cells.labelled.send_spans;
    None: the trace has none), all ranks on one clock; the cells' ranks are the schedule's."""
    steps = windows["step"].unique().implode()
    lane_order = pl.col("kind").replace_strict(_LANE_ORDER, default=2, return_dtype=pl.Int8)
    rows = (
        cells.filter(pl.col("step").is_in(steps))
        .select("rank", "step", *KEY, "start_ns", "end_ns", "busy_ns")
        .unique(["rank", "step", *KEY], keep="last")
        .sort("rank", "step", "start_ns", lane_order)
    )
    blocked = waits.group_by("rank", "step", *KEY).agg(w0=pl.col("start_ns").min(), w1=pl.col("end_ns").max())
    posts = _partner_posts(rows, schedule)
    receivers = blocked.filter(pl.col("kind").is_in(["RECV_F", "RECV_B"])).select(
        "step", "microbatch", recv_stage="stage", recv_kind="kind", recv_wait_ns="w0"
    )
    send_to = pl.col("stage") + pl.when(pl.col("kind") == "SEND_F").then(1).when(
        pl.col("kind") == "SEND_B"
    ).then(-1)
    recv_kind = (
        pl.when(pl.col("kind") == "SEND_F")
        .then(pl.lit("RECV_F"))
        .when(pl.col("kind") == "SEND_B")
        .then(pl.lit("RECV_B"))
    )
    per_lane = ("rank", "step")
    is_send = pl.col("kind").is_in(["SEND_F", "SEND_B"])
    next_start = pl.col("start_ns").shift(-1).over(per_lane)
    lane_end = (
        pl.when(is_send)
        .then(pl.max_horizontal("start_ns", pl.min_horizontal("end_ns", next_start)))
        .otherwise("end_ns")
    )
    bounds = windows.select("rank", "step", w_start="start_ns", w_end="end_ns")
    timed = (
        rows.join(blocked, on=["rank", "step", *KEY], how="left", maintain_order="left")
        .join(posts, on=["step", *KEY], how="left", maintain_order="left")
        .with_columns(recv_stage=send_to, recv_kind=recv_kind)
        .join(
            receivers, on=["step", "microbatch", "recv_stage", "recv_kind"], how="left", maintain_order="left"
        )
        .join(bounds, on=["rank", "step"], how="left", maintain_order="left")
        .with_columns(lane_end=lane_end)
        .with_columns(
            position=pl.int_range(pl.len()).over(per_lane),
            since=pl.col("lane_end").shift(1).over(per_lane).fill_null(pl.col("w_start")),
        )
    )
    lead = _class_time(gaps, HOST_CLASSES, timed, ("since", "start_ns"))
    send_wait = _class_time(gaps, WAIT_CLASSES, timed, ("start_ns", "lane_end"))
    timed = timed.with_columns(lead=lead, send_wait=send_wait)
    blocking = not on_gpu and _sends_block(timed, sends)
    eager = _receives_eager(timed)
    posted = receives_only_posted(cells, waits)
    if posted:
        timed = _with_consumer_waits(timed)
    actions = timed.select("step", "rank", "position", *KEY, **_inputs(blocking, eager, posted))
    last = _with_barrier(
        timed.group_by(per_lane).agg(pl.col("lane_end").max(), pl.col("w_start", "w_end").first()), barriers
    )
    tails = last.select(
        *per_lane,
        "w_start",
        "barrier",
        "opened",
        active_end=_active_end(last, gaps),
        labelled_end=pl.col("released").is_not_null().any().over("step"),
    ).with_columns(**{part: _class_time(gaps, (part,), last, ("lane_end", "arrived")) for part in TAIL_PARTS})
    return OwnSteps(actions, tails.sort(per_lane), blocking, eager, posted)


def _with_barrier(last: pl.DataFrame, barriers: pl.DataFrame | None) -> pl.DataFrame:
    """`last` (rank, step, lane_end, w_start, w_end) with `arrived`, when the rank entered the step-end
    barrier (its window's end where it has none), `released`, when the barrier let it go (null without
    one), `opened`, how long after the step's first window this rank's opened where the step has a
    barrier (the previous one let the rank go later; 0 without one: a late opening there is the previous
    step running on, named in the residual), and `barrier`, from the last rank's arrival to this rank's
    window end less `opened` (ns): the step is the longest window, each measured from its own opening."""
    if barriers is None:
        barriers = pl.DataFrame(
            schema={"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}
        )
    spans = barriers.group_by("rank", "step").agg(
        arrived=pl.col("start_ns").min(), released=pl.col("end_ns").max()
    )
    ended = pl.col("released").is_not_null().any().over("step")
    return (
        last.join(spans, on=["rank", "step"], how="left", maintain_order="left")
        .with_columns(
            arrived=pl.coalesce("arrived", "w_end"),
            opened=pl.when(ended).then(pl.col("w_start") - pl.col("w_start").min().over("step")).otherwise(0),
        )
        .with_columns(
            barrier=(pl.col("w_end") - pl.col("arrived").max().over("step") - pl.col("opened")).clip(
                lower_bound=0
            ),
        )
        .with_columns(pl.col("opened", "barrier").cast(pl.Float64))
    )


def _active_end(last: pl.DataFrame, gaps: pl.DataFrame) -> pl.Series:
    """Per row of `last` (rank, step, lane_end, w_end, released): when the rank's last recorded activity of
    the step ended: its last action, the last stretch of its own time (HOST_CLASSES) after it, or its
    step-end barrier."""
    own = gaps.filter(pl.col("class").is_in(HOST_CLASSES)).select("rank", "step", gap_end="end_ns")
    after = (
        last.with_row_index("row")
        .join(own, on=["rank", "step"], how="left")
        .filter(pl.col("gap_end").is_null() | (pl.col("gap_end") <= pl.col("w_end")))
        .group_by("row")
        .agg(
            pl.max_horizontal("lane_end", pl.col("gap_end").max(), pl.col("released").first())
            .first()
            .alias("active_end")
        )
        .sort("row")
    )
    return after["active_end"]


def _sends_block(timed: pl.DataFrame, sends: pl.DataFrame | None) -> bool:
    """Whether the run's sends wait for their receivers. From what the trace says where it has gloo's span
    of the sends: most of them ended inside their call (an isend's outlives it). Else from timing: of the
    sends that began before their receiver's wait, more ended after it than before it; a loaded host's
    slow isend calls, ending after a receiver began waiting, can outvote the rest there."""
    if sends is not None and sends.height:
        return bool(sends["outlives"].mean() < 0.5)
    early = timed.filter(pl.col("recv_wait_ns").is_not_null() & (pl.col("start_ns") < pl.col("recv_wait_ns")))
    waited = (early["end_ns"] > early["recv_wait_ns"]).sum()
    return bool(waited > early.height - waited)


def _receives_eager(timed: pl.DataFrame) -> bool:
    """Whether a receive posted after its partner's send had begun finds the data there (eager, as NCCL's
    small messages and the synthetic traces' transport) rather than paying the transfer anyway (a
    rendezvous, gloo's): its wait is under half the transfer of the receives that waited for the send.
    Without late receives the two cannot be told apart: a rendezvous."""
    recvs = timed.filter(pl.col("kind").is_in(["RECV_F", "RECV_B"]) & pl.col("partner_ns").is_not_null())
    w0, w1 = pl.coalesce("w0", "end_ns"), pl.coalesce("w1", "end_ns")
    late = recvs.filter(w0 >= pl.col("partner_ns")).select(wait=w1 - w0)["wait"]
    early = recvs.filter(w0 < pl.col("partner_ns")).select(transfer=w1 - pl.col("partner_ns"))["transfer"]
    if late.is_empty() or early.is_empty():
        return False
    return bool(late.median() < 0.5 * early.median())


def _with_consumer_waits(timed: pl.DataFrame) -> pl.DataFrame:
    """`timed` with, where a RECV only posted its receive, `seen_transfer` on the RECV and `consumer_wait`
    on its consumer (ns; null elsewhere). gloo closes the receive's span when the consumer's wait returns,
    whenever the data came, so the wait's end less the later post (both sides') bounds the transfer only:
    a consumer that asked after its data came (the send began long before) waits no longer than its host
    takes to the call. The transfer seen is that bound, but no longer than the consumer waited; the
    consumer's wait for the data is the part of its wait after its start that this transfer reaches,
    the rest of it host time."""
    recv_kind = (
        pl.when(pl.col("kind") == "F")
        .then(pl.lit("RECV_F"))
        .when(pl.col("kind").is_in(["B", "I"]))
        .then(pl.lit("RECV_B"))
    )
    keys = ["step", "stage", "microbatch", "recv_kind"]
    consumers = timed.filter(recv_kind.is_not_null()).select(
        *keys[:3], recv_kind=recv_kind, c_start="start_ns", c_end="end_ns"
    )
    both_posted = pl.max_horizontal("w0", pl.col("partner_ns").fill_null(pl.col("w0")))
    waited = (pl.min_horizontal("w1", "c_end") - pl.col("c_start")).clip(lower_bound=0)
    seen = pl.min_horizontal(pl.col("w1") - both_posted, waited).clip(lower_bound=0)
    hops = (
        timed.filter(pl.col("kind").is_in(["RECV_F", "RECV_B"]) & (pl.col("w1") > pl.col("end_ns")))
        .select(*keys[:3], "w0", "w1", "partner_ns", recv_kind="kind")
        .join(consumers, on=keys)
        .select(
            *keys,
            seen_transfer=seen,
            consumer_wait=(both_posted + seen - pl.col("c_start")).clip(lower_bound=0),
        )
    )
    return (
        timed.with_columns(
            recv_kind=pl.when(pl.col("kind").str.starts_with("RECV")).then("kind").otherwise(recv_kind)
        )
        .join(hops, on=keys, how="left", maintain_order="left")
        .with_columns(
            seen_transfer=pl.when(pl.col("kind").str.starts_with("RECV")).then("seen_transfer"),
            consumer_wait=pl.when(pl.col("kind").is_in(["F", "B", "I"])).then("consumer_wait"),
        )
        .drop("recv_kind")
    )


def _inputs(blocking: bool, eager: bool, posted: bool) -> dict[str, pl.Expr]:
    kind = pl.col("kind")

    def ns(expr: pl.Expr) -> pl.Expr:  # a difference of integer ns, as a float only then
        return expr.cast(pl.Float64)

    compute = kind.is_in(["F", "B", "I", "W"])
    recv = kind.is_in(["RECV_F", "RECV_B"])
    w0 = pl.coalesce("w0", "end_ns")  # a RECV that never blocked: the data was there
    w1 = pl.coalesce("w1", "end_ns")
    partner = pl.col("partner_ns").fill_null(w0)
    recv_transfer = (w1 - pl.max_horizontal(w0, partner)).clip(lower_bound=0)
    waited_from = w1
    if eager:  # the latency after the send began, seen only where the receiver was already waiting
        recv_transfer = pl.when(w0 < partner).then(w1 - partner)
        waited_from = pl.when(w0 < partner).then(w1).otherwise(w0)  # a late receive's own wait is host time
    recv_pre, post_from, compute_host = ns(w0 - pl.col("start_ns")), waited_from, pl.lit(0)
    if posted:  # the lane goes on after the post; the consumer's wait for the data is not host time
        posted_at = pl.min_horizontal(w0, "end_ns")
        recv_pre, post_from = ns(posted_at - pl.col("start_ns")), posted_at
        compute_host = pl.col("consumer_wait").fill_null(0)
        recv_transfer = pl.coalesce("seen_transfer", recv_transfer)
    occupied = ns(pl.col("lane_end") - pl.col("start_ns"))
    if blocking:
        send_transfer = ns(
            pl.col("end_ns")
            - pl.max_horizontal("start_ns", pl.col("recv_wait_ns").fill_null(pl.col("start_ns")))
        )
        send_pre = pl.lit(0.0)
    else:
        send_transfer, send_pre = pl.col("send_wait"), occupied - pl.col("send_wait")
    zero = pl.lit(0.0)
    span = ns(pl.col("end_ns") - pl.col("start_ns"))
    return {
        "lead": pl.col("lead"),
        "pre": pl.when(compute)
        .then(span - pl.col("busy_ns") - compute_host)
        .when(recv)
        .then(recv_pre)
        .otherwise(send_pre),
        "work": pl.when(compute).then(pl.col("busy_ns")).otherwise(zero),
        "transfer": pl.when(compute).then(zero).when(recv).then(ns(recv_transfer)).otherwise(send_transfer),
        "post": pl.when(recv).then(ns(pl.col("end_ns") - post_from)).otherwise(zero),
    }
