"""PP x DP ground truth from synthetic.executor_dp (replicas of synthetic.executor_sim's or
executor_gpu's executor, not runners.schedules.simulate, joined by an all-reduce after each rank's wait
for its sends: gloo's on CPU, an NCCL kernel on GPU): the analysis finds the pipelines, the slow replica
and each replica's step alone, and recovers every rank's parts, dp_sync and dp_skew, also where the
all-reduce is launched late, where only the traces' process groups (the runner's or Megatron's) or p2p
peers say which ranks form a pipeline, and where one stage, not one replica, is slow.

On GPU the analysis departs from the truth as tests/test_independent_gpu.py pins (the compute stream
queued behind the rank's own SEND: DEPARTURES). A rank whose last action is a SEND (stage 1's
SEND_B3) is ready for the all-reduce once that SEND's transfer is done: the compute stream waits for it."""

from __future__ import annotations

import gzip
import json

import pytest

from analysis.job.join import analyze_job
from analysis.job.run_dir import read_run
from runners.schedules import build
from synthetic.executor_dp import write_executor_job
from synthetic.executor_gpu import parts_as_analysed
from synthetic.executor_sim import EAGER, RENDEZVOUS, HostTime, Transport

US = 1_000
SLOW, FACTOR, SYNC_US = 1, 1.5, 300
TRANSFER = 50 * US
PARTS = ("compute", "slowdown", "launch_overhead", "bubble", "p2p_wait", "dp_sync", "other")
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
    """Each pipeline's step alone (the job's step less its ranks' longest wait for another replica) is
    the truth's (its step with no other replica to wait for): the straggler's size rests on it."""
    job, truth, summary, on_gpu = analysed
    assert [p.ranks for p in summary.pipelines] == job.pipelines == [[0, 2], [1, 3]]
    assert summary.step_time_ms == pytest.approx(truth["step_ns"] / 1e6, abs=1e-6)
    assert [p.step_time_ms for p in summary.pipelines] == pytest.approx([summary.step_time_ms] * 2, abs=1e-9)
    assert [step.residual_ms for step in summary.replayed_steps] == pytest.approx(
        [0] * len(summary.replayed_steps), abs=1e-6
    )
    fast, slow = job.alone_ns
    assert [p.step_time_alone_ms for p in summary.pipelines] == pytest.approx(
        [fast / 1e6, slow / 1e6], abs=1e-6
    )
    assert summary.straggler.pipeline == SLOW
    assert summary.straggler.slower_ms == pytest.approx((slow - fast) / 1e6, abs=1e-6)
    assert summary.straggler.slower_fraction == pytest.approx(slow / fast - 1, abs=1e-9)
    # only compute is slowed, not the transfers, host time, the all-reduce or the tail
    assert 0 < slow / fast - 1 < FACTOR - 1


def test_each_ranks_parts_dp_sync_and_skew_are_the_truths(analysed):
    """Every part of every rank to 1 ns; on GPU with the departures tests/test_independent_gpu.py pins
    moved from the truth's p2p_wait to bubble."""
    _, truth, summary, _ = analysed
    for entry in summary.ranks:
        told = truth["ranks"][str(entry.rank)]
        assert sum(told["parts_ns"].values()) == truth["step_ns"]
        want = parts_as_analysed(told)
        assert {part: entry.part_ms(part) for part in PARTS} == {
            part: pytest.approx(want[part] / 1e6, abs=1e-6) for part in PARTS
        }, entry.rank
        assert entry.dp_sync_ms == pytest.approx(want["dp_sync"] / 1e6, abs=1e-6), entry.rank
        # the fast replica waits in the all-reduce for the slow one, which waits for nobody
        assert entry.dp_skew_ms == pytest.approx(told["dp_skew_ns"] / 1e6, abs=1e-6), entry.rank
        assert (told["dp_skew_ns"] > 0) == (entry.pipeline != SLOW)


@pytest.mark.parametrize(
    ("shape", "options", "said"),
    [
        ("cpu", {}, {"dp", "pp_stages"}),
        ("gpu", {"names": "megatron"}, {"DATA_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP"}),
        ("gpu", {"labels": False, "process_groups": False}, set()),
    ],
    ids=["runner-groups", "megatron-groups", "p2p-peers"],
)
def test_the_pipelines_and_the_dp_sync_are_found_from_the_traces_alone(tmp_path, shape, options, said):
    """No run.json: the pipelines come from the traces' process groups, described as the runner or
    Megatron does, or without any from the p2p peers of unlabelled GPU traces."""
    job = _job(tmp_path, shape, run_json=False, **options)
    info = json.loads(gzip.decompress((tmp_path / "rank0.json.gz").read_bytes()))["distributedInfo"]
    assert {g["pg_desc"] for g in info.get("pg_config", [])} == said  # the shape this test is about
    truth = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    summary = analyze_job(read_run(tmp_path)).summary
    assert [p.ranks for p in summary.pipelines] == job.pipelines == [[0, 2], [1, 3]]
    assert summary.straggler.pipeline == SLOW
    for entry in summary.ranks:
        true = truth["ranks"][str(entry.rank)]
        assert entry.dp_sync_ms == pytest.approx(true["parts_ns"]["dp_sync"] / 1e6, abs=1e-6), entry.rank
        assert entry.dp_skew_ms == pytest.approx(true["dp_skew_ns"] / 1e6, abs=1e-6), entry.rank


def test_equal_replicas_with_one_slow_stage_have_no_straggler(tmp_path):
    """A slow last stage in every replica: no replica waits for another, so no dp_skew and no straggler."""
    job = write_executor_job(
        tmp_path,
        build("1f1b", 4, 4),
        2,
        durations_us={"F": 1000.0, "B": 2000.0, (3, "F"): 2000.0, (3, "B"): 4000.0},
        sync_us=SYNC_US,
        transport=Transport(EAGER, TRANSFER),
        host=HOST,
        shape="gpu",
    )
    assert job.alone_ns[0] == job.alone_ns[1]
    summary = analyze_job(read_run(tmp_path)).summary
    assert summary.straggler.slower_fraction == 0 and summary.straggler.slower_ms == 0
    assert all(entry.dp_skew_ms == 0 for entry in summary.ranks)


@pytest.mark.parametrize("names", ["runner", "megatron"])
@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_an_all_reduce_across_stages_is_waiting_for_another_stage_not_dp_sync(tmp_path, shape, names):
    """Each rank all-reduces with its pipeline's other stages (Megatron's embedding or model-parallel
    group), its record_param_comms naming that group: in the independent generator's truth
    (synthetic.executor_dp, across_stages) its wait for the pipeline's last stage to arrive is bubble,
    the rest of it other; no dp_sync. Every part of every rank to 1 ns; on GPU with the departure
    tests/test_independent_gpu.py pins (a compute stream queued behind its own SEND, p2p_queued_ns)."""
    job = _job(tmp_path, shape, names=names, across_stages=True)
    assert max(job.skew_ns.values()) > 0  # some stage waits for another: the wait this test is about
    summary = analyze_job(read_run(tmp_path)).summary
    step = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    assert summary.step_time_ms * 1e6 == pytest.approx(step["step_ns"], abs=1)
    for entry in summary.ranks:
        told = step["ranks"][str(entry.rank)]
        want = parts_as_analysed(told)
        assert entry.dp_sync_ms == 0 and entry.dp_skew_ms == 0
        misses = {
            part: (entry.part_ms(part) * 1e6, ns)
            for part, ns in want.items()
            if entry.part_ms(part) * 1e6 != pytest.approx(ns, abs=1)
        }
        assert not misses, (entry.rank, misses)


def test_a_late_launch_on_gpu_needs_an_all_reduce_longer_than_a_launch(tmp_path):
    with pytest.raises(ValueError, match="late launch"):
        write_executor_job(tmp_path, build("1f1b", 2, 4), 2, shape="gpu", late_launch=True, sync_us=1)
