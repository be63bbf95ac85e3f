"""The renames of the waterfall's terms and the typical step change names only: a synthetic run analysed
now gives, through the map of old names to new, every number its summary.json gave under format 4
(tests/data/renames/summary_format4.json, the same run analysed before the renames)."""

from __future__ import annotations

import json

import pytest
from conftest import DATA

from analysis.job.run_dir import analyze_dir
from runners.schedules import build
from synthetic.generate import write_run

BEFORE = DATA / "renames" / "summary_format4.json"
# The run summary_format4.json was made from: every term of the waterfall but the tail non-zero.
RUN = {
    "schedule": build("1f1b", 2, 4),
    "durations_us": {"F": 1000, "B": 2000, (1, "F"): 1500, (1, "B"): 3000},
    "p2p_latency_us": 50,
    "launch_gap_us": 20,
    "small_gemm": 1.2,
    "slowdown": 1.1,
}
TOP = {"simulated_step_time_ms": "typical_step_ms"}
RUNGS = {
    "formula_bubble": "fill_drain",
    "small_gemm": "small_batches",
    "slowdown": "interference",
    "launch_overhead": "host_time",
    "p2p_wait": "transfer",
    "other": "tail",
}
WORDS = ("sentences", "action", "evidence")  # prose that spells the names: not numbers


def renamed(before):
    """format 4's summary with today's names."""
    after = {TOP.get(key, key): value for key, value in before.items()}
    for waterfall in ("waterfall_ms", "waterfall_shapley_ms"):
        after[waterfall] = {RUNGS.get(term, term): ms for term, ms in before[waterfall].items()}
    for finding in after["verdict"]["findings"]:
        finding["kind"] = RUNGS.get(finding["kind"], finding["kind"])
    return after


def differences(now, then, path="") -> list[str]:
    """Where `now` and `then` differ: keys, lengths, text, numbers beyond 1e-9 of each other; the prose
    (WORDS) left out."""
    if isinstance(now, dict) and isinstance(then, dict):
        if sorted(now) != sorted(then):
            return [f"{path}: keys {sorted(set(now) ^ set(then))}"]
        return [
            d for key in now if key not in WORDS for d in differences(now[key], then[key], f"{path}.{key}")
        ]
    if isinstance(now, list) and isinstance(then, list):
        if len(now) != len(then):
            return [f"{path}: {len(now)} items, {len(then)} before"]
        return [d for i, (a, b) in enumerate(zip(now, then)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(now, float) and isinstance(then, (int, float)):
        return [] if now == pytest.approx(then, rel=1e-9, abs=1e-12) else [f"{path}: {now} against {then}"]
    return [] if now == then else [f"{path}: {now!r} against {then!r}"]


def test_the_renamed_summary_holds_every_number_it_held(tmp_path):
    write_run(tmp_path, RUN["schedule"], **{k: v for k, v in RUN.items() if k != "schedule"})
    analyze_dir(tmp_path)
    now = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    then = renamed(json.loads(BEFORE.read_text()))
    assert differences(now, then) == []
