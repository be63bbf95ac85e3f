"""The CUDA path of the runner: NCCL, CUDA-event timings and GPU-side PP: spans. Skips without CUDA."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from conftest import trace_run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for an NCCL pipeline")
def test_two_ranks_exchange_over_nccl(tmp_path):
    run = cuda_run(tmp_path, 2)
    trace = events(run / "rank1.json.gz")
    assert any(e["name"] == "PP:1RECV_F3" for e in trace if e.get("cat") == "user_annotation")
    assert any("nccl" in e["name"].lower() for e in trace if e.get("cat") == "kernel")
