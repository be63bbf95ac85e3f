"""Ground truth from an event-driven simulation of the executor (synthetic.executor_sim), not from
runners.schedules.simulate: the analysis must replay it exactly, under a rendezvous transport (gloo's)
and an eager one, with receivers that post early and late; and the old generator agrees with it where
both are right (eager, no host time) and not where it assumes eager delivery for a rendezvous."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import polars as pl
import pytest

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from runners.schedules import build, lower
from synthetic.executor_sim import EAGER, RENDEZVOUS, DeadlockError, HostTime, Transport, simulate_step
from synthetic.executor_trace import stalls_before, write_executor_run
from synthetic.generate import synthesize
from synthetic.orders import unlabelled_orders
from synthetic.truth import Work

US = 1_000
DURATIONS = {"F": 1000.0, "B": 2000.0, "I": 1000.0, "W": 1000.0}
TRANSFER = 50 * US
TAIL = 300 * US
STALL = 20_000 * US  # rank 0's host stall before its first RECV_B: it posts long after rank 1 sent
GENERATOR = Path(__file__).resolve().parent.parent / "synthetic"


def _step(schedule, transport, host=None):
    lowered = lower(schedule)
    work = Work(DURATIONS)
    return simulate_step(lowered, lambda action: work.measured_ns(action, lowered.m), transport, host)


def test_the_generator_imports_neither_the_analysis_nor_its_replay():
    for name in (
        "executor_sim.py",
        "executor_gpu.py",
        "executor_events.py",
        "executor_trace.py",
        "executor_dp.py",
        "executor_single_gpu.py",
    ):
        tree = ast.parse((GENERATOR / name).read_text())
        imported = [
            (node.module, alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        ]
        assert not [m for m, _ in imported if m.startswith("analysis")], name
        assert not [n for m, n in imported if n == "simulate" or "simulate" in m.split(".")], name


def test_a_late_receiver_pays_the_transfer_under_a_rendezvous_by_hand():
    # gpipe p=2 m=1; rank 1 stalls 1.5 ms before its RECV_F0, after rank 0 sent at 1 ms.
    # rendezvous: 1RECV_F0 1500 -> 1550, 1F0 -> 2550, 1B0 -> 4550, 0RECV_B0 (posted at 1000) delivered
    # 4600, 0B0 -> 6600, tail 300: 6900 us. eager: 1RECV_F0 ends at 1500 (the data came at 1050): 6850.
    host = HostTime(tail_ns=TAIL, stalls=stalls_before({"1RECV_F0": 1500 * US}))
    schedule = build("gpipe", 2, 1)
    rendezvous = _step(schedule, Transport(RENDEZVOUS, TRANSFER), host)
    eager = _step(schedule, Transport(EAGER, TRANSFER), host)
    assert (rendezvous.step_ns, eager.step_ns) == (6900 * US, 6850 * US)
    (recv, f, b, send) = rendezvous.actions[1]
    assert (recv.start, recv.end, recv.partner_posted) == (1500 * US, 1550 * US, 1000 * US)
    assert (send.start, send.end) == (4550 * US, 4550 * US)  # an isend with no host time in its call
    assert rendezvous.ends[1].sends_done == 4600 * US  # it waits for 0RECV_B0's delivery


def test_blocking_sends_deadlock_1f1b_as_they_do_without_batching():
    with pytest.raises(DeadlockError, match="SEND"):
        _step(build("1f1b", 4, 8), Transport(RENDEZVOUS, TRANSFER, blocking_sends=True))


CASES = {
    # rank 0 posts every RECV_B after rank 1 sent it (the stall): all of its receive time is transfer
    "gpipe rendezvous late": (build("gpipe", 2, 16), Transport(RENDEZVOUS, TRANSFER), {"0RECV_B0": STALL}),
    "gpipe rendezvous": (build("gpipe", 2, 16), Transport(RENDEZVOUS, TRANSFER), {}),
    "gpipe eager": (build("gpipe", 2, 16), Transport(EAGER, TRANSFER), {}),
    "gpipe blocking sends": (build("gpipe", 2, 4), Transport(RENDEZVOUS, TRANSFER, blocking_sends=True), {}),
    "1f1b rendezvous, a stall mid-pipeline": (
        build("1f1b", 4, 8),
        Transport(RENDEZVOUS, 40 * US),
        {"2RECV_F3": 3000 * US},
    ),
    "interleaved rendezvous": (build("interleaved", 2, 4, 2), Transport(RENDEZVOUS, 40 * US), {}),
}


@pytest.fixture(scope="module", params=list(CASES))
def analysed(request, tmp_path_factory):
    schedule, transport, stalls = CASES[request.param]
    host = HostTime(before_ns=3 * US, inside_ns=2 * US, tail_ns=TAIL, stalls=stalls_before(stalls))
    directory = tmp_path_factory.mktemp("run")
    run = write_executor_run(directory, schedule, durations_us=DURATIONS, transport=transport, host=host)
    truth = json.loads((directory / "truth.json").read_text())
    return request.param, run, truth, analyze_pipeline(read_run(directory))


def test_the_analysis_replays_the_independent_truth_exactly(analysed):
    _, run, truth, result = analysed
    summary = result.summary
    assert summary.step_time_ms == pytest.approx(run.step_ns / 1e6, abs=1e-6)
    assert [s["step_ns"] for s in truth["steps"]] == [run.step_ns] * 3
    assert len(summary.replayed_steps) == 3
    for replayed in summary.replayed_steps:
        assert replayed.residual_ms == pytest.approx(0, abs=1e-3)  # within 1 us
    assert summary.waterfall_ms.residual == pytest.approx(0, abs=1e-3)


def test_each_ranks_waits_split_as_the_truth_says(analysed):
    name, _, truth, result = analysed
    parts = truth["steps"][0]["ranks"]
    for entry in result.summary.ranks:
        true = parts[str(entry.rank)]["parts_ns"]
        assert sum(true.values()) == truth["steps"][0]["step_ns"]
        measured = {"compute": entry.compute_ms, "bubble": entry.bubble_ms, "p2p_wait": entry.p2p_wait_ms}
        if "eager" in name:
            # an eager sender's wait for its sends is the data in flight (p2p_wait in the truth); the
            # analysis splits it at its receivers' posts, the rendezvous rule, so only the sum agrees
            true = {"compute": true["compute"], "waits": true["bubble"] + true["p2p_wait"]}
            measured = {"compute": measured["compute"], "waits": measured["bubble"] + measured["p2p_wait"]}
        assert measured == {k: pytest.approx(true[k] / 1e6, abs=1e-3) for k in measured}, entry.rank


def _classes_in(result, run, rank: int, start_ns: int, end_ns: int) -> dict[str, int]:
    """ns of each gap class on `rank` inside [start, end] of the median step, times from its start (the
    rank's first cell begins where the simulation says it does)."""
    step = result.summary.median_step
    gaps = result.gaps.filter((pl.col("rank") == rank) & (pl.col("step") == step))
    first = result.cells.filter((pl.col("rank") == rank) & (pl.col("step") == step))["start_ns"].min()
    origin = first - run.actions[rank][0].start
    window = gaps.with_columns(
        s=pl.max_horizontal(pl.col("start_ns"), pl.lit(origin + start_ns)),
        e=pl.min_horizontal(pl.col("end_ns"), pl.lit(origin + end_ns)),
    ).filter(pl.col("e") > pl.col("s"))
    return dict(window.group_by("class").agg((pl.col("e") - pl.col("s")).sum()).iter_rows())


def test_a_late_receivers_wait_is_p2p_wait_and_an_early_ones_is_bubble_until_the_send(tmp_path):
    host = HostTime(tail_ns=TAIL, stalls=stalls_before({"0RECV_B0": STALL}))
    run = write_executor_run(
        tmp_path,
        build("gpipe", 2, 16),
        durations_us=DURATIONS,
        transport=Transport(RENDEZVOUS, TRANSFER),
        host=host,
    )
    result = analyze_pipeline(read_run(tmp_path))
    late = [d for d in run.actions[0] if d.action.kind.value == "RECV_B"]
    assert all(d.partner_posted < d.start and d.end - d.start == TRANSFER for d in late)
    ranks = {entry.rank: entry for entry in result.summary.ranks}
    assert (ranks[0].bubble_ms, ranks[0].p2p_wait_ms) == pytest.approx((0.0, 16 * TRANSFER / 1e6), abs=1e-6)
    first = late[0]
    assert _classes_in(result, run, 0, first.start, first.end) == {"p2p_wait": TRANSFER}
    # rank 1 posted 1RECV_F0 at 0, rank 0 sent at 1 ms: bubble until then, then the transfer
    (recv, *_) = run.actions[1]
    assert (recv.start, recv.partner_posted, recv.end) == (0, 1000 * US, 1000 * US + TRANSFER)
    assert _classes_in(result, run, 1, recv.start, recv.end) == {"bubble": 1000 * US, "p2p_wait": TRANSFER}


def test_old_and_new_generators_agree_for_eager_delivery_without_host_time():
    schedule = build("gpipe", 2, 16)
    old = synthesize(schedule, durations_us=DURATIONS, p2p_latency_us=TRANSFER / US)
    old_times = {c.action: (c.issue, c.end) for cells in old.cells.values() for c in cells}
    old_step = next(iter(old.truth.values())).step_ns
    eager = _step(schedule, Transport(EAGER, TRANSFER))
    new_times = {d.action: (d.start, d.end) for actions in eager.actions.values() for d in actions}
    assert new_times == old_times
    assert eager.step_ns == old_step == 51_100 * US
    # a rendezvous: from 1RECV_F1 on rank 1 posts each receive after rank 0 sent it and pays the
    # transfer (15 forwards), and so does rank 0 for 0RECV_B1..15 (15 backwards)
    rendezvous = _step(schedule, Transport(RENDEZVOUS, TRANSFER))
    new_times = {d.action: (d.start, d.end) for actions in rendezvous.actions.values() for d in actions}
    assert new_times != old_times
    assert rendezvous.step_ns - old_step == 30 * TRANSFER


def test_a_late_receiver_lengthens_a_rendezvous_step_by_its_transfers(tmp_path):
    # gpipe p=2 m=16, rank 0 stalls 20 ms before 0RECV_B0: every one of its 16 RECV_B is posted after
    # rank 1 sent it. Eagerly the data is there and the step is 1 + 16*3 ms + the stall + the tail;
    # with a rendezvous each of the 16 receives still pays its transfer.
    host = HostTime(tail_ns=TAIL, stalls=stalls_before({"0RECV_B0": STALL}))
    schedule = build("gpipe", 2, 16)
    eager = _step(schedule, Transport(EAGER, TRANSFER), host)
    rendezvous = write_executor_run(
        tmp_path, schedule, durations_us=DURATIONS, transport=Transport(RENDEZVOUS, TRANSFER), host=host
    )
    assert eager.step_ns == 16_000 * US + STALL + 16 * 2000 * US + TAIL
    assert rendezvous.step_ns - eager.step_ns == 16 * TRANSFER
    summary = analyze_pipeline(read_run(tmp_path)).summary
    assert summary.step_time_ms == pytest.approx(rendezvous.step_ns / 1e6, abs=1e-6)
    assert summary.replayed_steps[0].residual_ms == pytest.approx(0, abs=1e-3)


def test_eager_receives_all_posted_late_on_a_stage_are_analysed(tmp_path):
    """Eagerly, a receive posted after its data left has a null transfer (own_step); where every receive
    of a (stage, kind) is such (rank 0's RECV_B after the stall), the typical step takes no transfer for
    them (a null mean replayed as None failed with a TypeError)."""
    host = HostTime(tail_ns=TAIL, stalls=stalls_before({"0RECV_B0": STALL}))
    write_executor_run(
        tmp_path,
        build("gpipe", 2, 16),
        durations_us=DURATIONS,
        transport=Transport(EAGER, TRANSFER),
        host=host,
    )
    summary = analyze_pipeline(read_run(tmp_path)).summary
    assert summary.replayed_steps[0].residual_ms == pytest.approx(0, abs=1e-3)


UNLABELLED = unlabelled_orders()


@pytest.mark.parametrize("name", UNLABELLED)
def test_unlabelled_cpu_runs_are_inferred_with_their_parts_recovered(tmp_path, name):
    """No PP: labels (a hand-written loop with isends): the cells come from the op stream alone, and
    each gloo:send runs, as in real gloo traces, from its call until the step's wait for sends returns
    from it, over the host time after the call (launch_overhead, not p2p_wait) and the wait itself
    (bubble until the receiver posted, the transfer after)."""
    schedule = UNLABELLED[name]
    host = HostTime(before_ns=3 * US, inside_ns=2 * US)
    run = write_executor_run(
        tmp_path,
        schedule,
        durations_us=DURATIONS,
        transport=Transport(RENDEZVOUS, TRANSFER),
        host=host,
        labels=False,
    )
    result = analyze_pipeline(read_run(tmp_path))
    assert result.summary.inferred_cells == result.cells.height
    assert result.schedule.orders == schedule.orders
    assert all(step.residual_ms == pytest.approx(0, abs=1e-3) for step in result.summary.replayed_steps)
    truth = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    assert result.summary.step_time_ms == pytest.approx(run.step_ns / 1e6, abs=1e-6)
    for entry in result.summary.ranks:
        true = truth["ranks"][str(entry.rank)]["parts_ns"]
        assert {part: entry.part_ms(part) for part in true} == {
            part: pytest.approx(ns / 1e6, abs=1e-3) for part, ns in true.items()
        }, entry.rank
