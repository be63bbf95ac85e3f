"""Gap classes on a hand-timed 2-rank GPipe step: every nanosecond lands in the class the rules say."""

from __future__ import annotations

import polars as pl
from test_cells import gpipe_m1_run

from analysis.analyze import analyze_run, read_run
from analysis.classify import Rules

US = 1_000


def totals(gaps: pl.DataFrame, rank: int) -> dict[str, int]:
    mine = gaps.filter(pl.col("rank") == rank)
    return {c: v for c, v in mine.group_by("class").agg((pl.col("end_ns") - pl.col("start_ns")).sum()).iter_rows()}


def test_wait_splits_at_the_peers_send_and_sending_is_p2p(tmp_path):
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path))).gaps
    # rank 1 waits (2,15); rank 0's SEND_F starts at 12: bubble 10 us, then 3 us in transfer, plus its
    # own 1 us sending in SEND_B; the other 36 us are framework time in and between actions
    assert totals(gaps, 1) == {"bubble": 10 * US, "p2p_wait": 4 * US, "launch_overhead": 36 * US}
    # rank 0 waits (15,69); rank 1's SEND_B starts at 68: 53 us bubble, 1 us transfer, 1 us sending
    assert totals(gaps, 0) == {"bubble": 53 * US, "p2p_wait": 2 * US, "launch_overhead": 15 * US}
    bubble = gaps.filter((pl.col("rank") == 1) & (pl.col("class") == "bubble"))
    assert bubble.select("start_ns", "end_ns").rows() == [(2 * US, 12 * US)]


def test_long_stretch_outside_every_action_is_other(tmp_path):
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path)), rules=Rules(host_gap_max_ns=5 * US)).gaps
    assert totals(gaps, 1)["other"] == 31 * US  # (69,100): after the last action, longer than 5 us
    assert totals(gaps, 0)["other"] == 9 * US  # (91,100)
    assert totals(gaps, 1)["launch_overhead"] == 5 * US


def test_gaps_never_overlap_and_stay_inside_the_step(tmp_path):
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path))).gaps.sort("rank", "start_ns")
    overlap = gaps.filter(pl.col("start_ns") < pl.col("end_ns").shift(1).over("rank"))
    assert overlap.height == 0
    assert gaps["start_ns"].min() >= 0 and gaps["end_ns"].max() <= 100 * US
