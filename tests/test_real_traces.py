"""Real Kineto traces nobody here wrote (tests/data/real-traces, see its PROVENANCE.md) merge into valid
Perfetto traces that keep every slice; the 8-rank DLRM set becomes 8 rank processes on
collective-aligned clocks; each is analysed, or refused in one line, within bounded time and memory."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys

import pytest
from conftest import REAL_FILES, REAL_TRACES, REPO, gunzipped, real_id

from analysis.errors import InputError
from analysis.merge.merged import merge
from analysis.merge.perfetto_check import problems
from analysis.merge.sources import read_ranks

# Real files the merge must refuse, by test id, with the one-line reason it gives. None today: every
# copied trace, GPU or CPU, Kineto or legacy, merges. A file added here must really be refused.
REFUSED: dict[str, str] = {}


def test_every_real_trace_has_its_provenance_and_the_refused_list_names_only_them():
    listed = re.findall(r"^### `([^`]+)`", (REAL_TRACES / "PROVENANCE.md").read_text(), re.MULTILINE)
    assert listed and sorted(listed) == sorted(real_id(path) for path in REAL_FILES)
    assert set(REFUSED) <= set(listed)


@pytest.mark.parametrize("path", REAL_FILES, ids=real_id)
def test_every_real_trace_merges_into_a_valid_trace_with_all_its_slices(path):
    if real_id(path) in REFUSED:
        with pytest.raises(InputError) as caught:
            merge(read_ranks(path, None), None, None)
        assert "\n" not in str(caught.value) and str(path) in str(caught.value)
        assert REFUSED[real_id(path)] in str(caught.value)
        return
    trace = merge(read_ranks(path, None), None, None)
    assert problems(trace) == []
    document = json.loads(gunzipped(path))
    events = document if isinstance(document, list) else document["traceEvents"]
    slices = sum(e.get("ph") == "X" for e in events)
    assert slices > 0
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == slices


def test_dlrm_eight_ranks_merge_into_eight_processes_on_aligned_clocks():
    trace = merge(read_ranks(REAL_TRACES / "param_dlrm_8rank", None), None, None)
    assert problems(trace) == []
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert names == [f"rank {r}" for r in range(8)]
    clock = trace["pipelineMerge"]["clock"]  # no analysis of these traces: aligned by their collectives alone
    assert clock["collectives"] > 0 and clock["reference_rank"] == 0
    assert [rank["rank"] for rank in clock["ranks"]] == list(range(8))
    for rank in clock["ranks"][1:]:
        assert rank["via"] == "collective"
        # one host: NCCL ends agree to microseconds
        assert rank["uncertainty_ns"] is not None and rank["uncertainty_ns"] < 20_000
    # launch arrows stay inside their rank: GPU stream and CPU thread of the same process
    ends: dict[int, set] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "f") and e["cat"] == "ac2g":
            ends.setdefault(e["id"], set()).add(e["pid"])
    assert ends and all(len(pids) == 1 for pids in ends.values())


# What one analysis of a real trace may use: its address space with polars held to 2 threads (their
# count sets how much it reserves), and its time. The largest needs under 200 MiB and a second; the
# cells pass once paired every backward with every forward of one sequence number on one of them
# (3.3e9 pairs, 24 GB).
ANALYSIS_SPACE_BYTES = 2 << 30
ANALYSIS_SECONDS = 120
REAL_RUNS = sorted({path.parent for path in REAL_FILES})
# ../shared/real-traces (beside the checkout; absent from a fresh clone and CI, where its cases skip): the
# sources of tests/data/real-traces. Only its files that are not byte-identical copies there are run here:
# the ones never copied and the untrimmed originals of the trimmed ones, each alone and in its folder.
SHARED_TRACES = REPO.parent / "shared" / "real-traces"
SHARED_REASON = f"{SHARED_TRACES} is absent (it sits beside the checkout on the project's machines only)"

# What `analyze` does with each real trace, alone (its id) and in its folder (the folder's id + "/"):
# ANALYSED (exit 0), or refused (exit 2) in one line that holds the reason given here. Recorded by
# running each one; a change of outcome, either way, fails its case. None of these is a pipeline-parallel
# trace, and none is analysed as one: the trust gate refuses each whole job as not a pipeline (no
# send/recv between ranks, no pipeline labels; of a bigger job, the ranks there are), the rest are refused
# for a rank that cannot be told.
ANALYSED = None
ONE_RANK = "not a pipeline-parallel job: one rank, no send/recv and no pipeline labels"
NOT_PIPELINE = "not a pipeline-parallel job: no send/recv between its"
# some ranks of a bigger job, none of which sends, receives or carries pipeline labels
SOME_RANKS = "show no send/recv and no pipeline labels"
OUTCOMES: dict[str, str | None] = {
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": ONE_RANK,
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": SOME_RANKS,
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz": ONE_RANK,
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz": ONE_RANK,
    "hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz": ONE_RANK,
    "hta/rank_non_gpu/rank_non_gpu.json.gz": ONE_RANK,
    "hta/trace_diff/test/test.json.gz": SOME_RANKS,
    "hta/trace_filter/sampled_rank-0.json.gz": SOME_RANKS,
    "hta/trace_filter/sampled_rank-1.json.gz": SOME_RANKS,
    "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz": ONE_RANK,
    "kineto_tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": ONE_RANK,
    "param_dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json.gz": SOME_RANKS,
    "param_dlrm_8rank/worker1_step_12.1694128201556.pt.trace.json.gz": SOME_RANKS,
    "param_dlrm_8rank/worker2_step_12.1694128201554.pt.trace.json.gz": SOME_RANKS,
    "param_dlrm_8rank/worker3_step_12.1694128201557.pt.trace.json.gz": SOME_RANKS,
    "param_dlrm_8rank/worker4_step_12.1694128201547.pt.trace.json.gz": SOME_RANKS,
    "param_dlrm_8rank/worker5_step_12.1694128201549.pt.trace.json.gz": SOME_RANKS,
    "param_dlrm_8rank/worker6_step_12.1694128201553.pt.trace.json.gz": SOME_RANKS,
    "param_dlrm_8rank/worker7_step_12.1694128201553.pt.trace.json.gz": SOME_RANKS,
    "pippy/local_test_forward_hf_gpt2.json.gz": ONE_RANK,
    "pippy/pipe_visualized.json.gz": ONE_RANK,
    "pippy/ref.json.gz": ONE_RANK,
    "tracelens/b200/eager_trace.json.gz": SOME_RANKS,
    "tracelens/mi300/resnet_act_checkpoint.json.gz": SOME_RANKS,
    "hta/amd_trace/": ONE_RANK,
    "hta/cpu_only/": SOME_RANKS,
    "hta/critical_path/alexnet/": ONE_RANK,
    "hta/critical_path/cuda_event_sync/": ONE_RANK,
    "hta/critical_path/cuda_event_sync_multi_stream/": ONE_RANK,
    "hta/rank_non_gpu/": ONE_RANK,
    "hta/trace_diff/test/": SOME_RANKS,
    "hta/trace_filter/": SOME_RANKS,
    "hta/with_gpu_user_annotation/": ONE_RANK,
    "kineto_tb_plugin/resnet50_num_workers_0/": ONE_RANK,
    "param_dlrm_8rank/": NOT_PIPELINE,
    "pippy/": "cannot tell the rank: no distributedInfo.rank and no rank number in the name",
    "tracelens/b200/": SOME_RANKS,
    "tracelens/mi300/": SOME_RANKS,
}
SHARED_OUTCOMES: dict[str, str | None] = {
    "hta/df_index_resolver/df_index_resolver.json.gz": SOME_RANKS,
    "hta/nccl_parser_config/nccl_data.json.gz": SOME_RANKS,
    "hta/negative_queue_length_values_check/rank0.json.gz": SOME_RANKS,
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": ONE_RANK,
    "hta/trace_diff/control/control.json.gz": SOME_RANKS,
    "hta/trace_diff/test/test.json.gz": SOME_RANKS,
    "kineto_tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": ONE_RANK,
    "tracelens/b200/eager_trace.json.gz": SOME_RANKS,
    "tracelens/mi300/resnet_act_checkpoint.json.gz": SOME_RANKS,
    "hta/df_index_resolver/": SOME_RANKS,
    "hta/nccl_parser_config/": SOME_RANKS,
    "hta/negative_queue_length_values_check/": SOME_RANKS,
    "hta/ns_resolution_trace/": ONE_RANK,
    "hta/trace_diff/control/": SOME_RANKS,
    "hta/trace_diff/test/": SOME_RANKS,
    "kineto_tb_plugin/resnet50_num_workers_0/": ONE_RANK,
    "tracelens/b200/": SOME_RANKS,
    "tracelens/mi300/": SOME_RANKS,
}


def _folder_id(folder, root) -> str:
    return f"{folder.relative_to(root)}/"


def test_every_real_trace_and_folder_has_its_outcome_recorded():
    ran = [real_id(path) for path in REAL_FILES] + [_folder_id(folder, REAL_TRACES) for folder in REAL_RUNS]
    assert sorted(OUTCOMES) == sorted(ran)
    # and the outcomes are not all one: the table tells the gate's refusals from the loader's
    assert {ONE_RANK, NOT_PIPELINE} <= set(OUTCOMES.values()) and set(OUTCOMES.values()) - {
        ONE_RANK,
        NOT_PIPELINE,
    }


def _analysed(run) -> subprocess.CompletedProcess:
    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ANALYSIS_SPACE_BYTES, ANALYSIS_SPACE_BYTES))

    return subprocess.run(
        [sys.executable, "-m", "analysis", "analyze", str(run)],
        cwd=REPO,
        env=os.environ | {"POLARS_MAX_THREADS": "2"},
        capture_output=True,
        text=True,
        preexec_fn=bounded,
        timeout=ANALYSIS_SECONDS,
    )


def _as_recorded(done: subprocess.CompletedProcess, run, reason: str | None) -> None:
    """Analysed (exit 0) where `reason` is ANALYSED; else refused (exit 2) in one line naming `run` and
    holding `reason`."""
    if reason is ANALYSED:
        assert done.returncode == 0, done.stderr[-2000:]
        return
    assert done.returncode == 2, (reason, done.returncode, done.stderr[-2000:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {run}"), done.stderr[-2000:]
    assert reason in lines[0], (reason, lines[0])


def _alone(path, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(path, run / path.name)
    return _analysed(run), run


def _in_its_folder(folder, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(folder, run, ignore=shutil.ignore_patterns("*.md"))
    return _analysed(run), run


@pytest.mark.parametrize("path", REAL_FILES, ids=real_id)
def test_every_real_trace_alone_is_analysed_or_refused_within_bounds(path, tmp_path):
    """Each file alone: its rank's cells and tables are made before the run is found incomplete."""
    _as_recorded(*_alone(path, tmp_path), OUTCOMES[real_id(path)])


@pytest.mark.parametrize("folder", REAL_RUNS, ids=lambda folder: _folder_id(folder, REAL_TRACES))
def test_every_real_trace_folder_is_analysed_or_refused_within_bounds(folder, tmp_path):
    _as_recorded(*_in_its_folder(folder, tmp_path), OUTCOMES[_folder_id(folder, REAL_TRACES)])


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason=SHARED_REASON)
@pytest.mark.parametrize("name", sorted(SHARED_OUTCOMES))
def test_every_shared_real_trace_is_analysed_or_refused_within_bounds(name, tmp_path):
    source = SHARED_TRACES / name
    assert source.exists(), f"{source}: recorded in SHARED_OUTCOMES but gone"
    ran = _in_its_folder(source, tmp_path) if name.endswith("/") else _alone(source, tmp_path)
    _as_recorded(*ran, SHARED_OUTCOMES[name])


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason=SHARED_REASON)
def test_every_shared_real_trace_not_copied_as_it_is_has_its_outcome_recorded():
    def copied(path) -> bool:
        copy = REAL_TRACES / path.relative_to(SHARED_TRACES)
        return copy.exists() and copy.read_bytes() == path.read_bytes()

    files = [path for path in sorted(SHARED_TRACES.rglob("*.json.gz")) if not copied(path)]
    folders = sorted({path.parent for path in files})
    expected = [str(path.relative_to(SHARED_TRACES)) for path in files]
    assert sorted(SHARED_OUTCOMES) == sorted(expected + [_folder_id(f, SHARED_TRACES) for f in folders])
