"""On CUDA autograd's engine thread, not the thread that called backward, launches a backward's kernels
(a record_function around the call does not see them), while the B label waits on the main thread. A
labelled GPU trace written so is read with each B spanning its kernels."""

from __future__ import annotations

import gzip
import json

import pytest

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from runners.schedules import Action, Kind, build
from runners.schedules.trace_names import LABEL_PREFIX
from synthetic.executor_sim import EAGER, HostTime, Transport
from synthetic.executor_trace import write_executor_run
from synthetic.shapes import AUTOGRAD_TID_OFFSET

INJECTED = dict(
    durations_us={"F": 1000, "B": 2000},
    transport=Transport(EAGER, 50_000),
    host=HostTime(tail_ns=300_000),
    small_gemm=1.1,
    slowdown=1.25,
)


def launch_backwards_from_autograd_s_thread(path) -> int:
    """Move every B's cudaLaunchKernel (the launch inside a PP:<s>B<i> label) to the autograd thread;
    how many were moved."""
    document = json.loads(gzip.decompress(path.read_bytes()))
    events = document["traceEvents"]
    backwards = [
        e
        for e in events
        if e.get("cat") == "user_annotation"
        and e["name"].startswith(LABEL_PREFIX)
        and Action.parse(e["name"].removeprefix(LABEL_PREFIX)).kind is Kind.B
    ]
    moved = 0
    for event in events:
        if event.get("name") == "cudaLaunchKernel" and any(
            b["ts"] <= event["ts"] < b["ts"] + b["dur"] and b["tid"] == event["tid"] for b in backwards
        ):
            event["tid"] += AUTOGRAD_TID_OFFSET
            moved += 1
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return moved


def test_backward_kernels_launched_by_autograd_s_thread_belong_to_their_labels(tmp_path):
    write_executor_run(tmp_path, build("1f1b", 2, 4), shape="gpu", steps=3, **INJECTED)
    assert all(
        launch_backwards_from_autograd_s_thread(tmp_path / f"rank{r}.json.gz") == 4 * 3 for r in (0, 1)
    )
    summary = analyze_pipeline(read_run(tmp_path)).summary
    truth = json.loads((tmp_path / "truth.json").read_text())["steps"][0]["ranks"]
    for rank in summary.ranks:
        true = truth[str(rank.rank)]["parts_ns"]
        for part in ("compute", "small_gemm", "slowdown", "other"):  # other: the optimizer's kernel
            assert rank.part_ms(part) * 1e6 == pytest.approx(true[part], abs=1), (rank.rank, part)
