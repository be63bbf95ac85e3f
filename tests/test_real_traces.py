"""Real Kineto traces nobody here wrote (../shared/real-traces, see its PROVENANCE.md) merge into valid
Perfetto traces; the 8-rank DLRM set becomes 8 rank processes on collective-aligned clocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.errors import InputError
from analysis.merge.merged import merge, read_ranks
from analysis.merge.perfetto_check import problems

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "real-traces"
FILES = sorted(REAL.rglob("*.json.gz")) if REAL.is_dir() else []
needs_real = pytest.mark.skipif(not FILES, reason=f"no real traces at {REAL}")


@needs_real
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REAL)))
def test_every_real_trace_merges_valid_or_says_why_in_one_line(path):
    try:
        trace, _ = merge(read_ranks(path, None), None, None)
    except InputError as error:
        assert "\n" not in str(error) and str(path) in str(error)
        return
    assert problems(trace) == []
    assert any(e["ph"] == "X" for e in trace["traceEvents"])


@needs_real
def test_dlrm_eight_ranks_merge_into_eight_processes_on_aligned_clocks():
    trace, estimate = merge(read_ranks(REAL / "param_dlrm_8rank", None), None, None)
    assert problems(trace) == []
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert names == [f"rank {r}" for r in range(8)]
    assert estimate.collectives > 0
    for rank in estimate.ranks[1:]:
        assert rank.via == "collective"
        assert rank.uncertainty_ns is not None and rank.uncertainty_ns < 20_000  # one host: NCCL ends agree to us
    # launch arrows stay inside their rank: GPU stream and CPU thread of the same process
    ends: dict[int, set] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "f") and e["cat"] == "ac2g":
            ends.setdefault(e["id"], set()).add(e["pid"])
    assert ends and all(len(pids) == 1 for pids in ends.values())
