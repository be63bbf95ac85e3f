"""Real P=2 x DP=2 gloo runs of the runner, native and torch engines (the sync after the last backward,
and overlapped with it), analysed as jobs: two pipelines as run.json lists them, and the same two from
the traces' process groups alone; every F and B of every rank found, each rank's parts closing on its
pipeline's step, and dp_sync measured on every rank (its skew part within it; exposed where the sync
follows the backward, hidden whole or in part where it overlaps it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import DP_JOB

from analysis.job.join import analyze_job
from analysis.job.run_dir import read_run
from analysis.schema import RANK_PARTS

pytestmark = pytest.mark.slow
P, DP, M = DP_JOB["p"], DP_JOB["dp"], DP_JOB["m"]


@pytest.fixture(
    scope="module",
    params=[("native", False), ("torch", False), ("native", True)],
    ids=lambda param: f"{param[0]}-{'overlap' if param[1] else 'after'}",
)
def dp_run(request, dp_job_run) -> Path:
    return dp_job_run(*request.param)


def test_a_real_dp_run_analyses_into_its_pipelines(dp_run):
    listed = json.loads((dp_run / "run.json").read_text())["pipelines"]
    analysis = analyze_job(read_run(dp_run))
    summary = analysis.summary
    assert summary.dp == DP and [line.ranks for line in summary.pipelines] == listed
    compute = analysis.cells.filter(pl.col("kind").is_in(["F", "B"]))
    found = compute.group_by("rank", "step", "kind").agg(pl.col("microbatch").sort())
    assert found.height == P * DP * summary.steps_analyzed * 2
    assert all(microbatches.to_list() == list(range(M)) for microbatches in found["microbatch"])
    for entry in summary.ranks:
        step_ms = summary.pipelines[entry.pipeline].step_time_ms
        assert sum(entry.part_ms(part) for part in RANK_PARTS) == pytest.approx(step_ms, abs=1e-6)
        assert _synced(entry, dp_run) and 0 <= entry.dp_skew_ms <= entry.dp_sync_ms + 1e-9
    assert not any("no data-parallel collective found" in note for note in summary.notes)


def _synced(entry, run_dir: Path) -> bool:
    """dp_sync measured: a sync after the last backward is exposed whole (> 0); one overlapped with the
    backward may be hidden whole by it (0 under a loaded machine's scheduling), never negative."""
    overlapped = json.loads((run_dir / "run.json").read_text()).get("dp_overlap", False)
    return entry.dp_sync_ms >= 0 if overlapped else entry.dp_sync_ms > 0


def test_without_run_json_the_traces_process_groups_give_the_same_pipelines(dp_run, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(dp_run, bare, ignore=shutil.ignore_patterns("run.json", "analysis", "*.log"))
    listed = json.loads((dp_run / "run.json").read_text())["pipelines"]
    summary = analyze_job(read_run(bare)).summary
    assert [line.ranks for line in summary.pipelines] == listed
    assert all(_synced(entry, dp_run) for entry in summary.ranks)
