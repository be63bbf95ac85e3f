"""Clock offsets from causality: injected skews are recovered within the issue's 50 us bound."""

from __future__ import annotations

import random

import msgspec
import polars as pl
import pytest

from analysis.timeline import clock
from runners.schedules import build, lower, simulate

MS = 1_000_000
US = 1_000


def pipeline_cells(
    sched: str, p: int, m: int, offsets: list[int], latency_f: int, latency_b: int, v: int = 1
) -> pl.DataFrame:
    """Cells of a simulated run as each rank's skewed clock records them (local = true + offset).

    A RECV span opens when its rank is free and closes when the data lands, as the native executor's
    blocking receive does; the simulator's RECV is the instant the data lands.
    """
    schedule = lower(build(sched, p, m, v))
    durations = {"F": 1 * MS, "B": 2 * MS, "I": 1 * MS, "W": 1 * MS}
    timeline = simulate(
        schedule,
        duration=lambda _r, a: durations.get(a.kind.value, 20 * US),
        latency=lambda src, _dst: latency_f if src.kind.value == "SEND_F" else latency_b,
    )
    rows, free = [], {}
    for rank, action, start, end in timeline.rows:
        opened = free.get(rank, 0.0) if action.kind.value.startswith("RECV") else start
        rows.append(
            (
                rank,
                0,
                action.stage,
                action.kind.value,
                action.microbatch,
                round(opened) + offsets[rank],
                round(end) + offsets[rank],
            )
        )
        free[rank] = end
    return pl.DataFrame(
        rows, schema=["rank", "step", "stage", "kind", "microbatch", "start_ns", "end_ns"], orient="row"
    )


NO_EVENTS = pl.DataFrame(
    schema={
        "rank": pl.Int64,
        "name": pl.Utf8,
        "cat": pl.Utf8,
        "ph": pl.Utf8,
        "start_ns": pl.Int64,
        "end_ns": pl.Int64,
    }
)


@pytest.mark.parametrize("sched,p,v", [("gpipe", 4, 1), ("1f1b", 4, 1), ("interleaved", 2, 2), ("zb", 3, 1)])
def test_injected_offsets_recovered_within_50us(sched, p, v):
    rng = random.Random(p * 7 + v)
    offsets = [rng.randint(-5 * MS, 5 * MS) for _ in range(p)]
    cells = pipeline_cells(sched, p, 8, offsets, latency_f=40 * US, latency_b=40 * US, v=v)
    estimate = clock.estimate(list(range(p)), cells, NO_EVENTS)
    for rank in range(1, p):
        truth = -(offsets[rank] - offsets[0])  # what to add to rank's clock to land on rank 0's
        assert abs(estimate.offset_ns(rank) - truth) <= 50 * US, (rank, estimate.offset_ns(rank), truth)
        assert estimate.ranks[rank].via == "p2p"
    assert estimate.inconsistent_pairs == ()


def test_asymmetric_latency_stays_inside_the_reported_uncertainty():
    """Midpoints err by half the asymmetry per hop; the reported bracket must still hold the truth."""
    offsets = [0, -5 * MS, 5 * MS, 1 * MS]
    cells = pipeline_cells("1f1b", 4, 8, offsets, latency_f=10 * US, latency_b=200 * US)
    estimate = clock.estimate([0, 1, 2, 3], cells, NO_EVENTS)
    errors = [abs(estimate.offset_ns(r) + offsets[r]) for r in range(4)]
    assert errors[3] > 50 * US  # three hops of 95 us asymmetry each: the midpoint alone cannot be exact
    for rank in range(4):
        assert errors[rank] <= estimate.ranks[rank].uncertainty_ns


def test_one_clock_stays_unshifted_despite_asymmetric_transfers():
    cells = pipeline_cells("1f1b", 4, 8, [0, 0, 0, 0], latency_f=10 * US, latency_b=300 * US)
    estimate = clock.estimate([0, 1, 2, 3], cells, NO_EVENTS)
    assert [r.offset_ns for r in estimate.ranks] == [0, 0, 0, 0]
    assert all(r.uncertainty_ns >= 300 * US for r in estimate.ranks[1:])  # the bracket is that wide


def test_forward_only_is_one_sided():
    offsets = [0, 3 * MS]
    cells = pipeline_cells("gpipe", 2, 4, offsets, 20 * US, 20 * US).filter(
        ~pl.col("kind").str.ends_with("B")
    )
    estimate = clock.estimate([0, 1], cells, NO_EVENTS)
    rank1 = estimate.ranks[1]
    assert rank1.uncertainty_ns is None and rank1.via == "p2p"
    # only "receive ends after send starts": a bound below the true -3 ms, short by send time + latency
    assert -3 * MS - 60 * US <= rank1.offset_ns <= -3 * MS


def test_collective_ends_align_ranks():
    offsets = {0: 0, 1: -4 * MS, 2: 2 * MS}
    rows = []
    for k in range(5):
        for rank, offset in offsets.items():
            start = k * MS + rank * 100 * US  # ranks join at different times, leave together (+ jitter)
            end = k * MS + 500 * US + (rank * 3 * US) % 7 * US
            rows.append(
                (rank, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", "X", start + offset, end + offset)
            )
    events = pl.DataFrame(rows, schema=NO_EVENTS.columns, orient="row")
    estimate = clock.estimate([0, 1, 2], None, events)
    assert estimate.collectives == 5
    for rank, offset in offsets.items():
        assert abs(estimate.offset_ns(rank) + offset) <= 10 * US
        assert estimate.ranks[rank].via in ("reference", "collective")


def test_unlinked_rank_is_reported_not_guessed():
    estimate = clock.estimate([0, 1], None, NO_EVENTS)
    assert [(r.offset_ns, r.via) for r in estimate.ranks] == [(0, "reference"), (0, "unlinked")]
    assert msgspec.to_builtins(estimate)["ranks"][1] == {
        "rank": 1,
        "offset_ns": 0,
        "uncertainty_ns": None,
        "via": "unlinked",
    }  # as summary.json holds it
