"""A framework's phase labels read as cells (analysis.cells.phases), on traces of the shape DeepSeek
published for DualPipe (synthetic.phase_labels: rank 0 of 64, `ProfilerStep` > `1F1B` > 4 layer blocks
of ten phases): one F, one B and one W cell per block, whatever the layers, numbered by order.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from analysis.cells.inferred import cells_of
from analysis.cells.labelled import CELL_KEY, rank_events
from analysis.cells.phases import phase_labels
from analysis.cli import main
from analysis.ranks.tables import RankInput, rank_input
from analysis.traces.kineto import span
from analysis.traces.load import read_trace
from synthetic.phase_labels import FILE_NAME, OP_GAP_NS, OP_NS, PID, write_phase_trace


def read(tmp_path, **options) -> tuple[RankInput, pl.DataFrame]:
    """The rank's tables from a phase trace written with `options`, and the trace's truth."""
    made = write_phase_trace(tmp_path, **options)
    return rank_input(read_trace(tmp_path / FILE_NAME)), pl.DataFrame(made.truth)


def numbered(cells: pl.DataFrame) -> dict[tuple[int, str], list[int]]:
    """(step, kind) -> the microbatches of its cells."""
    grouped = cells.group_by("step", "kind").agg(pl.col("microbatch").sort())
    return {(step, kind): mbs for step, kind, mbs in grouped.iter_rows()}


@pytest.mark.parametrize("blocks", [1, 2])
def test_one_cell_of_each_kind_per_1f1b_block_numbered_by_order_not_by_layer(tmp_path, blocks):
    rank, _ = read(tmp_path, blocks=blocks, layers=4)
    cells = rank.cells.cells
    assert numbered(cells) == {(0, kind): list(range(blocks)) for kind in "FBW"}  # not 0-3 from the layers
    assert cells["stage"].unique().to_list() == [0] and not cells["inferred"].any()
    assert rank.cells.phase_labels and rank.stage_is_rank


def test_microbatches_are_counted_again_in_each_step(tmp_path):
    rank, _ = read(tmp_path, steps=2, blocks=2)
    assert numbered(rank.cells.cells) == {(step, kind): [0, 1] for step in (0, 1) for kind in "FBW"}


def truth_cells(truth: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return truth.group_by(keys).agg(pl.col("start_ns").min(), pl.col("end_ns").max(), kernels=pl.len())


def test_a_cell_spans_the_kernels_launched_in_its_phases_on_every_thread_and_stream(tmp_path):
    """B and W launch on autograd's thread, dispatch and combine on the comm stream: each cell spans all
    its kernels, and cells of different kinds overlap (one block's F with its B)."""
    rank, truth = read(tmp_path, blocks=2)
    kernels = rank.cells.kernels.group_by(CELL_KEY).agg(kernels=pl.len())
    found = rank.cells.cells.join(kernels, on=CELL_KEY).select(
        "step", "kind", "microbatch", "start_ns", "end_ns", "kernels"
    )
    expected = truth_cells(truth, ["step", "kind", "block"]).rename({"block": "microbatch"})
    assert (
        found.sort("kind", "microbatch").to_dicts()
        == expected.select(found.columns).sort("kind", "microbatch").to_dicts()
    )
    assert found["kernels"].to_list() and set(found["kernels"]) == {4 * 4 * 2, 4 * 2 * 2}  # F and B, W
    f0, b0 = (found.filter((pl.col("kind") == k) & (pl.col("microbatch") == 0)).row(0) for k in "FB")
    assert f0[3] < b0[4] and b0[3] < f0[4]


def test_without_an_enclosing_annotation_the_step_is_the_block(tmp_path):
    rank, truth = read(tmp_path, blocks=2, block=None)
    cells = rank.cells.cells.select("kind", "start_ns", "end_ns").sort("kind")
    assert cells.to_dicts() == truth_cells(truth, ["kind"]).select(cells.columns).sort("kind").to_dicts()


def test_on_cpu_cells_span_their_phases_and_the_block_around_them_is_no_work(tmp_path):
    """A CPU trace: a cell runs from its first phase's start to its last one's end; the work outside the
    actions is the operators alone, not the 1F1B annotation that holds every phase."""
    rank, truth = read(tmp_path, on_gpu=False)
    cells = rank.cells.cells.select("kind", "start_ns", "end_ns").sort("kind")
    expected = truth_cells(truth, ["kind"]).with_columns(pl.col("end_ns") + OP_GAP_NS)
    assert cells.to_dicts() == expected.select(cells.columns).sort("kind").to_dicts()
    unscheduled = rank.cells.unscheduled
    assert (unscheduled["end_ns"] - unscheduled["start_ns"]).sum() == truth.height * OP_NS


def test_only_labels_of_the_strict_form_are_phases(tmp_path):
    names = [
        "forward(F)",
        "moe.dispatch(B)",
        "step (F)",
        "attn(F) layer 3",
        "f(x)",
        "x(FB)",
        "(F)",
        "attn(f)",
    ]
    events = [span("ProfilerStep#0", "user_annotation", PID, PID, 0, 100_000 * len(names))]
    events += [
        span(name, "user_annotation", PID, PID, 100_000 * i, 100_000 * i + 50_000)
        for i, name in enumerate(names)
    ]
    document = {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    (tmp_path / FILE_NAME).write_text(json.dumps(document))
    labels = phase_labels(rank_events(read_trace(tmp_path / FILE_NAME).frame))
    assert labels.sort("start_ns").select("kind", "start_ns").rows() == [("F", 0), ("B", 100_000)]


def test_pp_labels_win_over_phase_labels(tmp_path):
    made = write_phase_trace(tmp_path)
    made.document["traceEvents"].append(
        span("PP:0F0", "user_annotation", PID, PID, 1_000_002_000, 1_000_004_000)
    )
    (tmp_path / FILE_NAME).write_text(json.dumps(made.document))
    cells = cells_of(read_trace(tmp_path / FILE_NAME).frame)
    assert cells.cells.select("kind", "microbatch").rows() == [("F", 0)] and not cells.phase_labels


def test_a_whole_run_of_phase_cells_is_refused_by_the_order_check_in_one_line(tmp_path, capsys):
    """Counted microbatches are not the data's: DualPipe's B in a block is of an earlier microbatch than
    its F, and with W the backward is the IR's I. A complete run (world size 1) reaches the executed
    order check, which refuses it in one line, never a traceback."""
    write_phase_trace(tmp_path, world_size=1, steps=2)
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path}: the traces' order cannot run: "), err
    assert "0W0 at rank 0" in err and "not an action of this pipeline" in err, err  # the phase cells' W
