"""GPU pipeline traces through the loader: GPU-shaped synthetic runs now, and real GPU runs once a session
on a CUDA machine has copied one into tests/data/pipeline_gpu/<run>/ (scripts/gpu_check.sh writes them
under OUT/traces/<run>/: run.json and one trace per rank)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PIPELINE_GPU

import synthetic.generate as synthetic
from analysis.traces import run as traces_run
from runners.schedules import build, lower


def device_labels(run) -> dict[int, set[str]]:
    frame = run.frame()
    spans = frame.filter((frame["cat"] == "gpu_user_annotation") & frame["name"].str.starts_with("PP:"))
    return {
        rank: set(spans.filter(spans["rank"] == rank)["name"].to_list()) for rank in range(run.world_size)
    }


def compute_labels(schedule, rank: int) -> set[str]:
    return {f"PP:{a}" for a in schedule.orders[rank] if a.kind.is_compute}


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 2, 4, 1), ("interleaved", 2, 4, 2), ("zb", 2, 2, 1)])
def test_gpu_shaped_run_loads_with_device_side_labels(tmp_path, name, p, m, v):
    schedule = build(name, p, m, v)
    synthetic.write_run(tmp_path, schedule, shape="gpu", steps=2)
    run = traces_run.load_run(tmp_path)
    assert run.world_size == p and run.config["device"] == "cuda"
    labels = device_labels(run)
    for rank in range(p):
        assert compute_labels(lower(schedule), rank) <= labels[rank]


def real_gpu_runs() -> list[Path]:
    return sorted(path for path in PIPELINE_GPU.glob("*") if (path / "run.json").exists())


@pytest.mark.skipif(
    not real_gpu_runs(),
    reason="no real GPU pipeline run in tests/data/pipeline_gpu/ yet (a run directory from "
    "scripts/gpu_check.sh on a CUDA machine goes there)",
)
@pytest.mark.parametrize("directory", real_gpu_runs(), ids=lambda path: path.name)
def test_real_gpu_run_loads_with_every_compute_action(directory):
    run = traces_run.load_run(directory)
    config = run.config
    assert config["device"] == "cuda" and config["backend"] == "nccl"
    schedule = lower(build(config["schedule"], config["p"], config["m"], config["v"]))
    labels = device_labels(run)
    for rank in range(run.world_size):
        assert compute_labels(schedule, rank) <= labels[rank]
