"""Real P=2 x DP=2 gloo runs under torchrun, one per engine and sync timing: the mesh in run.json, each
pipeline's own p2p groups, every rank's gradient all-reduces over its DP group inside (or, overlapped,
before) the DP span, and replicas that agree after the step."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import DP_JOB

from runners.grad_sync import bucket_assignment
from runners.mesh import Mesh
from runners.presets import PRESETS
from runners.schedules import build, lower
from runners.schedules.trace_names import DP_GRAD_SYNC

pytestmark = pytest.mark.slow
MESH = Mesh(DP_JOB["p"], DP_JOB["dp"])
STEPS = DP_JOB["steps"]
TINY = PRESETS["tiny"]
# the tiny preset's stage: layers_per_rank weights of width x width fp32, one bucket each
BUCKETS = len(bucket_assignment([TINY.width * TINY.width * 4] * TINY.layers_per_rank))


@pytest.fixture(
    scope="module",
    params=[("native", False), ("native", True), ("torch", False), ("torch", True)],
    ids=lambda param: f"{param[0]}-{'overlap' if param[1] else 'after'}",
)
def dp_run(request, dp_job_run) -> tuple[str, bool, Path]:
    engine, overlap = request.param
    return engine, overlap, dp_job_run(engine, overlap)


def trace(run: Path, rank: int) -> dict:
    return json.loads(gzip.decompress((run / f"rank{rank}.json.gz").read_bytes()))


def inside(event: dict, span: dict) -> bool:
    return span["ts"] <= event["ts"] and event["ts"] + event["dur"] <= span["ts"] + span["dur"]


def test_run_json_holds_the_mesh_and_a_calibration_per_stage(dp_run):
    _, overlap, run = dp_run
    config = json.loads((run / "run.json").read_text())
    assert {key: config[key] for key in ("p", "dp", "world_size", "mesh", "pipelines", "dp_overlap")} == {
        "p": 2,
        "dp": 2,
        "world_size": 4,
        "mesh": {"dim_names": ["pp", "dp"], "shape": [2, 2]},
        "pipelines": [[0, 2], [1, 3]],
        "dp_overlap": overlap,
    }
    assert set(config["calibration"]) == {"0", "1"}  # calibrated on the first pipeline
    assert sorted(path.name for path in run.glob("rank*.json.gz")) == [f"rank{g}.json.gz" for g in range(4)]


def test_the_replicas_agree_after_the_step(dp_run):
    """Each pipeline trains on its own batch, so only the sync makes a stage's replicas equal."""
    digests = json.loads((dp_run[2] / "run.json").read_text())["parameter_digests"]
    for group in MESH.dp_groups():
        assert len({digests[g] for g in group}) == 1, group
    assert digests[0] != digests[2]


def test_each_pipeline_has_its_own_p2p_groups_and_each_stage_its_dp_group(dp_run):
    engine, _, run = dp_run
    pipeline_groups = (
        {"pp"}
        if engine == "torch"
        else {f"pp_{k}_{d}" for k in ("activation", "gradient") for d in ("up", "down")}
    )
    for g in range(MESH.world_size):
        stage_rank, replica = MESH.coordinates(g)
        info = trace(run, g)["distributedInfo"]
        groups = {config["pg_desc"]: config["ranks"] for config in info["pg_config"]}
        assert info["rank"] == g and groups["dp"] == list(MESH.dp_group(stage_rank))
        assert {name: groups[name] for name in pipeline_groups} == {
            name: list(MESH.pipeline(replica)) for name in pipeline_groups
        }


def test_every_rank_all_reduces_its_buckets_once_a_step_in_the_dp_span_or_its_last_backward(dp_run):
    engine, overlap, run = dp_run
    orders = lower(build("1f1b", DP_JOB["p"], DP_JOB["m"])).orders
    for g in range(MESH.world_size):
        stage_rank, _ = MESH.coordinates(g)
        events = [e for e in trace(run, g)["traceEvents"] if e.get("ph") == "X"]
        if engine == "native":  # each rank runs its stage rank's order
            labels = Counter(e["name"] for e in events if e["name"].startswith("PP:"))
            assert labels == Counter({f"PP:{a}": STEPS for a in orders[stage_rank]}), g
        spans = sorted((e for e in events if e["name"] == DP_GRAD_SYNC), key=lambda e: e["ts"])
        all_reduces = sorted((e for e in events if e["name"] == "c10d::allreduce_"), key=lambda e: e["ts"])
        assert len(spans) == STEPS and len(all_reduces) == BUCKETS * STEPS, g
        last_backwards = sorted(
            (e for e in events if e["name"] == f"PP:{stage_rank}B{DP_JOB['m'] - 1}"), key=lambda e: e["ts"]
        )
        for step, span in enumerate(spans):  # each step's buckets, in the order the steps ran
            step_reduces = all_reduces[step * BUCKETS : (step + 1) * BUCKETS]
            if not overlap:
                assert all(inside(e, span) for e in step_reduces), g
            elif engine == "native":  # inside the last backward's label (torch's Schedule1F1B writes none)
                assert all(inside(e, last_backwards[step]) for e in step_reduces), g
            else:
                assert all(e["ts"] + e["dur"] <= span["ts"] for e in step_reduces), g  # before the waits
