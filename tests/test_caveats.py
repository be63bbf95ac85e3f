"""A run's flags: contended (more rank threads than cores) and noisy (steps that spread), each with a note."""

from __future__ import annotations

import json

import pytest

from analysis.caveats import flags, noise, spread
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.schema import Noise, Rules
from runners.schedules import build
from synthetic import write_run

STEADY = Noise(profiled_spread=0.0, unprofiled_spread=None, profiler_cost=None)


@pytest.mark.parametrize(
    "config, said",
    [
        (
            {"device": "cpu", "p": 4, "threads_per_rank": 1, "host": {"cpu_count": 2}},
            "4 ranks x 1 thread(s) on 2 cores",
        ),
        ({"device": "cpu", "p": 4, "threads_per_rank": 1, "host": {"cpu_count": 2}, "nodes": 2}, None),
        ({"device": "cpu", "p": 2, "threads_per_rank": 1, "host": {"cpu_count": 2}}, None),
        (  # P=2 x DP=2: the two pipelines' ranks share the cores
            {"device": "cpu", "p": 2, "world_size": 4, "threads_per_rank": 1, "host": {"cpu_count": 2}},
            "4 ranks x 1 thread(s) on 2 cores",
        ),
        ({"device": "cuda", "p": 4, "threads_per_rank": 1, "host": {"cpu_count": 2}}, None),
        ({"device": "cpu", "p": 4}, None),  # someone else's run.json: no facts, no claim
        ({}, None),
    ],
)
def test_oversubscribed_cpu_runs_are_flagged_contended(config, said):
    raised, notes = flags(config, STEADY, Rules())
    if said is None:
        assert raised == notes == []
    else:
        assert raised == ["contended"] and len(notes) == 1 and notes[0].startswith(said)


def test_a_wide_spread_of_either_kind_of_step_is_flagged_noisy():
    # one run's unprofiled samples ranged from 253 to 903 ms
    found = noise([100.0, 101.0, 102.0], {"step_times_unprofiled_ms": [253.0, 400.0, 903.0]})
    assert found.profiled_spread == pytest.approx(2 / 101)
    assert found.unprofiled_spread == pytest.approx(650 / 400)
    assert found.profiler_cost == pytest.approx(101 / 400)
    raised, notes = flags({}, found, Rules())
    assert raised == ["noisy"] and notes[0].startswith("unprofiled steps spread 162%")
    assert flags({}, found, Rules(noisy_spread_max=2.0)) == ([], [])
    assert spread([5.0]) == 0.0 and noise([1.0], {}).unprofiled_spread is None


def test_the_summary_carries_the_noise_and_the_flag(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 4), steps=3)
    config = json.loads((tmp_path / "run.json").read_text())
    steady = analyze_pipeline(read_run(tmp_path)).summary
    assert steady.flags == [] and steady.noise.profiled_spread == pytest.approx(0, abs=1e-9)
    assert steady.step_time_unprofiled_ms == config["step_time_unprofiled_ms"]
    (tmp_path / "run.json").write_text(json.dumps(config | {"step_times_unprofiled_ms": [1.0, 2.0, 5.0]}))
    summary = analyze_pipeline(read_run(tmp_path)).summary
    assert summary.flags == ["noisy"] and summary.noise.unprofiled_spread == pytest.approx(2.0)
