"""GPU-shaped ground truth from synthetic.executor_gpu (a replay of the executor on NCCL of its own, not
runners.schedules.simulate): kernels launched from the host thread with correlation ids, NCCL p2p
kernels on per-peer comm streams with eager delivery.

The device's step window closes at the next step's first kernel, so it ends with the next step's host
getting to that kernel (the first action's host lead, its label's host time and the launch):
launch_overhead, in the replay's tail too.

A known departure of the analysis from the truth, pinned here so that a change shows: a compute stream
queued behind the rank's own SEND (a RECV behind it on the peer's one NCCL stream, the optimizer waiting
for the sends) is bubble in the analysis whatever the hop; the truth splits it at the awaited data's
send (p2p_wait once it left: the rank waits for a transfer), and says how much of p2p_wait that is
(p2p_queued_ns). The batched test pins a third (p2p_unposted_ns)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.traces.load import load_trace
from runners.schedules import build, lower
from synthetic.executor_gpu import COMPUTE_STREAM, parts_as_analysed, simulate_gpu_step
from synthetic.executor_sim import EAGER, RENDEZVOUS, HostTime, Transport
from synthetic.executor_trace import stalls_before, write_executor_run
from synthetic.orders import unlabelled_orders
from synthetic.truth import Work

US = 1_000
DURATIONS = {"F": 1000.0, "B": 2000.0, "I": 1000.0, "W": 1000.0}
EAGER_HOP = Transport(EAGER, 50 * US)
HOST = dict(before_ns=3 * US, inside_ns=2 * US, tail_ns=300 * US)
PARTS = ("compute", "small_gemm", "slowdown", "launch_overhead", "bubble", "p2p_wait", "other")

CASES = {
    "gpipe": (build("gpipe", 2, 16), {}),
    "1f1b": (build("1f1b", 4, 8), {}),
    "interleaved": (build("interleaved", 2, 4, 2), {}),
    "zb": (build("zb", 3, 6), {}),
    # the host falls 3 ms behind before rank 1's F3: its device idles with nothing launched
    "1f1b, a host stall before a forward": (build("1f1b", 2, 4), {"1F3": 3000 * US}),
    # rank 0 launches its first RECV_B 5 ms late: the data is there, the kernel is not
    "1f1b, a late receive": (build("1f1b", 2, 4), {"0RECV_B0": 5000 * US}),
}


def _step(schedule, transport=EAGER_HOP, host=None):
    lowered = lower(schedule)
    work = Work(DURATIONS)
    return simulate_gpu_step(lowered, lambda action: work.measured_ns(action, lowered.m), transport, host)


def test_a_host_that_runs_ahead_leaves_only_the_hops_by_hand():
    # gpipe p=2 m=1, the host never late: 0F0 runs [4, 1004] us (after its launch), 0SEND_F0's kernel
    # [1004, 1054], 1RECV_F0 (launched at 4) ends at 1054, 1F0 -> 2054, 1B0 -> 4054, 1SEND_B0 [4054,
    # 4104], 0B0 -> 6104: the step
    run = _step(build("gpipe", 2, 1))
    assert run.step_ns == 6104 * US
    recv, forward, *_ = run.kernels[1]
    assert (recv.start, recv.end, recv.partner_started) == (4 * US, 1054 * US, 1004 * US)
    assert (forward.start, forward.stream) == (1054 * US, COMPUTE_STREAM)


def test_the_gpu_executor_is_simulated_with_eager_delivery_only():
    with pytest.raises(ValueError, match="eager"):
        _step(build("gpipe", 2, 4), Transport(RENDEZVOUS, 50 * US))


@pytest.fixture(scope="module", params=list(CASES))
def analysed(request, tmp_path_factory):
    schedule, stalls = CASES[request.param]
    host = HostTime(**HOST, stalls=stalls_before(stalls))
    directory = tmp_path_factory.mktemp("gpu")
    run = write_executor_run(
        directory, schedule, durations_us=DURATIONS, transport=EAGER_HOP, host=host, shape="gpu"
    )
    truth = json.loads((directory / "truth.json").read_text())
    return run, truth, analyze_pipeline(read_run(directory))


def test_the_analysis_replays_the_gpu_truth(analysed):
    run, _, result = analysed
    summary = result.summary
    assert summary.step_time_ms == pytest.approx(run.step_ns / 1e6, abs=1e-6)
    assert len(summary.replayed_steps) == 3
    # the last step's window closes with the profiler, the others' with the next step's head
    assert [s.residual_ms for s in summary.replayed_steps] == pytest.approx([0] * 3, abs=1e-6)


def _assert_parts_are_the_truths(truth, summary):
    step = truth["steps"][0]
    for entry in summary.ranks:
        told = step["ranks"][str(entry.rank)]
        assert sum(told["parts_ns"].values()) == step["step_ns"]
        want = parts_as_analysed(told)
        assert {part: entry.part_ms(part) * 1e6 for part in PARTS} == {
            part: pytest.approx(want[part], abs=1) for part in PARTS
        }, entry.rank


def test_each_gpu_ranks_parts_are_the_truths(analysed):
    _, truth, result = analysed
    _assert_parts_are_the_truths(truth, result.summary)


UNLABELLED = unlabelled_orders()


@pytest.mark.parametrize("name", UNLABELLED)
def test_unlabelled_gpu_runs_are_inferred_with_their_parts_recovered(tmp_path, name):
    """No PP: labels (a hand-written loop on NCCL): the cells come from the ops around the launches,
    a backward's on autograd's thread, and every part is the labelled run's."""
    schedule = UNLABELLED[name]
    write_executor_run(
        tmp_path,
        schedule,
        durations_us=DURATIONS,
        transport=EAGER_HOP,
        host=HostTime(**HOST),
        shape="gpu",
        labels=False,
    )
    result = analyze_pipeline(read_run(tmp_path))
    assert result.summary.inferred_cells == result.cells.height
    assert result.schedule.orders == schedule.orders
    _assert_parts_are_the_truths(json.loads((tmp_path / "truth.json").read_text()), result.summary)


def test_gpu_sends_overlapping_compute_leave_compute_whole_and_count_the_hop_on_the_receiver(tmp_path):
    # Each SEND's NCCL kernel runs on a comm stream for the whole 300 us hop, over the sender's next
    # compute kernels: that time is the sender's compute, and the hop is its receiver's wait.
    write_executor_run(
        tmp_path,
        build("1f1b", 2, 4),
        durations_us=DURATIONS,
        transport=Transport(EAGER, 300 * US),
        host=HostTime(**HOST),
        steps=2,
        shape="gpu",
    )
    result = analyze_pipeline(read_run(tmp_path))
    kernels = pl.concat(
        [load_trace(tmp_path / f"rank{r}.json.gz").filter(pl.col("cat") == "kernel") for r in (0, 1)]
    )
    sends = kernels.filter(pl.col("name").str.starts_with("nccl"))
    compute = kernels.filter(pl.col("stream") == COMPUTE_STREAM)
    overlapping = sends.join(compute, on="rank").filter(
        (pl.col("start_ns") < pl.col("end_ns_right")) & (pl.col("start_ns_right") < pl.col("end_ns"))
    )
    assert overlapping.height > 0  # the shape this test is about
    truth = json.loads((tmp_path / "truth.json").read_text())["steps"][0]["ranks"]
    for entry in result.summary.ranks:
        assert entry.compute_ms * 1e6 == pytest.approx(truth[str(entry.rank)]["parts_ns"]["compute"], abs=1)
    # every hop waited for once, on its receiver: 4 microbatches x 2 directions x 300 us at most
    assert sum(entry.p2p_wait_ms for entry in result.summary.ranks) <= 8 * 0.3 + 1e-6


@pytest.mark.parametrize("name", UNLABELLED)
def test_batched_gpu_runs_are_inferred_with_their_parts_recovered(tmp_path, name):
    """batch_isend_irecv: each SEND with the RECV after it is one kernel, sending at its start, ending
    once both halves are done; compute slowed and small-GEMM-bound as calibrated. A third departure: the
    analysis books a pair's wait bubble until its SEND's receiver posted (a rendezvous), but an eager
    send does not wait for its receiver: p2p_unposted_ns in the truth (the deeper warm-up's middle rank:
    250 us a step)."""
    schedule = UNLABELLED[name]
    write_executor_run(
        tmp_path,
        schedule,
        durations_us=DURATIONS,
        transport=EAGER_HOP,
        host=HostTime(**HOST),
        shape="gpu",
        labels=False,
        batched=True,
        small_gemm=1.1,
        slowdown=1.25,
    )
    result = analyze_pipeline(read_run(tmp_path))
    assert result.summary.inferred_cells == result.cells.height
    assert result.schedule.orders == schedule.orders
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert result.summary.step_time_ms == pytest.approx(truth["steps"][0]["step_ns"] / 1e6, abs=1e-6)
    _assert_parts_are_the_truths(truth, result.summary)
