"""PP x DP ground truth from synthetic.executor_dp (replicas of synthetic.executor_sim's executor, not
runners.schedules.simulate, joined by a gloo all-reduce after each rank's wait for its sends): the
analysis finds the pipelines and the slow replica and recovers every rank's parts, dp_sync and dp_skew."""

from __future__ import annotations

import json

import pytest

from analysis.job.join import analyze_job
from analysis.job.run_dir import read_run
from runners.schedules import build
from synthetic.executor_dp import write_executor_job
from synthetic.executor_sim import RENDEZVOUS, HostTime, Transport

US = 1_000
SLOW, FACTOR, SYNC_US = 1, 1.5, 300
PARTS = ("compute", "slowdown", "launch_overhead", "bubble", "p2p_wait", "dp_sync", "other")


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dp")
    job = write_executor_job(
        directory,
        build("1f1b", 2, 4),
        2,
        durations_us={"F": 1000.0, "B": 2000.0},
        slow_replica=SLOW,
        slow_factor=FACTOR,
        sync_us=SYNC_US,
        transport=Transport(RENDEZVOUS, 50 * US),
        host=HostTime(before_ns=3 * US, inside_ns=2 * US, tail_ns=300 * US),
    )
    truth = json.loads((directory / "truth.json").read_text())["steps"][0]
    return job, truth, analyze_job(read_run(directory)).summary


def test_the_pipelines_the_slow_replica_and_the_step_are_found(analysed):
    job, truth, summary = analysed
    assert [p.ranks for p in summary.pipelines] == job.pipelines == [[0, 2], [1, 3]]
    assert summary.straggler.pipeline == SLOW
    assert summary.step_time_ms == pytest.approx(truth["step_ns"] / 1e6, abs=1e-6)
    assert all(step.residual_ms == pytest.approx(0, abs=1e-3) for step in summary.replayed_steps)


def test_each_ranks_parts_dp_sync_and_skew_are_the_truths(analysed):
    _, truth, summary = analysed
    for entry in summary.ranks:
        true = truth["ranks"][str(entry.rank)]
        assert sum(true["parts_ns"].values()) == truth["step_ns"]
        assert {part: entry.part_ms(part) for part in PARTS} == {
            part: pytest.approx(true["parts_ns"][part] / 1e6, abs=1e-6) for part in PARTS
        }, entry.rank
        # the fast replica waits in the all-reduce for the slow one, which waits for nobody
        assert entry.dp_skew_ms == pytest.approx(true["dp_skew_ns"] / 1e6, abs=1e-6), entry.rank
        assert (true["dp_skew_ns"] > 0) == (entry.pipeline != SLOW)
