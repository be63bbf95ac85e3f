"""Every class decision for a rank's idle time, in the order it is made (docs/numbers.md#gap-classes):

1. `classify`: each idle stretch of its step. A wait is classed by its layer (analysis.timeline.waits):
   bubble_wait bubble, p2p_wait p2p_wait, unmatched_wait other. Idle time that is not a wait is
   launch_overhead when the host had not yet issued the next work (GPU: no launched kernel pending,
   HTA's host-wait rule; CPU: framework time inside RECV actions or between actions up to a
   threshold), else other. Idle before a rank's first action of the step or after its last is bubble
   (the schedule had nothing for it: fill and drain) unless the rank was busy with work outside the
   schedule there (optimizer step, kernels no action launched): other; a short idle before the first
   action, or any before a first action that is compute (it waits on no peer: the first stage's
   forward), is the host getting to it: launch_overhead.
2. `with_collectives`: in a job of several pipelines, the idle time under the collectives, by their
   group's scope (analysis.timeline.dp_sync finds them): dp_sync on a DP group, bubble then other on a
   group across stages.
3. `shortfall`: the time by which a rank's window is shorter than the step's longest, outside every gap
   of its own: drain (after its window closed) bubble, late (before it opened) other (SHORTFALL).

`device_idle` is Holistic Trace Analysis's split of a GPU stream's idle time, beside them.
"""

from __future__ import annotations

import functools

import polars as pl

from analysis.cells.labelled import device_events
from analysis.schema import GAP_CLASSES, Rules
from analysis.timeline.dp_sync import cut
from analysis.timeline.gaps import queued, runs, segments
from analysis.traces.layout import DP, STAGES
from analysis.vocabulary import DeviceIdle, GapClass

GAP_SCHEMA = {"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "class": pl.Utf8}


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


def _reclassed(
    gaps: pl.DataFrame, intervals: pl.DataFrame, name: str, only: str | None = None
) -> pl.DataFrame:
    """`gaps` with their idle time under `intervals` (rank, start_ns, end_ns) classed `name`, but dp_sync
    (and, with `only`, that class alone)."""
    pieces = cut(gaps, intervals)
    inside = pl.col("inside") & (pl.col("class") != GapClass.DP_SYNC)
    if only is not None:
        inside &= pl.col("class") == only
    return pieces.with_columns(pl.when(inside).then(pl.lit(name)).otherwise("class").alias("class")).drop(
        "inside"
    )


def with_collectives(gaps: pl.DataFrame, instances: pl.DataFrame) -> pl.DataFrame:
    """`gaps` (rank, step, start_ns, end_ns, class) with the idle time under the collectives classed by
    their group's scope, whatever it was classed before: on a DP group dp_sync, and so is the drain
    bubble before its launch while the rank waited for its replicas (from ready_ns to the end of its
    skew); on a group across stages,
    within its start skew bubble (waiting for another stage, as for a pipeline partner not ready), after
    it other (its transfer, work outside the schedule). Within one stage (tensor parallel) it stays."""
    dp = instances.filter(pl.col("scope") == DP)
    gaps = _reclassed(gaps, dp.select("rank", "start_ns", "end_ns"), GapClass.DP_SYNC)
    held = dp.select("rank", start_ns="ready_ns", end_ns=pl.min_horizontal("start_ns", "skew_end_ns"))
    gaps = _reclassed(gaps, held, GapClass.DP_SYNC, only=GapClass.BUBBLE)
    across = instances.filter(pl.col("scope") == STAGES)
    waited = pl.coalesce("skew_end_ns", "start_ns")
    gaps = _reclassed(gaps, across.select("rank", start_ns=waited, end_ns="end_ns"), GapClass.OTHER)
    return _reclassed(gaps, across.select("rank", "start_ns", end_ns=waited), GapClass.BUBBLE)


# The two pieces of a rank's shortfall (shortfall) and the class each is.
SHORTFALL = {"drain": GapClass.BUBBLE, "late": GapClass.OTHER}


def shortfall(windows: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step) of `windows` (all ranks on one clock): step_ns, the step's longest window, and
    its window's shortfall against it, cut in two.

    `drain`, bubble: the part after the rank's window closed while another rank's was still open. A loop
    without a barrier at the end of a step (others' traces) ends a rank's ProfilerStep once its own
    share is done: the last stage's ends after its last send, while the first still runs its backward.
    The rank had nothing left of the step while another still ran it, which is drain, and the same
    stretch is bubble where a barrier holds the rank's window open to the step's end (idle after its
    last action, analysis.timeline.classify). It runs to the step's last close, so it also holds another
    rank's longer optimizer step, as a barrier's wait would.

    `late`, other: the rest, which lies before the window opened while the step's longest was open. The
    rank had not begun this step rather than finished it: it was still in its previous one (a rank's
    ProfilerStep spans follow one another), or waiting without computing before the step's last window
    opened, a wait timeline.gaps.aligned_starts gives to the previous step. Either way the time is the
    previous step's, so this step gets no class of the pipeline for it. (A window that opened early
    and closed early is all drain: its shortfall lies after it.)
    """
    length = pl.col("end_ns") - pl.col("start_ns")
    missing = pl.col("step_ns") - length
    return (
        windows.with_columns(step_ns=length.max().over("step"), closed_ns=pl.col("end_ns").max().over("step"))
        .with_columns(drain=(pl.col("closed_ns") - pl.col("end_ns")).clip(pl.lit(0), missing))
        .select("rank", "step", "step_ns", window_ns=length, drain="drain", late=missing - pl.col("drain"))
    )


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
