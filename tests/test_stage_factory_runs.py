"""Real tiny 2-rank gloo runs of the example transformer (`--model`) through `python -m runners trace`,
on the native engine (gpipe, 1f1b) and torch's (gpipe): run.json records the model and calibrates every
stage at every microbatch size, and `python -m analysis analyze` finds every microbatch's F and B on
every rank in every step, each rank's parts summing to the step time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import REPO, trace_run

from runners.examples.transformer_block import SEQUENCE
from runners.presets import PRESETS, calibration_rows
from runners.schedules import build

EXAMPLE = "runners.examples.transformer_block:stage"
M, STEPS = 4, 3
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[("native", "gpipe"), ("native", "1f1b"), ("torch", "gpipe")])
def run(request, tmp_path_factory) -> tuple[str, str, Path]:
    engine, schedule = request.param
    options = (
        f"--sched {schedule} --engine {engine} --p 2 --m {M} --preset tiny --device cpu --model {EXAMPLE}"
    )
    traces = tmp_path_factory.mktemp(f"{engine}-{schedule}")
    return engine, schedule, trace_run(traces, *options.split(), *f"--steps {STEPS} --timed-steps 1".split())


def test_run_json_records_the_model_and_its_calibration(run):
    _, _, run_dir = run
    config = json.loads((run_dir / "run.json").read_text())
    width, rows = PRESETS["tiny"].width, PRESETS["tiny"].rows
    assert config["model"] == EXAMPLE and config["dims"]["sample_shape"] == [SEQUENCE, width]
    assert "layers_per_stage" not in config["dims"]  # the factory's stages have no preset depth
    sizes = [str(size) for size in calibration_rows(rows, M)]
    assert {stage: list(by_rows) for stage, by_rows in config["calibration_by_rows"].items()} == {
        "0": sizes,
        "1": sizes,
    }
    times = [
        ms
        for by_rows in config["calibration_by_rows"].values()
        for t in by_rows.values()
        for ms in t.values()
    ]
    assert all(ms > 0 for ms in times)


def test_the_analysis_finds_every_forward_and_backward_and_the_parts_close(run):
    engine, schedule, run_dir = run
    analyzed = subprocess.run(
        [sys.executable, "-m", "analysis", "analyze", str(run_dir)], cwd=REPO, capture_output=True, text=True
    )
    assert analyzed.returncode == 0, analyzed.stderr
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    assert (summary["engine"], summary["schedule"], summary["steps_analyzed"]) == (engine, schedule, STEPS)
    cells = pl.read_parquet(run_dir / "analysis" / "cells.parquet")
    compute = cells.filter(pl.col("kind").is_in(["F", "B", "I", "W"]))
    expected = build(schedule, 2, M)
    assert compute.select("rank", "step").n_unique() == 2 * STEPS
    for (rank, step), found in compute.group_by("rank", "step"):
        wanted = sorted((a.stage, a.kind.value, a.microbatch) for a in expected.orders[rank])
        assert sorted(found.select("stage", "kind", "microbatch").iter_rows()) == wanted, (rank, step)
    for entry in summary["ranks"]:
        total = sum(entry[key] or 0.0 for key in summary["parts"])
        assert total == pytest.approx(summary["step_time_ms"], rel=1e-9, abs=1e-9), entry
