"""The timeline's cutting and merging (analysis.timeline.gaps): segments per window, runs of one value."""

from __future__ import annotations

import polars as pl

from analysis.timeline.gaps import runs, segments
from analysis.traces.spans import union


def frame(columns: list[str], rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=columns, orient="row")


def test_segments_cut_each_window_at_its_edges_whatever_the_windows_order():
    intervals = frame(
        ["rank", "step", "layer", "start_ns", "end_ns"],
        [(0, 1, "a", 0, 10), (0, 1, "b", 5, 15), (0, 2, "a", 20, 30), (1, 1, "a", 3, 4)],
    )
    # step 2 listed first, rank 1's window before rank 0's: the result is in order of rank, step, start
    windows = frame(["rank", "step", "start_ns", "end_ns"], [(0, 2, 18, 40), (1, 1, 0, 10), (0, 1, 0, 12)])
    cut = segments(intervals, windows, ("a", "b"))
    assert cut.rows() == [
        (0, 1, 0, 5, 1, 0),
        (0, 1, 5, 10, 1, 1),
        (0, 1, 10, 12, 0, 1),  # b clipped at its window's end
        (0, 2, 18, 20, 0, 0),
        (0, 2, 20, 30, 1, 0),
        (0, 2, 30, 40, 0, 0),
        (1, 1, 0, 3, 0, 0),
        (1, 1, 3, 4, 1, 0),
        (1, 1, 4, 10, 0, 0),
    ]
    merged = runs(cut.with_columns(covered=pl.col("a") > 0), "covered")
    assert merged.rows() == [
        (0, 1, True, 0, 10),
        (0, 1, False, 10, 12),
        (0, 2, False, 18, 20),
        (0, 2, True, 20, 30),
        (0, 2, False, 30, 40),
        (1, 1, False, 0, 3),
        (1, 1, True, 3, 4),
        (1, 1, False, 4, 10),
    ]


def test_runs_do_not_merge_across_a_hole_or_a_window():
    segments_ = frame(
        ["rank", "step", "start_ns", "end_ns", "c"],
        [(0, 1, 0, 5, "x"), (0, 1, 6, 8, "x"), (0, 1, 8, 9, "x"), (0, 2, 9, 12, "x")],
    )
    assert runs(segments_, "c").rows() == [(0, 1, "x", 0, 5), (0, 1, "x", 6, 9), (0, 2, "x", 9, 12)]


def test_the_union_merges_nested_and_overlapping_spans_within_a_step_only():
    spans = frame(
        ["rank", "step", "start_ns", "end_ns"],
        [(0, 1, 0, 10), (0, 2, 11, 30), (0, 1, 2, 5), (0, 1, 8, 12), (0, 1, 20, 25), (0, 2, 31, 32)],
    )
    assert union(spans, ["rank", "step"]).rows() == [
        (0, 1, 0, 12),
        (0, 1, 20, 25),
        (0, 2, 11, 30),
        (0, 2, 31, 32),
    ]
