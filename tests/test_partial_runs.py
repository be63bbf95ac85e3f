"""Some ranks of a bigger job (a rank's file lost, or the one rank a job published): `merge` merges the
ranks there are and says which are missing; `analyze` measures each present rank alone and marks what
needs the others unknown (analysis.job.partial; docs/numbers.md#ranks-alone); the merge's own analysis
needs every rank (it merges without it).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import REAL_TRACES

from analysis.cli import main
from analysis.merge.perfetto_check import problems
from runners.schedules import build
from synthetic.generate import write_run
from synthetic.phase_labels import FILE_NAME, write_phase_trace


def four_rank_run(directory: Path, without: int | None) -> Path:
    """A synthetic 1f1b run of 4 ranks whose rank `without` has no trace file (None: every rank's is)."""
    write_run(
        directory, build("1f1b", 4, 8), steps=2, run_id=directory.name, p2p_latency_us=50, launch_gap_us=20
    )
    if without is not None:
        (directory / f"rank{without}.json.gz").unlink()
    return directory


def merged(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def process_names(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}


def test_analyze_measures_each_present_rank_alone_and_says_what_is_unknown(tmp_path, capsys):
    """Rank 1's file lost from a 1f1b run of 4: the other three are measured alone (each one's busy and
    host time as the whole run's analysis finds them; its waits on peers the same time, their split
    unknown), the trust is low for the missing rank, and nothing is recommended."""
    whole = four_rank_run(tmp_path / "whole", without=None)
    assert main(["analyze", str(whole)]) == 0
    run = four_rank_run(tmp_path / "run", without=1)
    assert main(["analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert "rank(s) 0, 2, 3 of 4 (cpu)   trust: low" in out and "unknown without the other ranks:" in out
    alone = json.loads((run / "analysis" / "summary.json").read_text())
    assert alone["scope"] == "ranks" and alone["ranks_present"] == [0, 2, 3] and alone["world_size"] == 4
    assert alone["trust"] == {"level": "low", "reasons": ["ranks missing: 1 of the job's 4"]}
    assert not alone["verdict"]["recommends"] and alone["verdict"]["findings"] == []
    full = json.loads((whole / "analysis" / "summary.json").read_text())
    by_rank = {entry["rank"]: entry for entry in full["ranks"]}
    waits = ("bubble_ms", "p2p_wait_ms", "other_ms")
    for entry in alone["ranks"]:
        mine = by_rank[entry["rank"]]
        assert entry["busy_ms"] == pytest.approx(mine["busy_ms"])
        assert entry["launch_overhead_ms"] == pytest.approx(mine["launch_overhead_ms"])
        assert sum(entry[w] for w in waits) == pytest.approx(sum(mine[w] for w in waits))
        assert entry["bubble_measured"] == pytest.approx(1 - entry["busy_ms"] / entry["step_time_ms"])
    # rank 0 waits for rank 1's gradients, rank 2 for its activations: receives from a missing sender
    assert all(entry["unmatched_wait_ms"] > 0 for entry in alone["ranks"] if entry["rank"] in (0, 2))


def test_commands_that_replay_the_pipeline_refuse_some_ranks_in_one_line(tmp_path, capsys):
    run = four_rank_run(tmp_path / "run", without=1)
    assert main(["analyze", str(run)]) == 0
    capsys.readouterr()
    assert main(["predict", str(run)]) == 2
    assert (
        capsys.readouterr().err == f"error: {run}: needs every rank of the job: the traces hold 3 of its 4\n"
    )


def test_ranks_that_show_no_pipeline_are_not_a_pipeline_whatever_is_missing(tmp_path, capsys):
    """One DLRM rank of 8: what it does is said, not measured as a pipeline's rank."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(next((REAL_TRACES / "param_dlrm_8rank").glob("worker0_*")), run)
    assert main(["analyze", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"error: {run}: not a pipeline-parallel job: its 1 rank(s) here of 8 show no send/recv and no "
        "pipeline labels; found all_to_all x 5, all_reduce x 3 per step (a rank's median)\n"
    )


def test_merge_merges_the_ranks_present_each_as_its_own_rank(tmp_path, capsys):
    """Rank 1's file lost: ranks 0, 2 and 3 merge under their own numbers (not as 0, 1, 2), the line says
    rank 1 is missing, and the analysis, which refuses the run, is left out with a note."""
    run = four_rank_run(tmp_path / "run", without=1)
    assert main(["merge", str(run)]) == 0
    out, err = capsys.readouterr()
    assert "3 rank(s)" in out and out.rstrip().endswith(
        "all steps of ranks [0, 2, 3]; missing rank(s) 1 (the job has 4)"
    ), out
    assert (
        err.splitlines()[0] == f"note: merged without the analysis: {run}: missing rank(s) 1 (found 0, 2-3)"
    )
    trace = merged(run / "merged.json.gz")
    assert process_names(trace) == {0: "rank 0", 2: "rank 2", 3: "rank 3"}
    labels = {e["pid"]: e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("PP:3F")}
    assert list(labels) == [3]  # stage 3's labels are in rank 3's process
    assert problems(trace) == []


def test_merge_with_the_analysis_made_before_a_rank_was_lost(tmp_path, capsys):
    """The analysis written while every rank was there covers the ranks left: they merge with its
    tracks and arrows, the line saying which rank is missing."""
    run = tmp_path / "run"
    write_run(run, build("1f1b", 4, 8), steps=2, run_id=run.name)
    assert main(["analyze", str(run)]) == 0
    (run / "rank2.json.gz").unlink()
    capsys.readouterr()
    assert main(["merge", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("all steps of ranks [0, 1, 3]; missing rank(s) 2 (the job has 4)"), out
    assert "merged without the analysis" not in err, err
    trace = merged(run / "merged.json.gz")
    arrows = {(e["pid"], e["ph"]) for e in trace["traceEvents"] if e.get("cat") == "p2p"}
    assert arrows == {(0, "s"), (1, "f"), (1, "s"), (0, "f")}  # only between ranks both merged
    assert problems(trace) == []


def test_merge_leaves_out_an_analysis_that_does_not_cover_the_ranks_merged(tmp_path, capsys):
    """RUN/analysis of ranks 0-1 (another run's, copied in) beside ranks 0-3: merged without it."""
    other, run = tmp_path / "other", tmp_path / "run"
    write_run(other, build("1f1b", 2, 4), steps=2, run_id=other.name)
    write_run(run, build("1f1b", 4, 8), steps=2, run_id=run.name)
    assert main(["analyze", str(other)]) == 0
    shutil.copytree(other / "analysis", run / "analysis")
    capsys.readouterr()
    assert main(["merge", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("all steps of ranks [0, 1, 2, 3]"), out
    assert (
        err.splitlines()[0]
        == f"note: merged without the analysis: {run}: its analysis has no rank 2-3 (analyse the run again)"
    )
    assert not [e for e in merged(run / "merged.json.gz")["traceEvents"] if e.get("cat") == "p2p"]


def test_one_rank_of_a_job_of_64_is_analysed_alone_and_merges_as_a_directory_or_a_file(tmp_path, capsys):
    """DeepSeek's shape of public trace: one GPU file, its distributedInfo rank 0 of world_size 64, its
    cells read from DualPipe's phase labels (one F, one B, one W: the layers are not microbatches)."""
    run = tmp_path / "run"
    write_phase_trace(run)
    assert main(["analyze", str(run)]) == 0
    assert "rank(s) 0 of 64 (cuda)   trust: low" in capsys.readouterr().out
    alone = json.loads((run / "analysis" / "summary.json").read_text())
    assert (
        alone["trust"]["reasons"] == ["ranks missing: 63 of the job's 64"] and alone["bubble_formula"] is None
    )
    cells = pl.read_parquet(run / "analysis" / "cells.parquet")
    assert sorted(cells["kind"].to_list()) == ["B", "F", "W"] and set(cells["microbatch"]) == {0}
    for source in (run, run / FILE_NAME):
        assert main(["merge", str(source), "--out", str(tmp_path / "merged.json.gz")]) == 0
        out, err = capsys.readouterr()
        assert "1 rank(s)" in out and out.rstrip().endswith(
            "all steps of ranks [0]; missing rank(s) 1-63 (the job has 64)"
        ), out
        tried = f"note: merged without the analysis: {run}: missing rank(s) 1-63 (found 0)"
        assert (tried in err.splitlines()) == (source == run), err  # a file alone is not analysed
        assert problems(merged(tmp_path / "merged.json.gz")) == []
