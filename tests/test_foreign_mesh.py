"""A PP x DP job written as an outside user writes one (scripts/mesh_pp_dp.py: a DeviceMesh ("pp", "dp")
on gloo, torch.distributed.pipelining's Schedule1F1B per pipeline, a gradient all-reduce over the dp
group), run on 4 CPU ranks under torchrun and analysed from its traces alone: no run.json, no labels,
no DP:grad_sync span. The pipelines come from the mesh's process groups (distributedInfo.pg_config)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analysis.job.join import analyze_job
from analysis.job.run_dir import read_run
from analysis.schema import RANK_PARTS

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parent.parent / "scripts" / "mesh_pp_dp.py"
PP, DP, M = 2, 2, 4


def test_a_device_mesh_job_is_analysed_without_hints(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={PP * DP}"]
    result = subprocess.run(
        [*command, str(SCRIPT), str(tmp_path), str(PP), str(M)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    analysis = analyze_job(read_run(tmp_path))
    summary = analysis.summary
    assert summary.dp == DP and [p.ranks for p in summary.pipelines] == [[0, 2], [1, 3]]
    assert summary.schedule == "1f1b" and (summary.p, summary.m) == (PP, M)
    compute = analysis.cells.filter(pl.col("kind").is_in(["F", "B"]))
    per_rank = compute.group_by("rank", "step", "kind").agg(pl.col("microbatch").sort())
    assert per_rank.height == PP * DP * summary.steps_analyzed * 2
    assert all(found.to_list() == list(range(M)) for found in per_rank["microbatch"])
    for entry in summary.ranks:
        assert entry.pipeline == entry.rank % DP
        step_ms = summary.pipelines[entry.pipeline].step_time_ms  # its pipeline's median step
        assert sum(entry.part_ms(part) or 0 for part in RANK_PARTS) == pytest.approx(step_ms, abs=1e-6)
        assert entry.dp_sync_ms > 0 and 0 <= entry.dp_skew_ms <= entry.dp_sync_ms
