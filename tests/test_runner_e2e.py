"""A real 2-rank gloo pipeline under torchrun, end to end through `python -m runners trace`."""

from __future__ import annotations

import gzip
import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, trace_command

from analysis.traces import run as traces_run
from runners.schedules import build, lower

STEPS = 2
pytestmark = pytest.mark.slow


def trace(traces: Path, *options: str) -> subprocess.CompletedProcess:
    command = trace_command(
        traces, *f"--p 2 --preset tiny --device cpu --steps {STEPS} --timed-steps 2".split(), *options
    )
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def labels_and_steps(path: Path) -> tuple[int, Counter, int]:
    document = json.loads(gzip.decompress(path.read_bytes()))
    names = [event.get("name", "") for event in document["traceEvents"] if event.get("ph") == "X"]
    labels = Counter(name for name in names if name.startswith("PP:"))
    steps = sum(name.startswith("ProfilerStep#") for name in names)
    return document["distributedInfo"]["rank"], labels, steps


@pytest.fixture(scope="module", params=["gpipe", "1f1b"])
def finished_run(request, tmp_path_factory) -> tuple[str, subprocess.CompletedProcess, Path]:
    """One real run per schedule, shared by the tests below (torchrun start-up dominates their time)."""
    traces = tmp_path_factory.mktemp(request.param)
    return request.param, trace(traces, "--sched", request.param, "--m", "4"), traces


def test_every_action_of_every_rank_is_in_its_trace(finished_run):
    schedule, result, traces = finished_run
    assert result.returncode == 0, result.stderr
    run = (traces / "latest").resolve()
    assert str(run) in result.stdout  # says where the traces went
    config = json.loads((run / "run.json").read_text())
    assert config["complete"] is True and (config["schedule"], config["p"], config["m"]) == (schedule, 2, 4)
    assert config["backend"] == "gloo" and config["threads_per_rank"] >= 1
    assert set(config["calibration"]) == {"0", "1"} and all(
        v["B_ms"] > 0 for v in config["calibration"].values()
    )
    assert len(config["step_times_unprofiled_ms"]) == 2
    # every stage at every microbatch size (tiny: 64 rows), the whole batch being the calibration above
    assert {stage: list(by_rows) for stage, by_rows in config["calibration_by_rows"].items()} == {
        stage: ["64", "32", "16", "8", "4", "2"] for stage in ("0", "1")
    }
    assert all(config["calibration_by_rows"][s]["64"] == config["calibration"][s] for s in ("0", "1"))
    assert config["calibration_profiled"] is True and config["injections"] == []
    assert config["calibration_timing"] == "op_union"  # on CPU, as busy time: the union of the ops
    expected = lower(build(schedule, 2, 4))
    for rank in range(2):
        trace_rank, labels, steps = labels_and_steps(run / f"rank{rank}.json.gz")
        assert trace_rank == rank and steps == STEPS
        # every F, B and SEND/RECV of every microbatch, once per profiled step, and nothing else
        assert labels == Counter({f"PP:{action}": STEPS for action in expected.orders[rank]})


def test_the_analysis_loader_reads_the_run(finished_run):
    """The contract between the halves: analysis.traces.load reads what the runner wrote."""
    _, result, traces = finished_run
    assert result.returncode == 0, result.stderr
    run = traces_run.load_run(traces / "latest")
    frame = run.frame()
    assert run.world_size == 2 and run.config["m"] == 4
    assert sorted(frame["rank"].unique().to_list()) == [0, 1]
    assert frame.filter(frame["name"] == "PP:1RECV_F1").height == STEPS


def test_a_failed_worker_leaves_the_run_incomplete(tmp_path):
    """A worker that refuses its request (here: m larger than the preset's rows, which the launcher
    would have refused; built by hand to reach the worker) makes the launcher fail in one line."""
    from runners.launch import LaunchError, launch
    from runners.presets import PRESETS
    from runners.request import Resolved, RunRequest

    bad = Resolved(RunRequest("gpipe", 1, 100, preset="tiny"), "cpu", "gloo", PRESETS["tiny"])
    with pytest.raises(LaunchError, match="a worker failed") as error:
        launch(bad, tmp_path)
    assert "\n" not in str(error.value)
    (run,) = [path for path in tmp_path.iterdir()]
    assert json.loads((run / "run.json").read_text()) == {"outcome": error.value.outcome, "complete": False}
    assert not (tmp_path / "latest").exists()
    assert "m=100 microbatches" in (run / "torchrun.log").read_text()
