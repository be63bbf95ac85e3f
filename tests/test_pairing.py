"""Steps of different ranks paired by time and checked by their transfers (analysis.timeline.pairing), on
hand-made cells: two ranks, steps of 100 ns, one forward and one backward transfer per step."""

from __future__ import annotations

import polars as pl
import pytest

from analysis.cells.labelled import RankCells
from analysis.errors import InputError, TraceWarning
from analysis.timeline.pairing import paired_steps

CELLS = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "stage": pl.Int64,
    "kind": pl.String,
    "microbatch": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}


def rank(number: int, spans: dict[int, tuple[int, int]], cells: list[tuple]) -> RankCells:
    """`spans`: step -> (start, end); `cells`: (step, stage, kind, start, end)."""
    steps = pl.DataFrame(
        [(number, step, start, end) for step, (start, end) in spans.items()],
        schema={"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )
    table = pl.DataFrame(
        [(number, step, stage, kind, 0, start, end) for step, stage, kind, start, end in cells],
        schema=CELLS,
        orient="row",
    )
    empty = steps.clear()
    return RankCells(table, table.clear(), steps, None, empty)


def sender(step: int, at: int) -> list[tuple]:
    return [(step, 0, "SEND_F", at + 10, at + 20), (step, 0, "RECV_B", at + 80, at + 90)]


def receiver(step: int, at: int) -> list[tuple]:
    return [(step, 1, "RECV_F", at + 15, at + 30), (step, 1, "SEND_B", at + 60, at + 70)]


FIRST = rank(0, {0: (0, 100), 1: (100, 200)}, sender(0, 0) + sender(1, 100))


def steps_of(cells: RankCells) -> list[int]:
    return sorted(cells.cells["step"].unique().to_list())


def test_numbers_that_agree_with_the_times_stand_unwarned(recwarn):
    second = rank(1, {0: (0, 100), 1: (100, 200)}, receiver(0, 0) + receiver(1, 100))
    assert paired_steps([FIRST, second]) == [FIRST, second] and not recwarn.list


def test_numbers_a_step_apart_are_renumbered_by_time_with_one_warning():
    second = rank(1, {7: (0, 100), 8: (100, 200)}, receiver(7, 0) + receiver(8, 100))
    with pytest.warns(
        TraceWarning, match=r"^rank 1: ProfilerStep numbers disagree .*rank 1's #7 ran with rank 0's #0"
    ):
        _, renumbered = paired_steps([FIRST, second])
    assert steps_of(renumbered) == [0, 1] and renumbered.steps["step"].to_list() == [0, 1]


def test_clocks_apart_by_less_than_half_a_step_keep_the_numbers(recwarn):
    second = rank(1, {0: (40, 140), 1: (140, 240)}, receiver(0, 40) + receiver(1, 140))
    assert paired_steps([FIRST, second])[1] is second and not recwarn.list


def test_times_that_the_transfers_contradict_are_refused():
    """Rank 1's spans say its #1 ran with rank 0's #0, its cells (a step later) that it ran with #1."""
    second = rank(1, {1: (0, 100), 2: (100, 200)}, receiver(1, 100))
    with pytest.raises(InputError, match="which steps ran together cannot be told"):
        paired_steps([FIRST, second])


def test_two_steps_during_one_step_of_the_reference_are_refused():
    second = rank(1, {5: (0, 50), 6: (50, 100)}, receiver(5, 0) + receiver(6, 50))
    with pytest.raises(InputError, match="two of them ran during one step of the rank before it"):
        paired_steps([FIRST, second])


def test_each_rank_is_paired_with_the_one_before_it(recwarn):
    """Windows that start a stage later on each rank (a GPU pipeline's device windows at m=1): the last
    rank overlaps rank 0's step by less than half, its neighbour's by most; the numbers stand."""
    ranks = [
        rank(
            r,
            {0: (30 * r, 100 + 30 * r), 1: (100 + 30 * r, 200 + 30 * r)},
            receiver(0, 30 * r) + receiver(1, 100 + 30 * r),
        )
        for r in range(1, 4)
    ]
    assert paired_steps([FIRST, *ranks]) == [FIRST, *ranks] and not recwarn.list


def test_a_rank_numbered_apart_between_two_that_agree_is_the_one_renumbered():
    middle = rank(1, {4: (0, 100), 5: (100, 200)}, receiver(4, 0) + receiver(5, 100))
    last = rank(2, {0: (0, 100), 1: (100, 200)}, receiver(0, 0) + receiver(1, 100))
    with pytest.warns(
        TraceWarning, match=r"^rank 1: ProfilerStep numbers disagree .*rank 1's #4 ran with rank 0's #0"
    ):
        _, renumbered, unchanged = paired_steps([FIRST, middle, last])
    assert steps_of(renumbered) == [0, 1] and unchanged is last
