"""Gap classes on a hand-timed 2-rank GPipe step: every nanosecond lands in the class the rules say."""

from __future__ import annotations

import polars as pl
import pytest
from test_cells import gpipe_m1_run, gpu_action, span, trace, write_trace

from analysis.cells.labelled import CELL_KEY
from analysis.pipeline import analyze_run, read_run
from analysis.timeline.classify import Rules, split_waits
from runners.schedules.trace_names import WAIT_SENDS

US = 1_000


def totals(gaps: pl.DataFrame, rank: int) -> dict[str, int]:
    mine = gaps.filter(pl.col("rank") == rank)
    return {
        c: v for c, v in mine.group_by("class").agg((pl.col("end_ns") - pl.col("start_ns")).sum()).iter_rows()
    }


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
    assert totals(gaps, 1) == {
        "bubble": 12 * US,
        "p2p_wait": 4 * US,
        "launch_overhead": 5 * US,
        "other": 29 * US,
    }


def test_the_wait_for_pending_sends_is_p2p_once_the_receiver_posted_and_bubble_before(tmp_path):
    # rank 1 waits for its sends (69,80) after its last action: rank 0 had posted the receive of its
    # one send at 14, so all 11 us are transfer, not other; the optimizer (80,99) stays other
    extra = {1: [span(WAIT_SENDS, 69, 80), span("optimizer_step", 80, 99)]}
    gaps = analyze_run(read_run(gpipe_m1_run(tmp_path, extra=extra))).gaps
    assert totals(gaps, 1) == {
        "bubble": 11 * US,
        "p2p_wait": 15 * US,
        "launch_overhead": 5 * US,
        "other": 19 * US,
    }
    # the receiver posting at 75 inside the wait: bubble until then; a rank without sends: all bubble
    cells = pl.DataFrame(
        [(1, 0, 1, "SEND_B", 0, 68, 69), (0, 0, 0, "RECV_B", 0, 75, 90)],
        schema=["rank", "step", "stage", "kind", "microbatch", "start_ns", "end_ns"],
        orient="row",
    )
    waits = cells.clear().select(*CELL_KEY, "start_ns", "end_ns")
    send_waits = pl.DataFrame({"rank": [1, 0], "step": [0, 0], "start_ns": [69, 91], "end_ns": [90, 95]})
    layers = split_waits(cells, waits, None, send_waits).sort("rank", "start_ns")
    assert layers.select("rank", "layer", "start_ns", "end_ns").rows() == [
        (0, "bubble_wait", 91, 95),
        (1, "bubble_wait", 69, 75),
        (1, "p2p_wait", 75, 90),
    ]


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


def test_gpu_idle_is_split_by_the_nccl_wait_and_the_launch_queue(tmp_path):
    nccl = "ncclDevKernel_SendRecv"
    rank0 = [
        *gpu_action("0F0", 1, 3, [("gemm", 10, 30)], 100),
        *gpu_action("0SEND_F0", 3, 5, [(nccl, 30, 33)], 200),
        *gpu_action("0RECV_B0", 5, 7, [(nccl, 33, 80)], 300),
        *gpu_action("0B0", 7, 9, [("gemm", 82, 100)], 400),
    ]
    # each action's one launch call sits in the middle of its host span and lasts 1/8 of it
    rank1 = [
        *gpu_action("1RECV_F0", 1, 3, [(nccl, 5, 34)], 100),
        *gpu_action("1F0", 3, 5, [("gemm", 35, 50)], 200),
        *gpu_action("1B0", 51, 53, [("gemm", 53, 75)], 300),
        *gpu_action("1SEND_B0", 53, 55, [(nccl, 75, 79)], 400),
    ]
    run = tmp_path / "run"
    run.mkdir()
    write_trace(run, trace(0, [(0, 100)], rank0))
    write_trace(run, trace(1, [(0, 100)], rank1))
    result = analyze_run(read_run(run))
    # The device's step runs from its first kernel (rank 0: 10) to the host step's end (100); rank 1's
    # recv kernel starts at 5, but its step opens with the last rank's (10): before that it waits for a
    # step that has not begun (analysis.timeline.gaps.aligned_starts).
    # rank 1: recv kernel (10,34) waits for rank 0's send kernel starting at 30: bubble 20, p2p 4; its own
    # send kernel (75,79) runs on the NCCL stream after its last compute: drain, like (79,100), bubble (the
    # hop is counted once, on rank 0's receive); (50,52.25) before B0's launch is the host not having
    # issued work: launch; idle with a kernel queued ((34,35), (52.25,53)) is other
    assert totals(result.gaps, 1) == {
        "bubble": 45 * US,
        "p2p_wait": 4 * US,
        "launch_overhead": 2_250,
        "other": 1_750,
    }
    assert result.summary.step_time_ms == pytest.approx(0.090, abs=1e-12)  # (10,100) on both ranks
    for rank in result.summary.ranks:
        parts = sum(
            getattr(rank, k) or 0.0 for k in result.summary.parts
        )  # small_gemm unknown: no calibration
        assert parts == pytest.approx(0.090, abs=1e-12)
