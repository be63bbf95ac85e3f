"""Gap classes on a hand-timed 2-rank GPipe step: every nanosecond lands in the class the rules say."""

from __future__ import annotations

import polars as pl
import pytest
from test_cells import cpu_action, gpipe_m1_run, gpu_action, span, trace, write_trace

from analysis.cells.labelled import CELL_KEY
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.schema import Rules
from analysis.timeline.waits import split_waits
from runners.schedules.trace_names import WAIT_SENDS

US = 1_000


def totals(gaps: pl.DataFrame, rank: int) -> dict[str, int]:
    mine = gaps.filter(pl.col("rank") == rank)
    return {
        c: v for c, v in mine.group_by("class").agg((pl.col("end_ns") - pl.col("start_ns")).sum()).iter_rows()
    }


def test_wait_splits_at_the_peers_send_and_sending_is_p2p(tmp_path):
    gaps = analyze_pipeline(read_run(gpipe_m1_run(tmp_path))).gaps
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
    gaps = analyze_pipeline(read_run(gpipe_m1_run(tmp_path, extra={1: optimizer}))).gaps
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
    gaps = analyze_pipeline(read_run(gpipe_m1_run(tmp_path, extra=extra))).gaps
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


def blocking_send_run(directory, send_end_ms: float):
    """Two CPU ranks, GPipe, m = 1, times in ms: rank 0's SEND_F0 opens at 10, rank 1 (late) posts its
    RECV_F0 at 15; a blocking send (`send_end_ms` 16) stays in its cell until the transfer is done, an
    isend's host call (11) returns before the receiver came.

    rank 0: 0F0 [1,10]  0SEND_F0 [10,send_end]  0RECV_B0 [16.5,70] waits (17,69.5)  0B0 [70.5,90]
    rank 1: 1RECV_F0 [15,17] waits (15.2,16.8)  1F0 [17.5,37]  1B0 [37.5,68]  1SEND_B0 [68,69]
    """
    ms = 1000  # the trace's us
    rank0 = [
        *cpu_action("0F0", 1 * ms, 10 * ms),
        *cpu_action("0SEND_F0", 10 * ms, send_end_ms * ms),
        *cpu_action("0RECV_B0", 16.5 * ms, 70 * ms, wait=(17 * ms, 69.5 * ms)),
        *cpu_action("0B0", 70.5 * ms, 90 * ms),
    ]
    rank1 = [
        *cpu_action("1RECV_F0", 15 * ms, 17 * ms, wait=(15.2 * ms, 16.8 * ms)),
        *cpu_action("1F0", 17.5 * ms, 37 * ms),
        *cpu_action("1B0", 37.5 * ms, 68 * ms),
        *cpu_action("1SEND_B0", 68 * ms, 69 * ms),
    ]
    directory.mkdir()
    write_trace(directory, trace(0, [(0, 100 * ms)], rank0))
    write_trace(directory, trace(1, [(0, 100 * ms)], rank1))
    return directory


def test_a_blocking_send_waits_for_its_receiver_as_bubble_then_transfers_as_p2p(tmp_path):
    ms = 1_000_000  # ns
    gaps = analyze_pipeline(read_run(blocking_send_run(tmp_path / "blocking", 16))).gaps
    sending = gaps.filter(
        (pl.col("rank") == 0) & (pl.col("start_ns") >= 10 * ms) & (pl.col("end_ns") <= 16 * ms)
    )
    # 5 ms before rank 1 posted its receive: the partner was not ready; 1 ms after: the transfer
    assert sending.select("class", "start_ns", "end_ns").rows() == [
        ("bubble", 10 * ms, 15 * ms),
        ("p2p_wait", 15 * ms, 16 * ms),
    ]
    # the receiver's side is unchanged: its producer had begun sending at 10, so its wait is transfer
    assert totals(gaps, 1)["p2p_wait"] == 1.6 * ms + 1 * ms  # (15.2,16.8) and its own SEND_B0 (68,69)
    # an isend's host call that returned before its receiver posted did not wait for it: p2p as before
    gaps = analyze_pipeline(read_run(blocking_send_run(tmp_path / "isend", 11))).gaps
    sending = gaps.filter(
        (pl.col("rank") == 0) & (pl.col("start_ns") >= 10 * ms) & (pl.col("end_ns") <= 11 * ms)
    )
    assert sending.select("class", "start_ns", "end_ns").rows() == [("p2p_wait", 10 * ms, 11 * ms)]


def test_a_wait_inside_a_send_splits_at_its_receivers_posting():
    # rank 0's SEND_F0 (10,16) blocks in (11,16); rank 1 posts its RECV_F0 at 15; rank 1's SEND_B0 (68,69)
    # came after its receiver had posted (14): no unposted stretch
    cells = pl.DataFrame(
        [
            (0, 0, 0, "SEND_F", 0, 10, 16),
            (1, 0, 1, "RECV_F", 0, 15, 17),
            (1, 0, 1, "SEND_B", 0, 68, 69),
            (0, 0, 0, "RECV_B", 0, 14, 70),
        ],
        schema=["rank", "step", "stage", "kind", "microbatch", "start_ns", "end_ns"],
        orient="row",
    )
    waits = cells.head(1).with_columns(start_ns=pl.lit(11, pl.Int64)).select(*CELL_KEY, "start_ns", "end_ns")
    layers = split_waits(cells, waits).sort("rank", "start_ns", "layer")
    assert layers.select("rank", "layer", "start_ns", "end_ns").rows() == [
        (0, "unposted", 10, 15),
        (0, "bubble_wait", 11, 15),
        (0, "p2p_wait", 15, 16),
    ]


def test_long_idle_between_actions_is_other_and_long_head_before_a_receive_is_bubble(tmp_path):
    gaps = analyze_pipeline(read_run(gpipe_m1_run(tmp_path)), rules=Rules(host_gap_max_ns=1 * US + 1)).gaps
    # rank 0: (0,2) before its first action, a forward that waits on no peer, is the host getting to it
    # at any length: launch_overhead, as are (13,14) between and (14,15) inside RECV, each short
    assert totals(gaps, 0) == {"bubble": 62 * US, "p2p_wait": 2 * US, "launch_overhead": 6 * US}
    gaps = analyze_pipeline(read_run(gpipe_m1_run(tmp_path)), rules=Rules(host_gap_max_ns=US // 2)).gaps
    # every stretch between actions (1 us each: (13,14), (70,71) on rank 0) is now other
    assert totals(gaps, 0)["other"] == 2 * US
    # rank 1's (0,1) before its first action, a receive, is now too long for a launch: nothing to do yet
    head = gaps.filter((pl.col("rank") == 1) & (pl.col("start_ns") == 0))
    assert head.select("class", "end_ns").rows() == [("bubble", 1 * US)]


def test_gaps_never_overlap_and_stay_inside_the_step(tmp_path):
    gaps = analyze_pipeline(read_run(gpipe_m1_run(tmp_path))).gaps.sort("rank", "start_ns")
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
    result = analyze_pipeline(read_run(run))
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


def test_a_gpu_host_blocked_on_its_send_waits_for_the_receiver_as_bubble_then_transfers_as_p2p(tmp_path):
    """Megatron's p2p synchronizes after its sends: rank 0's host sits in cudaDeviceSynchronize (5,40)
    while its SEND_F0 kernel (20,40) waits for rank 1, which posts its RECV_F0 at 35; nothing is queued
    on the compute stream, yet the host is not late: it waits for its partner, the rendezvous rule of
    blocking CPU sends."""
    nccl = "ncclDevKernel_SendRecv"
    rank0 = [
        *gpu_action("0F0", 1, 3, [("gemm", 10, 20)], 100),
        *gpu_action("0SEND_F0", 3, 5, [(nccl, 20, 40)], 200),
        span("cudaDeviceSynchronize", 5, 40, cat="cuda_runtime"),
        *gpu_action("0RECV_B0", 40, 42, [(nccl, 41.5, 80)], 300),
        *gpu_action("0B0", 42, 44, [("gemm", 82, 100)], 400),
    ]
    rank1 = [
        *gpu_action("1RECV_F0", 33, 35, [(nccl, 35, 40)], 100),
        *gpu_action("1F0", 35, 37, [("gemm", 41, 55)], 200),
        *gpu_action("1B0", 37, 39, [("gemm", 56, 75)], 300),
        *gpu_action("1SEND_B0", 39, 41, [(nccl, 75, 79)], 400),
    ]
    run = tmp_path / "run"
    run.mkdir()
    write_trace(run, trace(0, [(0, 100)], rank0))
    write_trace(run, trace(1, [(0, 100)], rank1))
    gaps = analyze_pipeline(read_run(run)).gaps
    sending = gaps.filter(
        (pl.col("rank") == 0) & (pl.col("start_ns") >= 20 * US) & (pl.col("end_ns") <= 41.5 * US)
    )
    assert sending.select("class", "start_ns", "end_ns").rows() == [
        ("bubble", 20 * US, 35 * US),
        ("p2p_wait", 35 * US, 40 * US),
        ("launch_overhead", 40 * US, 41.5 * US),  # the host free again, the receive not yet launched
    ]


def posted_receive_run(directory):
    """Two CPU ranks, GPipe, m = 1, as torch.distributed.pipelining runs it (us): each RECV label only
    posts its receive, a c10d::recv_ call that ends where gloo:recv opens; that span runs on into the
    consumer, which waits in it until the data came.

    rank 0: 0F0 [2,12]  0SEND_F0 [12,13]  0RECV_B0 [14,15] posts (14.2,14.5)  0B0 [16,91] waits (16,72)
    rank 1: 1RECV_F0 [1,5] posts (1.5,4.5)  1F0 [6,37] waits (6,15)  1B0 [38,68]  1SEND_B0 [68,69]
    """
    directory.mkdir()
    for rank, actions in enumerate(
        [
            [("0F0", 2, 12, None), ("0SEND_F0", 12, 13, None), ("0RECV_B0", 14, 15, (14.2, 14.5, 72))]
            + [("0B0", 16, 91, None)],
            [("1RECV_F0", 1, 5, (1.5, 4.5, 15)), ("1F0", 6, 37, None), ("1B0", 38, 68, None)]
            + [("1SEND_B0", 68, 69, None)],
        ]
    ):
        events = []
        for label, start, end, post in actions:
            events += cpu_action(label, start, end)
            if post is not None:
                call, opened, arrived = post
                events += [
                    span("c10d::recv_", call, opened, cat="cpu_op"),
                    span("gloo:recv", opened, arrived),
                ]
        write_trace(directory, trace(rank, [(0, 100)], events))
    return directory


def test_a_receive_only_posted_waits_in_its_consumer_not_in_its_label(tmp_path):
    gaps = analyze_pipeline(read_run(posted_receive_run(tmp_path / "run"))).gaps
    # 1RECV_F0's label [1,5] only posts the receive (a slow call, 3 us), long before rank 0 began sending
    # at 12: no data was in flight, it is the host's time in the action, as the replay takes it; with the
    # host getting to it before (0,1) and to 1F0 after (5,6), one stretch
    label = gaps.filter((pl.col("rank") == 1) & (pl.col("start_ns") < 5 * US) & (pl.col("end_ns") > 1 * US))
    assert label.select("class", "start_ns", "end_ns").rows() == [("launch_overhead", 0, 6 * US)]
    # the consumer's wait (6,15) is the hop: bubble until rank 0 began sending at 12, then the transfer
    consumer = gaps.filter(
        (pl.col("rank") == 1) & (pl.col("start_ns") >= 6 * US) & (pl.col("end_ns") <= 15 * US)
    )
    assert consumer.select("class", "start_ns", "end_ns").rows() == [
        ("bubble", 6 * US, 12 * US),
        ("p2p_wait", 12 * US, 15 * US),
    ]
    # rank 0 waits in 0B0 (16,72) for 1SEND_B0 (68): bubble 52 us, transfer 4 us, its label host time
    assert totals(gaps, 0)["p2p_wait"] == 4 * US + 1 * US  # and its own 0SEND_F0 (12,13)
