"""The merged trace's analysis tracks against injected truth: per-cell small-GEMM excess, its track, the
ideal track, and what the merge says when a track cannot be drawn."""

from __future__ import annotations

import json

import polars as pl
import pytest

from analysis import results
from analysis.cli import main
from analysis.job.run_dir import analyze_dir
from analysis.merge.analysis_tracks import CRITICAL_TRACK, IDEAL_TRACK, SMALL_GEMM_TRACK
from analysis.merge.merged import merge
from analysis.merge.perfetto_check import problems
from analysis.merge.sources import read_ranks
from runners.schedules import build
from synthetic import generate as synthetic
from synthetic.executor_sim import EAGER, RENDEZVOUS, HostTime, Transport
from synthetic.executor_trace import write_executor_run

US = 1_000
STEPS = 3
F_US, B_US = 1000.0, 2000.0
OFFSETS = {0: 0, 1: 3_100 * US, 2: -4_700 * US, 3: 250 * US}  # the merge aligns; tracks must follow
SMALL_GEMM = {(1, "F"): 1.5, (2, "B"): 1.25, (3, "F"): 1.1}  # (stage, kind) -> alone at its size / reference


def analysed_merge(
    directory, shape="cpu", calibrated=True, schedule=("1f1b", 4, 8), steps=None
) -> tuple[dict, dict]:
    """The merged trace of an independent-generator run (gloo's rendezvous or NCCL's eager 40 us hops,
    15 us of host time before each action), and the truth of its steps (truth.json's first)."""
    write_executor_run(
        directory,
        build(*schedule),
        durations_us={"F": F_US, "B": B_US},
        small_gemm=SMALL_GEMM,
        transport=Transport(EAGER if shape == "gpu" else RENDEZVOUS, 40 * US),
        host=HostTime(before_ns=15 * US),
        clock_offset_ns=OFFSETS,
        steps=STEPS,
        shape=shape,
    )
    if not calibrated:
        config = json.loads((directory / "run.json").read_text())
        (directory / "run.json").write_text(
            json.dumps({k: v for k, v in config.items() if k != "calibration"})
        )
    trace = merge(read_ranks(directory, None), steps, analyze_dir(directory))
    return trace, json.loads((directory / "truth.json").read_text())["steps"][0]


def track_slices(trace: dict, track: str) -> list[dict]:
    tids = {
        (e["pid"], e["tid"])
        for e in trace["traceEvents"]
        if e.get("name") == "thread_name" and e["args"]["name"] == track
    }
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (e["pid"], e["tid"]) in tids]


@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_small_gemm_track_totals_the_injected_excess_per_rank(tmp_path, shape):
    trace, truth = analysed_merge(tmp_path, shape)
    assert problems(trace) == []
    excess = track_slices(trace, SMALL_GEMM_TRACK)
    for rank, told in truth["ranks"].items():
        total_us = sum(e["dur"] for e in excess if e["pid"] == int(rank))
        assert total_us == pytest.approx(STEPS * told["parts_ns"]["small_gemm"] / US, abs=1.0), rank
    assert {e["name"] for e in excess} == {f"{s}{k}{mb}" for (s, k) in SMALL_GEMM for mb in range(8)}


def test_each_excess_slice_ends_its_cell_on_the_aligned_clock(tmp_path):
    """The slice covers the cell's slowed-down tail: it ends where the rank's PP: label ends, and lasts
    (small_gemm - 1) x the reference, though ranks' clocks were skewed by milliseconds."""
    trace, _ = analysed_merge(tmp_path)
    labels = {
        (e["pid"], e["name"], round(e["ts"] + e["dur"], 3))
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["name"].startswith("PP:")
    }
    for e in track_slices(trace, SMALL_GEMM_TRACK):
        assert (e["pid"], f"PP:{e['name']}", round(e["ts"] + e["dur"], 3)) in labels, e
        stage, kind = int(e["name"][0]), e["name"][1]
        reference_us = F_US if kind == "F" else B_US
        assert e["dur"] == pytest.approx((SMALL_GEMM[(stage, kind)] - 1) * reference_us, abs=0.01)


def test_cells_table_carries_the_per_cell_excess_and_ranks_sum_it(tmp_path):
    analysed_merge(tmp_path)
    cells = pl.read_parquet(tmp_path / "analysis" / "cells.parquet")
    compute = cells.filter(pl.col("kind").is_in(["F", "B"]))
    slowed = pl.DataFrame(
        [(s, k, f) for (s, k), f in SMALL_GEMM.items()], schema=["stage", "kind", "factor"], orient="row"
    )
    factor = compute.join(slowed, on=["stage", "kind"], how="left", maintain_order="left")[
        "factor"
    ].fill_null(1.0)
    reference = pl.Series([F_US * US if kind == "F" else B_US * US for kind in compute["kind"]])
    expected = (factor - 1) * reference
    assert compute["small_gemm_ns"].to_list() == pytest.approx(expected.to_list(), abs=1)
    assert (
        cells.filter(~pl.col("kind").is_in(["F", "B"]))["small_gemm_ns"].null_count()
        == cells.height - compute.height
    )
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    per_rank = (
        compute.filter(pl.col("step") == summary["median_step"])
        .group_by("rank")
        .agg(pl.col("small_gemm_ns").sum())
    )
    for rank, ns in per_rank.iter_rows():
        assert summary["ranks"][rank]["small_gemm_ms"] == pytest.approx(ns / 1e6, abs=1e-9)


def test_without_calibration_no_small_gemm_track_and_the_merge_says_so(tmp_path):
    trace, _ = analysed_merge(tmp_path, calibrated=False)
    assert problems(trace) == []
    assert track_slices(trace, SMALL_GEMM_TRACK) == []
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert SMALL_GEMM_TRACK not in names
    assert any("no calibration" in note and "small-GEMM" in note for note in trace["pipelineMerge"]["notes"])
    assert pl.read_parquet(tmp_path / "analysis" / "cells.parquet")["small_gemm_ns"].null_count() > 0


def test_ideal_track_replays_reference_durations_from_the_measured_step_start(tmp_path):
    trace, truth = analysed_merge(tmp_path)
    ideal = track_slices(trace, IDEAL_TRACK)
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    assert {e["args"]["step"] for e in ideal} == {summary["median_step"]}
    for rank in range(4):
        mine = sorted((e for e in ideal if e["pid"] == rank), key=lambda e: e["ts"])
        assert [e["name"][1] for e in mine].count("F") == 8 and len(mine) == 16
        assert all(e["dur"] == pytest.approx(F_US if e["name"][1] == "F" else B_US, abs=0.01) for e in mine)
    (step,) = (
        e
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["name"] == f"ProfilerStep#{summary['median_step']}" and e["pid"] == 0
    )
    first_ideal = min(e["ts"] for e in ideal)
    # rank 0's step began 15 us of host time before its 0F0's label opened: the replay starts with the step
    assert first_ideal == pytest.approx(step["ts"], abs=0.01)
    ideal_span = max(e["ts"] + e["dur"] for e in ideal) - first_ideal
    assert ideal_span < truth["step_ns"] / US  # no latency, gaps or slowdown: shorter than measured


def test_steps_limit_the_tracks_on_an_interleaved_run(tmp_path):
    """Global stages 0..3 on 2 ranks (stage s on rank s % 2); only step 1 is kept, so one step's excess
    per rank and the ideal replay of step 1."""
    trace, truth = analysed_merge(tmp_path, schedule=("interleaved", 2, 4, 2), steps=(1,))
    assert problems(trace) == []
    excess = track_slices(trace, SMALL_GEMM_TRACK)
    for rank, told in truth["ranks"].items():
        assert sum(e["dur"] for e in excess if e["pid"] == int(rank)) == pytest.approx(
            told["parts_ns"]["small_gemm"] / US, abs=1.0
        )
    assert {int(e["name"][0]) % 2 for e in excess if e["pid"] == 1} == {1}  # stages 1 and 3 live on rank 1
    assert {e["args"]["step"] for e in excess + track_slices(trace, IDEAL_TRACK)} == {1}


@pytest.mark.parametrize("broken", ["cells.parquet", "summary.json", "schedule.json"])
def test_a_broken_analysis_file_is_one_warning_line_and_the_run_is_analysed_again(tmp_path, capsys, broken):
    synthetic.write_run(tmp_path, build("gpipe", 2, 2))
    analyze_dir(tmp_path)
    (tmp_path / "analysis" / broken).write_bytes(b"[1, 2")
    assert main(["merge", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and broken in warning[0] and warning[0].endswith("analysed again")
    assert results.read(tmp_path).summary.p == 2  # the analysis/ written afresh


@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_the_critical_path_track_holds_the_median_steps_path_with_arrows_between_ranks(tmp_path, shape):
    """1F1B p=4: the path of the median step crosses every rank; its slices total the path (each rank's
    own clock skewed by ms, aligned by the merge), and an arrow marks each hand-over between ranks."""
    trace, _ = analysed_merge(tmp_path, shape)
    assert problems(trace) == []
    analysis = results.read(tmp_path)
    path = analysis.critical.filter(pl.col("step") == analysis.summary.median_step)
    slices = track_slices(trace, CRITICAL_TRACK)
    assert len(slices) == path.height and {e["pid"] for e in slices} == set(range(4))
    total_us = (path["end_ns"] - path["start_ns"]).sum() / US
    assert sum(e["dur"] for e in slices) == pytest.approx(total_us, abs=1e-3)
    handovers = (path.sort("start_ns")["rank"].diff().fill_null(0) != 0).sum()
    arrows = [e for e in trace["traceEvents"] if e.get("cat") == "critical"]
    assert handovers > 0 and len(arrows) == 2 * handovers
    assert {e["name"] for e in slices if e["name"].startswith("compute")} >= {"compute 0F0", "compute 3B7"}
