"""Both engines on 2 gloo ranks through `python -m runners trace`: the analysis finds every
microbatch's F and B of every stage on every rank, whatever labels the engine's traces carry
(native: PP labels; torch: Forward i/Backward i for gpipe, none for 1f1b, post-RECV PP labels for
interleaved, fused OVERLAP_F_B labels for dualpipev)."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import polars as pl
import pytest
from conftest import REPO, trace_command, trace_run

from analysis.job.measure import analyze_run
from analysis.job.run_dir import read_run
from runners.schedules import build

M = 4
RESIDUAL_TARGET = 0.03  # of the step
pytestmark = pytest.mark.slow


def trace(traces: Path, engine: str, schedule: str, v: int, preset: str = "tiny") -> Path:
    options = f"--p 2 --m {M} --v {v} --sched {schedule} --engine {engine} --preset {preset} --device cpu"
    # --steps 3: the median step, not one noisy one
    return trace_run(traces, *options.split(), *"--steps 3 --timed-steps 1".split())


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_schedules_every_compute_action_of_every_stage_is_found(tmp_path, schedule):
    # v=1 is the option's default; a V implies 2. The cpu preset: its steps are long enough that the
    # optimizer and the step-end barrier stay a small share of them; on tiny's they left too much unexplained.
    run = trace(tmp_path, "torch", schedule, 1, preset="cpu")
    assert json.loads((run / "run.json").read_text())["v"] == 2
    result = analyze_run(read_run(run))
    expected = build(schedule, 2, M, 2)  # dualpipev: B for some microbatches, I and W for others
    compute = result.cells.filter(pl.col("kind").is_in(["F", "B", "I", "W"]))
    for (rank, step), found in compute.group_by("rank", "step"):
        got = [(s, kind, i) for s, kind, i in found.select("stage", "kind", "microbatch").iter_rows()]
        wanted = [(a.stage, a.kind.value, a.microbatch) for a in expected.orders[rank]]
        assert sorted(got) == sorted(wanted), (rank, step)
    assert compute.select("rank", "step").n_unique() == 2 * result.summary.steps_analyzed
    assert (result.summary.inferred_cells > 0) == (schedule == "dualpipev")  # the fused halves
    # Completeness: what the steps' own replays leave of the measured step, less the two waits no recorded
    # activity explains (a rank's step opened late; the step ran on after every rank's last activity), is
    # within the residual's 3% target, as the median over the run's steps. Measured, 8 runs each at load
    # 10-17 on 2 cores: zbv -2.03..+0.06%, dualpipev -1.17..+0.23%. The whole residual is not held to 3%:
    # one dualpipev run in 8 had 4.09%, its ran-on wait alone 3.49% of the step (descheduled at the step's end).
    left = [
        (step.residual_ms - step.opened_late_ms - step.ran_on_ms) / step.step_time_ms
        for step in result.summary.replayed_steps
    ]
    assert abs(statistics.median(left)) <= RESIDUAL_TARGET, left


@pytest.mark.parametrize("engine", ["native", "torch"])
@pytest.mark.parametrize(("schedule", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 2)])
def test_every_microbatch_forward_and_backward_is_found(tmp_path, engine, schedule, v):
    run = trace(tmp_path, engine, schedule, v)
    assert json.loads((run / "run.json").read_text())["engine"] == engine
    result = analyze_run(read_run(run))
    expected = build(schedule, 2, M, v)
    compute = result.cells.filter(pl.col("kind").is_in(["F", "B", "I", "W"]))
    for (rank, step), found in compute.group_by("rank", "step"):
        wanted = {
            (a.stage, a.kind.value, a.microbatch) for a in expected.orders[rank]
        }  # F and B, or F, I and W
        got = list(found.select("stage", "kind", "microbatch").iter_rows())
        assert sorted(got) == sorted(wanted), (rank, step)
    assert compute["rank"].n_unique() == 2
    inferred = result.summary.inferred_cells
    assert (inferred > 0) == (engine == "torch" and schedule in ("gpipe", "1f1b"))  # single-stage: unlabelled


def test_torch_only_schedules_are_refused_by_name_for_native(tmp_path):
    command = trace_command(tmp_path, *"--p 2 --m 4 --v 2 --sched zbv --engine native --device cpu".split())
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "zbv" in result.stderr and "\n" not in result.stderr.strip()
