"""Replay a run's schedule with what its measured steps did (runners.schedules.simulate).

From the cells of each step (all ranks, one clock) come, per compute action: its duration (its busy
time: analysis.attribution.parts), the latency of each cross-rank input (when the data was there on the
consumer, minus when the producer finished) and the gap (how long after it could have started it did
start, plus the host time inside the cell, which is not work).
With all three the replay reproduces the measured compute starts; dropping some of them gives the
counterfactual rungs of the waterfall (analysis.attribution.waterfall).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import polars as pl

from runners.schedules import Action, Kind, Schedule, Timeline, dependencies, simulate
from runners.schedules.dependencies import matching_send, receiving

KEY = ["stage", "kind", "microbatch"]  # an action as the cells name it
_KEY_SCHEMA = {"stage": pl.Int64, "kind": pl.Utf8, "microbatch": pl.Int64}


@dataclass(frozen=True)
class Measured:
    """One step's measurements in ns, keyed by the schedule's compute actions (what `replay` replays)."""

    duration: dict[Action, float]
    latency: dict[tuple[Action, Action], float] = field(default_factory=dict)  # (producer, consumer)
    gap: dict[Action, float] = field(default_factory=dict)


class Measurements(NamedTuple):
    """Every analysed step's measurements in ns: `actions` (step, KEY, duration, gap: null where the
    step has no cell of the action) and `hops` (step, direction, latency, seen: False where the arrival
    was not seen, so the latency is a bound)."""

    actions: pl.DataFrame
    hops: pl.DataFrame


def direction(producer: Action) -> str:
    """The kind of hop a producer's output makes: activations (F) or gradients (B)."""
    return "F" if producer.kind is Kind.F else "B"


class _Plan(NamedTuple):
    """The schedule as tables, the same for every step. Each action the measurement looks up has an id
    (`ids`: id, KEY), so the lookups are joins on integers."""

    order: pl.DataFrame  # per rank its executed order: rank, position, id, KEY
    # each action's inputs: id; its producer (p_id) and direction; where that is on another rank, the RECV
    # that brings it (r_id) and the peer's SEND that RECV waits for (s_id)
    inputs: pl.DataFrame
    ids: pl.DataFrame


def _plan(schedule: Schedule) -> _Plan:
    ids: dict[Action, int] = {}

    def id_of(action: Action) -> int:
        return ids.setdefault(action, len(ids))

    order, inputs = [], []
    for rank, actions in enumerate(schedule.orders):
        for position, action in enumerate(actions):
            order.append((rank, position, id_of(action)))
            for dep in dependencies(schedule, action):
                recv = send = None
                if schedule.rank_of(dep.stage) != rank:
                    receiver = receiving(action)
                    recv, send = id_of(receiver), id_of(matching_send(receiver))
                inputs.append((id_of(action), id_of(dep), direction(dep), recv, send))
    keyed = pl.DataFrame(
        [(n, a.stage, a.kind.value, a.microbatch) for a, n in ids.items()],
        schema={"id": pl.Int64, **_KEY_SCHEMA},
        orient="row",
    )
    order = pl.DataFrame(order, schema=["rank", "position", "id"], orient="row").join(
        keyed, on="id", maintain_order="left"
    )
    columns = {"id": pl.Int64, "p_id": pl.Int64, "direction": pl.Utf8, "r_id": pl.Int64, "s_id": pl.Int64}
    return _Plan(order, pl.DataFrame(inputs, schema=columns, orient="row"), keyed)


def _at(frame: pl.DataFrame, prefix: str, **values: str) -> pl.DataFrame:
    """step, id as prefix+id, and `values` (new name -> column) of `frame`."""
    return frame.select("step", pl.col("id").alias(f"{prefix}id"), **values)


def _inputs(
    present: pl.DataFrame, inputs: pl.DataFrame, rows: pl.DataFrame, spans: pl.DataFrame
) -> pl.DataFrame:
    """Each input of an action with a cell whose producer has one: made_ns (the producer's end) and,
    across ranks, the latency to its arrival and whether that was seen. The arrival is the end of the
    RECV's wait if the receiver was waiting before the data was sent; else at the latest that end, or the
    RECV's start (an upper bound: the data may have been there for a while), or the send without a RECV."""
    joined = (
        present.select("step", "id")
        .join(inputs, on="id")
        .join(_at(rows, "p_", made_ns="end_ns"), on=["step", "p_id"])
        .join(_at(rows, "s_", sent_ns="start_ns"), on=["step", "s_id"], how="left")
        .join(_at(rows, "r_", recv_ns="start_ns"), on=["step", "r_id"], how="left")
        .join(_at(spans, "r_", wait_start="start_ns", wait_end="end_ns"), on=["step", "r_id"], how="left")
    )
    sent = pl.max_horizontal("made_ns", "sent_ns")
    arrival = (
        pl.when(pl.col("recv_ns").is_null())
        .then(sent)
        .when(pl.col("wait_end").is_null())
        .then("recv_ns")
        .otherwise("wait_end")
    )
    seen = pl.col("recv_ns").is_not_null() & (pl.col("wait_start") <= sent).fill_null(False)
    latency = pl.when(pl.col("r_id").is_not_null()).then((arrival - pl.col("made_ns")).clip(lower_bound=0))
    return joined.select("step", "id", "direction", "made_ns", latency=latency, seen=seen)


def measure(
    schedule: Schedule, cells: pl.DataFrame, waits: pl.DataFrame, origins: pl.DataFrame
) -> Measurements:
    """The measurements of each step of `origins` (step, origin_ns) from the cells and waits of all
    ranks (the last cell where an action has several): in each rank's order an action is ready once the
    rank is free and its inputs are there, and the rank is free again its occupied time after the later
    of that and the action's start. Times stay integer ns: a float at ~1.8e18 ns since the epoch
    resolves only 256 ns."""
    plan = _plan(schedule)
    busy = pl.col("busy_ns") if "busy_ns" in cells.columns else pl.lit(None, pl.Float64).alias("busy_ns")
    rows = (
        cells.filter(pl.col("step").is_in(origins["step"].implode()))
        .join(plan.ids, on=KEY, maintain_order="left")
        .select("step", "id", "start_ns", "end_ns", "blocked_ns", busy)
        .unique(["step", "id"], keep="last")
    )
    spans = (
        waits.join(plan.ids, on=KEY)
        .group_by("step", "id")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    )
    # kept in each rank's order within a step, as _timed reads them
    every = origins.join(plan.order, how="cross", maintain_order="left_right").join(
        rows, on=["step", "id"], how="left", maintain_order="left"
    )
    present = every.filter(pl.col("start_ns").is_not_null())
    found = _inputs(present, plan.inputs, rows, spans)
    ready = found.group_by("step", "id").agg(
        inputs_ns=(pl.col("made_ns") + pl.col("latency").fill_null(0)).max()
    )
    timed = _timed(present.join(ready, on=["step", "id"], how="left", maintain_order="left"))
    actions = every.join(timed, on=["step", "id"], how="left").select(
        "step", *KEY, pl.col("duration").fill_null(0.0), "gap"
    )
    hops = found.filter(pl.col("latency").is_not_null()).select(
        "step", "direction", pl.col("latency").cast(pl.Float64), "seen"
    )
    return Measurements(actions, hops)


def _timed(present: pl.DataFrame) -> pl.DataFrame:
    """Per action with a cell its duration (the work: the cell's busy time) and gap (after it was ready,
    plus the host time inside the cell). The rank's free time follows free_i = max(free_i-1, max(inputs_i,
    start_i)) + occupied_i from the step's origin, which is C_i + the running max of max(inputs_j,
    start_j) - C_j-1 (C: the running sum of occupied), so one pass of cumulative sums. `present` is in
    each rank's order within each step."""
    rank_step = ("step", "rank")
    occupied = pl.col("end_ns") - pl.col("start_ns") - pl.col("blocked_ns")
    before = pl.col("total") - pl.col("occupied")  # C_i-1
    opens = pl.max_horizontal("origin_ns", pl.max_horizontal("inputs_ns", "start_ns") - before)
    freed = pl.col("free").shift(1).over(rank_step).fill_null(pl.col("origin_ns"))
    ready = pl.max_horizontal(freed, "inputs_ns")
    work = pl.min_horizontal("busy_ns", pl.col("occupied").cast(pl.Float64))
    gap = (pl.col("start_ns") - ready).clip(lower_bound=0).cast(pl.Float64) + pl.col("occupied") - work
    return (
        present.with_columns(occupied=occupied)
        .with_columns(total=pl.col("occupied").cum_sum().over(rank_step))
        .with_columns(free=pl.col("total") + opens.cum_max().over(rank_step))
        .select("step", "id", duration=work, gap=gap)
    )


def replay(schedule: Schedule, measured: Measured, gaps: bool = True, latencies: bool = True) -> Timeline:
    """The schedule replayed with the measured durations, and with the measured gaps and latencies
    where asked; times in ns from the step's origin."""
    return simulate(
        schedule,
        duration=lambda _rank, action: measured.duration.get(action, 0.0),
        latency=(lambda dep, action: measured.latency.get((dep, action), 0.0)) if latencies else None,
        gap=(lambda _rank, action: measured.gap.get(action, 0.0)) if gaps else None,
    )
