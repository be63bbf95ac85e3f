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
from analysis.merge.merged import merge, read_ranks
from analysis.merge.perfetto_check import problems

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


def _analysed_or_refused_in_one_line(done: subprocess.CompletedProcess, run) -> None:
    assert done.returncode in (0, 2), done.stderr[-2000:]
    if done.returncode == 2:
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {run}"), done.stderr[-2000:]


@pytest.mark.parametrize("path", REAL_FILES, ids=real_id)
def test_every_real_trace_alone_is_analysed_or_refused_within_bounds(path, tmp_path):
    """Each file alone: its rank's cells and tables are made before the run is found incomplete."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(path, run / path.name)
    _analysed_or_refused_in_one_line(_analysed(run), run)


@pytest.mark.parametrize("folder", REAL_RUNS, ids=lambda folder: str(folder.relative_to(REAL_TRACES)))
def test_every_real_trace_folder_is_analysed_or_refused_within_bounds(folder, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(folder, run, ignore=shutil.ignore_patterns("*.md"))
    _analysed_or_refused_in_one_line(_analysed(run), run)
