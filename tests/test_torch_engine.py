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

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from runners.schedules import build

M = 4
# The completeness residual's band on the torch engine's V schedules, of the step, for the median of
# RESIDUAL_STEPS profiled steps (the replay's target is 3%). Measured, --steps 3, 2 shared cores, 14 runs
# each at load 3.8-7: the median of a run's steps zbv +0.04..+0.11%, dualpipev +0.05..+0.09%; single
# steps up to +1.45% (1 of 84 above 1%: a rank's thread off its core between the schedule's end and the
# optimizer, where nothing is recorded). Five steps: a run fails only if three of them do.
RESIDUAL_BAND = 0.005
RESIDUAL_STEPS = 5
pytestmark = pytest.mark.slow


def trace(traces: Path, engine: str, schedule: str, v: int, preset: str = "tiny", steps: int = 3) -> Path:
    options = f"--p 2 --m {M} --v {v} --sched {schedule} --engine {engine} --preset {preset} --device cpu"
    # several steps: the median step, not one noisy one
    return trace_run(traces, *options.split(), *f"--steps {steps} --timed-steps 1".split())


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_schedules_every_compute_action_of_every_stage_is_found(tmp_path, schedule):
    # v=1 is the option's default; a V implies 2. The cpu preset: its steps are long enough that the
    # optimizer and the step-end barrier stay a small share of them; on tiny's they left too much unexplained.
    run = trace(tmp_path, "torch", schedule, 1, preset="cpu", steps=RESIDUAL_STEPS)
    assert json.loads((run / "run.json").read_text())["v"] == 2
    result = analyze_pipeline(read_run(run))
    expected = build(schedule, 2, M, 2)  # dualpipev: B for some microbatches, I and W for others
    compute = result.cells.filter(pl.col("kind").is_in(["F", "B", "I", "W"]))
    for (rank, step), found in compute.group_by("rank", "step"):
        got = [(s, kind, i) for s, kind, i in found.select("stage", "kind", "microbatch").iter_rows()]
        wanted = [(a.stage, a.kind.value, a.microbatch) for a in expected.orders[rank]]
        assert sorted(got) == sorted(wanted), (rank, step)
    assert compute.select("rank", "step").n_unique() == 2 * result.summary.steps_analyzed
    assert (result.summary.inferred_cells > 0) == (schedule == "dualpipev")  # the fused halves
    # Completeness: the whole residual (measured step - the step's own replay), as the median over the
    # run's steps, is within RESIDUAL_BAND. The step-end barrier, each rank's opening and torch's gradient
    # scaling are replayed from their spans; without the barrier's label (8 runs at load 2.5-6) the
    # medians were +0.17..+4.00%.
    residuals = [step.residual_ms / step.step_time_ms for step in result.summary.replayed_steps]
    assert abs(statistics.median(residuals)) <= RESIDUAL_BAND, residuals
    # torch's receives only post: their waits end in the consumers, which the replay knows, so no host
    # input is negative (the consumer's wait was its host time, and the RECV's post minus that wait)
    assert result.own.posted_receives
    assert (result.own.actions.select("lead", "pre", "post").min_horizontal() >= 0).all()
    # every step ended in the labelled barrier, and the replay took its time (the earliest opener's is > 0)
    barrier = result.own.tails.group_by("step").agg(pl.col("barrier").max())["barrier"]
    assert barrier.len() == result.summary.steps_analyzed and (barrier > 0).all(), barrier.to_list()


@pytest.mark.parametrize("engine", ["native", "torch"])
@pytest.mark.parametrize(("schedule", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 2)])
def test_every_microbatch_forward_and_backward_is_found(tmp_path, engine, schedule, v):
    run = trace(tmp_path, engine, schedule, v)
    assert json.loads((run / "run.json").read_text())["engine"] == engine
    result = analyze_pipeline(read_run(run))
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
