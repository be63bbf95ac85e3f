"""The loader benchmark measures what it says: the file's uncompressed size, its events, CPU time."""

from __future__ import annotations

import gzip
import json

from bench.load import measure_load, sample


def test_a_sample_reports_the_uncompressed_size_and_every_event(tmp_path):
    text = json.dumps(
        {
            "traceEvents": [
                {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(2000)
            ]
        }
    ).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(text))
    figures = sample(path)
    assert figures["bytes"] == len(text) and figures["events"] == 2000
    assert figures["cpu_s"] > 0 and figures["peak_kib"] >= figures["added_kib"] >= 0


def test_measure_load_runs_fresh_processes_and_judges_against_the_targets(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}] * 100}))
    figures = measure_load(path, repeats=1)
    assert figures["events"] == 100 and figures["mb_per_s"]["n"] == 1
    assert figures["mb_per_s"]["target"] == 100.0 and figures["memory_ratio"]["target"] == 3.0
    assert figures["mb_per_s"]["median"] == figures["mb"] / figures["cpu_s"]["median"]
