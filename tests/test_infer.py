"""Cell inference on hand-timed op streams (no torchrun): what each shape of unlabelled trace gives."""

from __future__ import annotations

import polars as pl

from analysis.cells.inferred import cells_of

TID = 7


def frame(events: list[tuple]) -> pl.DataFrame:
    """(name, cat, start_us, end_us[, autograd sequence number]) on one main thread of rank 0, inside
    one ProfilerStep."""
    rows = [("ProfilerStep#3", "user_annotation", 0, 1000), *events]
    return pl.DataFrame(
        {
            "rank": [0] * len(rows),
            "ph": ["X"] * len(rows),
            "tid": [TID] * len(rows),
            "name": [r[0] for r in rows],
            "cat": [r[1] for r in rows],
            "start_ns": [r[2] * 1000 for r in rows],
            "end_ns": [r[3] * 1000 for r in rows],
            "correlation": [None] * len(rows),
            "sequence": [r[4] if len(r) > 4 else None for r in rows],
        },
        schema_overrides={"correlation": pl.Int64, "sequence": pl.Int64},
    )


def cells(events) -> list[tuple[str, int, int, int, int]]:
    found = cells_of(frame(events)).cells
    assert found["inferred"].all() and (found["stage"] == 0).all() and (found["step"] == 3).all()
    return list(found.select("kind", "microbatch", "start_ns", "end_ns", "blocked_ns").iter_rows())


def test_bare_ops_become_recv_compute_send_with_the_wait_up_to_the_arrival():
    ms = 1000
    found = cells(
        [
            ("c10d::recv_", "cpu_op", 10, 12),
            ("gloo:recv", "user_annotation", 12, 40),  # blocked until 40
            ("aten::linear", "cpu_op", 41, 60),
            ("aten::linear", "cpu_op", 60, 70),
            ("aten::gelu", "cpu_op", 70, 75),
            ("c10d::send", "cpu_op", 76, 78),
            # isend: returns at once; gloo's span runs until the step's wait returns from it, as in real
            # gloo traces, over what the rank does meanwhile: it is not the send's time
            ("gloo:send", "user_annotation", 78, 400),
            ("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 80, 120),
            ("aten::add_", "cpu_op", 130, 140),  # optimizer: no GEMM, not a cell
        ]
    )
    assert found == [
        ("RECV_F", 0, 10 * ms, 40 * ms, 30 * ms),
        ("F", 0, 41 * ms, 75 * ms, 0),
        ("SEND_F", 0, 76 * ms, 78 * ms, 0),  # the call alone
        ("B", 0, 80 * ms, 120 * ms, 0),
    ]


def test_a_blocking_sends_cell_holds_its_wait_and_an_isends_is_its_call():
    events = [
        ("aten::linear", "cpu_op", 41, 60),
        ("c10d::send", "cpu_op", 61, 62),
        ("gloo:send", "user_annotation", 62, 79),  # blocking: the call's wait returned at 79
        ("aten::linear", "cpu_op", 80, 90),
        ("c10d::send", "cpu_op", 91, 92),
        ("gloo:send", "user_annotation", 92, 300),  # an isend, waited for at the step's end
    ]
    assert [row[:4] for row in cells(events) if row[0] == "SEND_F"] == [
        ("SEND_F", 0, 61_000, 79_000),
        ("SEND_F", 1, 91_000, 92_000),
    ]


def test_torch_gpipe_labels_name_the_microbatch_and_split_out_the_recv():
    found = cells(
        [
            ("Forward 5", "user_annotation", 10, 50),
            ("c10d::recv_", "cpu_op", 11, 30),
            ("gloo:recv", "user_annotation", 29, 31),
            ("aten::linear", "cpu_op", 32, 48),
            ("Backward 5", "user_annotation", 60, 90),
            ("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 61, 80),
            ("c10d::send", "cpu_op", 81, 82),
        ]
    )
    assert [(kind, mb) for kind, mb, *_ in found] == [("RECV_F", 5), ("F", 5), ("B", 5), ("SEND_B", 5)]
    assert found[0][3] == 31_000  # the recv call, then gloo's wait until the data arrived


def test_consecutive_forwards_are_numbered_in_order():
    found = cells(
        [
            ("aten::mm", "cpu_op", 10, 20),
            ("c10d::send", "cpu_op", 21, 22),
            ("aten::mm", "cpu_op", 30, 40),
            ("c10d::send", "cpu_op", 41, 42),
        ]
    )
    assert [(kind, mb) for kind, mb, *_ in found] == [("F", 0), ("SEND_F", 0), ("F", 1), ("SEND_F", 1)]


def test_backwards_in_reverse_take_the_microbatch_of_the_forward_they_differentiate():
    # The seed's loop: F0, F1, then B1 before B0. Each backward op carries the sequence number of the
    # forward op it belongs to (nested ones included), so the first B is microbatch 1.
    found = cells(
        [
            ("aten::linear", "cpu_op", 10, 20, 100),
            ("aten::mm", "cpu_op", 11, 19, 101),
            ("c10d::send", "cpu_op", 21, 22),
            ("aten::linear", "cpu_op", 30, 40, 200),
            ("aten::mm", "cpu_op", 31, 39, 201),
            ("c10d::send", "cpu_op", 41, 42),
            ("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 50, 60, 201),
            ("c10d::recv_", "cpu_op", 61, 62),
            ("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 70, 80, 101),
        ]
    )
    compute = [(kind, mb) for kind, mb, *_ in found if kind in ("F", "B")]
    assert compute == [("F", 0), ("F", 1), ("B", 1), ("B", 0)]
    assert [mb for kind, mb, *_ in found if kind == "RECV_B"] == [0]  # the recv feeds B0


def test_posted_receive_waits_inside_its_consumer():
    labelled = frame(
        [
            ("PP:1RECV_F0", "user_annotation", 10, 12),
            ("gloo:recv", "user_annotation", 11, 55),
            ("PP:1F0", "user_annotation", 40, 90),  # waits 40..55 for the data, then computes
        ]
    )
    result = cells_of(labelled)
    blocked = dict(result.cells.select("kind", "blocked_ns").iter_rows())
    assert blocked == {"RECV_F": 1_000, "F": 15_000}  # inside its own label; the F's wait is the F's
    assert sorted(result.waits.select("start_ns", "end_ns").rows()) == [(11_000, 12_000), (40_000, 55_000)]
