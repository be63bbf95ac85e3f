"""The CUDA path of the runner: NCCL, CUDA-event timings and GPU-side PP: spans. Skips without CUDA."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import REPO, trace_command, trace_run

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA: torch.cuda.is_available() is False"
    ),
]


def cuda_run(traces: Path, p: int) -> Path:
    return trace_run(traces, *f"--sched gpipe --p {p} --m 4 --preset tiny --device cuda --steps 2".split())


def events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_one_rank_on_cuda_labels_host_and_device(tmp_path):
    run = cuda_run(tmp_path, 1)
    config = json.loads((run / "run.json").read_text())
    assert (config["device"], config["backend"]) == ("cuda", "nccl") and config["versions"]["nccl"]
    assert config["host"]["gpu"] and config["step_time_unprofiled_ms"] > 0
    trace = events(run / "rank0.json.gz")
    on_host = {e["name"] for e in trace if e.get("cat") == "user_annotation" and e["name"].startswith("PP:")}
    on_device = {
        e["name"] for e in trace if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("PP:")
    }
    assert on_host == {f"PP:0{k}{i}" for k in "FB" for i in range(4)}
    assert on_device == on_host  # every compute action also spans its kernels on the GPU
    assert any(e.get("cat") == "kernel" for e in trace)


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"needs 2 CUDA devices for an NCCL pipeline: torch.cuda.device_count() is {torch.cuda.device_count()}",
)
def test_two_ranks_exchange_over_nccl(tmp_path):
    run = cuda_run(tmp_path, 2)
    trace = events(run / "rank1.json.gz")
    assert any(e["name"] == "PP:1RECV_F3" for e in trace if e.get("cat") == "user_annotation")
    assert any("nccl" in e["name"].lower() for e in trace if e.get("cat") == "kernel")


def test_two_ranks_on_one_gpu_run_as_streams_of_one_process_and_analyse_as_two_ranks(tmp_path):
    options = "--sched 1f1b --p 2 --m 4 --preset tiny --device cuda --steps 2".split()
    result = subprocess.run(
        trace_command(tmp_path, *options),
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mode single_gpu" in result.stdout
    run = (tmp_path / "latest").resolve()
    config = json.loads((run / "run.json").read_text())
    assert config["mode"] == "single_gpu" and "green_contexts_in_torch" in config["streams"]
    assert [path.name for path in run.glob("rank*")] == ["rank0.json.gz"]
    trace = events(run / "rank0.json.gz")
    assert len({e["args"]["stream"] for e in trace if e.get("cat") == "kernel"}) >= 2  # a stream per rank
    assert any(e.get("cat") == "gpu_memcpy" for e in trace)  # the hops
    summary = analyze_pipeline(read_run(run)).summary
    assert summary.p == 2 and all(rank.busy_ms > 0 for rank in summary.ranks)
