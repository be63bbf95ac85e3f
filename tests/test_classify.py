"""Gap classes on a hand-timed 2-rank GPipe step: every nanosecond lands in the class the rules say."""

from __future__ import annotations

import polars as pl
from test_cells import gpipe_m1_run, span

from analysis.analyze import analyze_run, read_run
from analysis.classify import Rules

US = 1_000


def totals(gaps: pl.DataFrame, rank: int) -> dict[str, int]:
    mine = gaps.filter(pl.col("rank") == rank)
    return {c: v for c, v in mine.group_by("class").agg((pl.col("end_ns") - pl.col("start_ns")).sum()).iter_rows()}


def test_wait_splits_at_the_peers_send_and_sending_is_p2p(tmp_path):
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path))).gaps
    # rank 1 waits (2,15); rank 0's SEND_F starts at 12: bubble 10 us, then 3 us in transfer, plus its
    # own 1 us sending in SEND_B; after its last action (69,100) it has nothing to do: drain, bubble;
    # the other 5 us are framework time before, in and between actions
    assert totals(gaps, 1) == {"bubble": 41 * US, "p2p_wait": 4 * US, "launch_overhead": 5 * US}
    # rank 0 waits (15,69); rank 1's SEND_B starts at 68: 53 us bubble, 1 us transfer, 1 us sending;
    # drain (91,100) is bubble, (0,2) before its first action is the host getting to it
    assert totals(gaps, 0) == {"bubble": 62 * US, "p2p_wait": 2 * US, "launch_overhead": 6 * US}
    bubble = gaps.filter((pl.col("rank") == 1) & (pl.col("class") == "bubble"))
    assert bubble.select("start_ns", "end_ns").rows() == [(2 * US, 12 * US), (69 * US, 100 * US)]


def test_work_outside_the_schedule_is_other_and_idle_around_it_is_drain(tmp_path):
    optimizer = [span("optimizer_step", 70, 99), span("aten::add_", 71, 80, cat="cpu_op")]
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path, extra={1: optimizer}))).gaps
    assert totals(gaps, 1) == {"bubble": 12 * US, "p2p_wait": 4 * US, "launch_overhead": 5 * US, "other": 29 * US}


def test_long_idle_between_actions_is_other_and_long_head_is_bubble(tmp_path):
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path)), rules=Rules(host_gap_max_ns=1 * US + 1)).gaps
    # rank 0: (0,2) before its first action is now too long for a launch: nothing to do, bubble;
    # (12,15) = SEND 1 us (p2p) + (13,14) between + (14,15) inside RECV, each short
    assert totals(gaps, 0) == {"bubble": 64 * US, "p2p_wait": 2 * US, "launch_overhead": 4 * US}
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path)), rules=Rules(host_gap_max_ns=US // 2)).gaps
    # every stretch between actions (1 us each: (13,14), (70,71) on rank 0) is now other
    assert totals(gaps, 0)["other"] == 2 * US


def test_gaps_never_overlap_and_stay_inside_the_step(tmp_path):
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path))).gaps.sort("rank", "start_ns")
    overlap = gaps.filter(pl.col("start_ns") < pl.col("end_ns").shift(1).over("rank"))
    assert overlap.height == 0
    assert gaps["start_ns"].min() >= 0 and gaps["end_ns"].max() <= 100 * US
