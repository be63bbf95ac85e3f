"""DualPipeV's fused `PP:(F;B)OVERLAP_F_B` label cut into its two cells, on hand-timed op streams."""

from __future__ import annotations

import polars as pl

from analysis.cells.labelled import rank_cells

TID, AUTOGRAD_TID = 7, 9


def frame(events: list[tuple[str, str, int, int, int]]) -> pl.DataFrame:
    """(name, cat, tid, start_us, end_us) of rank 0 inside one ProfilerStep."""
    rows = [("ProfilerStep#1", "user_annotation", TID, 0, 1000), *events]
    return pl.DataFrame(
        {
            "rank": [0] * len(rows),
            "ph": ["X"] * len(rows),
            "tid": [r[2] for r in rows],
            "name": [r[0] for r in rows],
            "cat": [r[1] for r in rows],
            "start_ns": [r[3] * 1000 for r in rows],
            "end_ns": [r[4] * 1000 for r in rows],
            "correlation": [None] * len(rows),
        },
        schema_overrides={"correlation": pl.Int64},
    )


def cells(events) -> list[tuple]:
    found = rank_cells(frame(events)).cells
    return list(found.select("stage", "kind", "microbatch", "start_ns", "end_ns", "inferred").iter_rows())


def test_the_cut_is_where_the_backward_ops_begin():
    found = cells(
        [
            ("PP:0F0", "user_annotation", TID, 10, 40),
            ("aten::linear", "cpu_op", TID, 12, 38),
            ("PP:(0F3;3B1)OVERLAP_F_B", "user_annotation", TID, 100, 400),
            ("aten::linear", "cpu_op", TID, 110, 150),
            ("aten::mm", "cpu_op", TID, 115, 148),  # nested
            ("aten::gelu", "cpu_op", TID, 152, 170),
            ("autograd::engine::evaluate_function: MmBackward0", "cpu_op", TID, 230, 390),  # waited 170..230
        ]
    )
    assert found == [
        (0, "F", 0, 10_000, 40_000, False),
        (0, "F", 3, 100_000, 170_000, True),  # to the end of the forward's last op
        (3, "B", 1, 170_000, 400_000, True),  # the wait for its gradient is the backward's
    ]


def test_backward_ops_on_the_autograd_thread_cut_the_label_too():
    found = cells(
        [
            ("PP:(2F0;1I4)OVERLAP_F_B", "user_annotation", TID, 100, 300),
            ("aten::linear", "cpu_op", TID, 105, 140),
            ("autograd::engine::evaluate_function: MmBackward0", "cpu_op", AUTOGRAD_TID, 180, 290),
        ]
    )
    assert [(s, k, mb, a, b) for s, k, mb, a, b, _ in found] == [
        (2, "F", 0, 100_000, 140_000),
        (1, "I", 4, 140_000, 300_000),
    ]


def test_a_fused_label_without_backward_ops_keeps_its_span_as_the_forward():
    found = cells(
        [
            ("PP:(0F1;3B0)OVERLAP_F_B", "user_annotation", TID, 100, 300),
            ("aten::linear", "cpu_op", TID, 105, 140),
        ]
    )
    assert [(k, a, b) for _, k, _, a, b, _ in found] == [("F", 100_000, 300_000), ("B", 300_000, 300_000)]
