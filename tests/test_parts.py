"""A rank's window shorter than the step's longest: the stretch after it closed while another rank was
still in the step is drain bubble (a loop without a barrier at the end of its steps), the stretch before
it opened (still in its previous step) is other."""

from __future__ import annotations

import polars as pl
import pytest
from test_cells import cpu_action, span, trace, write_trace

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.schema import RANK_PARTS
from analysis.timeline.classify import shortfall

US = 1e-3  # ms


def optimizer(start_us: float, end_us: float) -> dict:
    return span("Optimizer.step#SGD.step", start_us, end_us, cat="cpu_op")


def seed_loop_without_barrier(directory):
    """The seed's GPipe loop at p = 2, m = 1 with no barrier ending the step (us): rank 1 ends its
    ProfilerStep after its send and its optimizer step, while rank 0 still receives and runs its backward.

    rank 0: 0F0 [2,12]  0SEND_F0 [12,13]  0RECV_B0 [14,70] waits (15,69)  0B0 [71,91]  optimizer [92,96]
    rank 1: 1RECV_F0 [1,16] waits (2,15)  1F0 [17,37]  1B0 [38,68]  1SEND_B0 [68,69]  optimizer [70,73]
    steps: rank 0 [0,97], rank 1 [0,74]
    """
    rank0 = [
        *cpu_action("0F0", 2, 12),
        *cpu_action("0SEND_F0", 12, 13),
        *cpu_action("0RECV_B0", 14, 70, wait=(15, 69)),
        *cpu_action("0B0", 71, 91),
        optimizer(92, 96),
    ]
    rank1 = [
        *cpu_action("1RECV_F0", 1, 16, wait=(2, 15)),
        *cpu_action("1F0", 17, 37),
        *cpu_action("1B0", 38, 68),
        *cpu_action("1SEND_B0", 68, 69),
        optimizer(70, 73),
    ]
    write_trace(directory, trace(0, [(0, 97)], rank0))
    write_trace(directory, trace(1, [(0, 74)], rank1))
    return directory


def test_the_tail_of_a_rank_that_ended_its_step_early_is_drain_bubble(tmp_path):
    summary = analyze_pipeline(read_run(seed_loop_without_barrier(tmp_path))).summary
    assert summary.step_time_ms == pytest.approx(97 * US)
    ranks = {entry.rank: entry for entry in summary.ranks}
    # rank 1: its optimizer is its only work outside the schedule; idle before its first action (the
    # window opens at 0, its receive at 1: head, short), at 69-70 and 73-74, and the 23 us after its
    # window closed while rank 0 ran on: bubble (its receive's wait 2-15 is bubble too: rank 0 sent at 12,
    # the rest p2p_wait)
    assert ranks[1].other_ms == pytest.approx(3 * US)
    assert ranks[1].bubble_ms == pytest.approx((10 + 1 + 1 + 23) * US)
    for entry in summary.ranks:
        total = sum(entry.part_ms(part) or 0.0 for part in RANK_PARTS)
        assert total == pytest.approx(summary.step_time_ms, abs=1e-12)


def windows(*rows: tuple[int, int, int]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row"
    )


def test_a_window_that_opened_late_keeps_that_stretch_as_other():
    # rank 1 opens 8 after rank 0 (still in its previous step) and closes with it: nothing drained
    # rank 2 opens 8 late too and closes 5 early: 5 drain, 8 other
    found = shortfall(windows((0, 2, 100), (1, 10, 100), (2, 10, 95)).with_columns(step=pl.lit(1)))
    assert found.sort("rank").select("rank", "step_ns", "window_ns", "drain", "late").rows() == [
        (0, 98, 98, 0, 0),
        (1, 98, 90, 0, 8),
        (2, 98, 85, 5, 8),
    ]


def test_a_window_that_opened_early_and_closed_early_is_all_drain():
    # rank 1 computes from 0, before rank 0's window opened at 4, and closes 10 before it: 6 short, all
    # of it after its close
    found = shortfall(windows((0, 4, 100), (1, 0, 90)).with_columns(step=pl.lit(1)))
    assert found.sort("rank").select("drain", "late").rows() == [(0, 0), (6, 0)]
