"""analysis.traces.spans: the frame's rows of a test (rows); union: per key, nested and overlapping spans
merge into disjoint pieces."""

from __future__ import annotations

import random

import polars as pl

from analysis.traces.spans import rows, union


def merged(spans: list[tuple[int | None, int, int]]) -> set[tuple[int | None, int, int]]:
    """The union by hand: per key, spans in start order, each one past the reach so far opens a piece."""
    pieces: list[list] = []
    for key, start, end in sorted(spans, key=lambda s: (s[0] is not None, s[0] or 0, s[1])):
        if pieces and pieces[-1][0] == key and start <= pieces[-1][2]:
            pieces[-1][2] = max(pieces[-1][2], end)
        else:
            pieces.append([key, start, end])
    return {tuple(p) for p in pieces}


def found(spans: list[tuple[int | None, int, int]]) -> set[tuple[int | None, int, int]]:
    frame = pl.DataFrame(
        spans, schema={"cell": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row"
    )
    return set(union(frame, ["cell"]).select("cell", "start_ns", "end_ns").iter_rows())


def test_nested_overlapping_and_touching_spans_merge_per_key():
    spans = [
        (1, 0, 10),
        (1, 2, 5),
        (1, 8, 12),
        (1, 12, 14),
        (1, 20, 30),
        (2, 3, 4),
        (None, 1, 4),
        (None, 2, 3),
    ]
    assert found(spans) == {(1, 0, 14), (1, 20, 30), (2, 3, 4), (None, 1, 4)}


def test_random_spans_match_the_union_by_hand():
    rng = random.Random(7)
    for _ in range(50):
        spans = []
        for _ in range(rng.randint(0, 40)):
            start = rng.randint(0, 100)
            spans.append((rng.choice([1, 2, 3, None]), start, start + rng.randint(0, 15)))
        assert found(spans) == merged(spans)


def test_a_piece_keeps_its_first_spans_other_columns():
    frame = pl.DataFrame(
        {"cell": [1, 1, 1], "kind": ["F", "F", "F"], "start_ns": [5, 0, 9], "end_ns": [8, 6, 10]}
    )
    assert union(frame, ["cell"]).sort("start_ns").rows() == [(1, "F", 0, 8), (1, "F", 9, 10)]


def test_rows_are_the_filtered_frames_wanted_columns_whatever_the_test():
    frame = pl.DataFrame(
        {"name": ["a", "b", None, "a"], "cat": ["x", None, "x", "y"], "start_ns": [1, 2, 3, 4]}
    )
    for test in (
        pl.col("name") == "a",
        (pl.col("cat") == "x") & pl.col("name").is_not_null(),
        pl.col("cat") != "x",  # null where cat is: not taken
        pl.lit(True),
        pl.lit(False),
    ):
        assert rows(frame, test, "start_ns", "name").equals(frame.filter(test).select("start_ns", "name"))
