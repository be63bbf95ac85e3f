"""PP x DP ground truth from synthetic.executor_dp (replicas of synthetic.executor_sim's or
executor_gpu's executor, not runners.schedules.simulate, joined by an all-reduce after each rank's wait
for its sends: gloo's on CPU, an NCCL kernel on GPU): the analysis finds the pipelines and the slow
replica and recovers every rank's parts, dp_sync and dp_skew, also where the all-reduce is launched late
and where only Megatron's process groups say which ranks form a pipeline.

On GPU the analysis departs from the truth as tests/test_independent_gpu.py pins (the compute stream
queued behind the rank's own SEND). A rank whose last action is a SEND (stage 1's
SEND_B3) is ready for the all-reduce once that SEND's transfer is done: the compute stream waits for it."""

from __future__ import annotations

import gzip
import json

import pytest

from analysis.job.join import analyze_job
from analysis.job.run_dir import read_run
from runners.schedules import build
from synthetic.executor_dp import write_executor_job
from synthetic.executor_sim import EAGER, RENDEZVOUS, HostTime, Transport

US = 1_000
SLOW, FACTOR, SYNC_US = 1, 1.5, 300
TRANSFER = 50 * US
PARTS = ("compute", "slowdown", "launch_overhead", "bubble", "p2p_wait", "dp_sync", "other")
WORK = ("compute", "slowdown", "other")
HOST = HostTime(before_ns=3 * US, inside_ns=2 * US, tail_ns=300 * US)


def _job(directory, shape: str, **options):
    return write_executor_job(
        directory,
        build("1f1b", 2, 4),
        2,
        durations_us={"F": 1000.0, "B": 2000.0},
        slow_replica=SLOW,
        slow_factor=FACTOR,
        sync_us=SYNC_US,
        transport=Transport(EAGER if shape == "gpu" else RENDEZVOUS, TRANSFER),
        host=HOST,
        shape=shape,
        **options,
    )


# late: the fast replica's ranks launch their all-reduce only when the slow one arrives, nothing recorded
# before it; the idle before it is still the wait for the replica, dp_sync and dp_skew, not drain bubble
@pytest.fixture(scope="module", params=["cpu", "gpu", "cpu late", "gpu late"])
def analysed(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("dp")
    shape, *late = request.param.split()
    job = _job(directory, shape, late_launch=bool(late))
    truth = json.loads((directory / "truth.json").read_text())["steps"][0]
    return job, truth, analyze_job(read_run(directory)).summary, shape == "gpu"


def test_the_pipelines_the_slow_replica_and_the_step_are_found(analysed):
    job, truth, summary, on_gpu = analysed
    assert [p.ranks for p in summary.pipelines] == job.pipelines == [[0, 2], [1, 3]]
    assert summary.straggler.pipeline == SLOW
    assert summary.step_time_ms == pytest.approx(truth["step_ns"] / 1e6, abs=1e-6)
    assert [step.residual_ms for step in summary.replayed_steps] == pytest.approx(
        [0] * len(summary.replayed_steps), abs=1e-6
    )


def test_each_ranks_parts_dp_sync_and_skew_are_the_truths(analysed):
    _, truth, summary, on_gpu = analysed
    for entry in summary.ranks:
        true = truth["ranks"][str(entry.rank)]
        assert sum(true["parts_ns"].values()) == truth["step_ns"]
        parts = PARTS if not on_gpu else (*WORK, "launch_overhead", "dp_sync")  # GPU: the waits depart
        assert {part: entry.part_ms(part) for part in parts} == {
            part: pytest.approx(true["parts_ns"][part] / 1e6, abs=1e-6) for part in parts
        }, entry.rank
        # the fast replica waits in the all-reduce for the slow one, which waits for nobody
        assert entry.dp_skew_ms == pytest.approx(true["dp_skew_ns"] / 1e6, abs=1e-6), entry.rank
        assert (true["dp_skew_ns"] > 0) == (entry.pipeline != SLOW)


def test_megatrons_groups_give_the_pipelines_and_the_dp_sync(tmp_path):
    """No run.json: the pipelines come from the traces' process groups, described as Megatron does."""
    job = _job(tmp_path, "gpu", names="megatron", run_json=False)
    said = {
        g["pg_desc"]
        for g in json.loads(gzip.decompress((tmp_path / "rank0.json.gz").read_bytes()))["distributedInfo"][
            "pg_config"
        ]
    }
    assert said == {"DATA_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP"}  # the shape this test is about
    truth = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    summary = analyze_job(read_run(tmp_path)).summary
    assert [p.ranks for p in summary.pipelines] == job.pipelines == [[0, 2], [1, 3]]
    for entry in summary.ranks:
        true = truth["ranks"][str(entry.rank)]
        assert entry.dp_sync_ms == pytest.approx(true["parts_ns"]["dp_sync"] / 1e6, abs=1e-6), entry.rank
        assert entry.dp_skew_ms == pytest.approx(true["dp_skew_ns"] / 1e6, abs=1e-6), entry.rank


def test_a_late_launch_on_gpu_needs_an_all_reduce_longer_than_a_launch(tmp_path):
    with pytest.raises(ValueError, match="late launch"):
        write_executor_job(tmp_path, build("1f1b", 2, 4), 2, shape="gpu", late_launch=True, sync_us=1)
