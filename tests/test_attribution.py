"""Per-rank closure and the waterfall ladder, against hand-derived numbers and unit-time geometry."""

from __future__ import annotations

import gc

import msgspec
import polars as pl
import pytest
from test_cells import cpu_action, gpipe_m1_run, span, trace, write_trace

from analysis.attribution.model import StepModel
from analysis.attribution.own_step import KEY, measure
from analysis.attribution.reference import REFERENCE_SCHEMA, Reference
from analysis.attribution.replay import Inputs, Step, Tail, replay, replay_all
from analysis.attribution.waterfall import ladder
from analysis.cells.labelled import CELL_KEY, CELL_SCHEMA
from analysis.job.join import analyze_job
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.schema import RANK_PARTS
from analysis.vocabulary import RUNGS
from runners.schedules import Action, Kind, build, lower, simulate
from runners.schedules.trace_names import OPTIMIZER_STEP, RUN_QUEUE_COUNTER, STEP_END_BARRIER
from synthetic.data_parallel import write_job

CALIBRATION = {"0": {"F_ms": 0.008, "B_ms": 0.016}, "1": {"F_ms": 0.016, "B_ms": 0.024}}
# m = 1: the one microbatch is the whole batch, so its isolated time is the whole batch's
RUN_JSON = {
    "schedule": "gpipe",
    "p": 2,
    "m": 1,
    "v": 1,
    "dims": {"rows": 64, "microbatch_rows": [64]},
    "calibration": CALIBRATION,
    "calibration_by_rows": {stage: {"64": times} for stage, times in CALIBRATION.items()},
    "complete": True,
}


def test_uncalibrated_waterfall_matches_the_hand_replay(tmp_path):
    summary = analyze_pipeline(read_run(gpipe_m1_run(tmp_path))).summary
    # ideal (10+20 + 20+30)/2 = 40 us; equal slots F=15, B=25 in a serial m=1 chain = 80; the measured
    # chain is also 80 (no imbalance at m=1); host time 2+1 on rank 0 and 1+1+1 on rank 1 on the chain
    # pushes it to 87, the transfers after both sides posted (1RECV_F0 3 us after 0SEND_F0 began, the
    # senders' own 1 us each, 0RECV_B0 1 us after 1SEND_B0 began) to 91. The step goes on 9 us after the
    # last backward with nothing recorded there (drain): no measured input explains it, so it is the
    # completeness residual, not a tail.
    expected = {
        "ideal": 0.040,
        "fill_drain": 0.040,
        "imbalance": 0.0,
        "small_batches": None,
        "interference": None,
        "host_time": 0.007,
        "transfer": 0.004,
        "tail": 0.0,
        "variability": 0.0,  # one step of one microbatch: its own inputs are the typical ones
        "residual": 0.009,
    }
    assert list(expected) == list(RUNGS)
    assert msgspec.structs.asdict(summary.waterfall_ms) == {
        term: pytest.approx(ms, abs=1e-9) if ms is not None else None for term, ms in expected.items()
    }
    assert summary.typical_step_ms == pytest.approx(0.091)
    (replayed,) = summary.replayed_steps
    assert (replayed.replay_ms, replayed.residual_ms) == pytest.approx((0.091, 0.009))
    # named: both ranks' steps opened together, and the step ran on 9 us after rank 0's last backward
    assert (replayed.opened_late_ms, replayed.ran_on_ms) == pytest.approx((0.0, 0.009))
    assert not replayed.step_end_barrier  # a foreign loop's: those waits are not replayed
    assert summary.bubble_measured == pytest.approx(1 - 80 / 200)
    assert summary.bubble_seed is None  # no isolated calibration


def test_a_labelled_step_end_barrier_and_a_late_opening_are_replayed_not_left_in_the_residual(tmp_path):
    # gpipe m=1 (us): rank 1's window opens 2 after rank 0's (aligned: rank 0's from its first F at 2)
    # and closes 6 after it; the last rank reaches the barrier at 92. Replayed from its own opening, rank
    # 1's window is the step: 2 + the chain to the last arrival (90) + its barrier time 106 - 92 - 2 = 102.
    # Without the barrier's or the opening's inputs the replay misses by 12 us or overshoots by 2, and
    # with rank 0's gradient scaling taken for idle time by 2.
    rank0 = [
        *cpu_action("0F0", 2, 12),
        *cpu_action("0SEND_F0", 12, 13),
        *cpu_action("0RECV_B0", 14, 70, wait=(15, 69)),
        *cpu_action("0B0", 71, 89),
        span("PP:0REDUCE_GRAD", 89, 91),  # torch's gradient scaling, labelled by its runtime
        span(OPTIMIZER_STEP, 91, 92),
        span(STEP_END_BARRIER, 92, 97),
    ]
    rank1 = [
        *cpu_action("1RECV_F0", 5, 16, wait=(6, 15)),
        *cpu_action("1F0", 17, 37),
        *cpu_action("1B0", 38, 68),
        *cpu_action("1SEND_B0", 68, 69),
        span(OPTIMIZER_STEP, 69, 70),
        span(STEP_END_BARRIER, 70, 104),
    ]
    write_trace(tmp_path, trace(0, [(0, 100)], rank0))
    write_trace(tmp_path, trace(1, [(4, 106)], rank1))
    summary = analyze_pipeline(read_run(tmp_path)).summary
    (replayed,) = summary.replayed_steps
    assert replayed.step_time_ms == pytest.approx(0.102)
    assert replayed.residual_ms == pytest.approx(0.0, abs=1e-9)
    assert replayed.step_end_barrier
    # the barrier's span is a wait, not the rank's own work; torch's gradient scaling is: each rank's other
    # is its gradient scaling and optimizer step
    assert [entry.other_ms for entry in summary.ranks] == pytest.approx([0.003, 0.001])


def test_calibration_splits_busy_time_into_compute_small_gemm_and_slowdown(tmp_path):
    summary = analyze_pipeline(read_run(gpipe_m1_run(tmp_path, RUN_JSON))).summary
    ranks = {entry.rank: entry for entry in summary.ranks}
    # busy 30 and 50 us against the isolated (here whole-batch) 24 and 40 us: at m = 1 no small-GEMM loss
    assert (ranks[0].compute_ms, ranks[0].small_gemm_ms, ranks[0].slowdown_ms) == pytest.approx(
        (0.024, 0, 0.006)
    )
    assert (ranks[1].compute_ms, ranks[1].small_gemm_ms, ranks[1].slowdown_ms) == pytest.approx(
        (0.040, 0, 0.010)
    )
    assert (ranks[0].busy_ms, ranks[1].busy_ms) == pytest.approx((0.030, 0.050))
    # the two bubbles of a 100 us step on 2 ranks: busy 80 us, work timed alone 64 us
    assert summary.bubble_measured == pytest.approx(1 - 80 / 200)
    assert summary.bubble_seed == pytest.approx(1 - 64 / 200)
    terms = msgspec.structs.asdict(summary.waterfall_ms)
    assert terms["ideal"] == pytest.approx(0.032) and terms["fill_drain"] == pytest.approx(0.032)
    assert terms["small_batches"] == pytest.approx(0) and terms["interference"] == pytest.approx(0.016)
    assert sum(terms.values()) == pytest.approx(summary.step_time_ms, abs=1e-12)


def test_each_compute_cell_carries_its_split(tmp_path):
    # measured F/B: 10/20 us on stage 0, 20/30 us on stage 1; calibrated (m=1): 8/16 and 16/24 us
    cells = analyze_pipeline(read_run(gpipe_m1_run(tmp_path, RUN_JSON))).cells
    split = {
        f"{s}{k}": (c, g, d)
        for s, k, c, g, d in cells.select(
            "stage", "kind", "compute_ns", "small_gemm_ns", "slowdown_ns"
        ).iter_rows()
    }
    assert {a: split[a] for a in ("0F", "0B", "1F", "1B")} == {
        "0F": pytest.approx((8000, 0, 2000)),
        "0B": pytest.approx((16000, 0, 4000)),
        "1F": pytest.approx((16000, 0, 4000)),
        "1B": pytest.approx((24000, 0, 6000)),
    }
    assert all(parts == (None, None, None) for a, parts in split.items() if a[1:] not in ("F", "B"))


@pytest.mark.parametrize("with_run_json", [False, True])
def test_each_ranks_parts_sum_to_the_step_time(tmp_path, with_run_json):
    result = analyze_pipeline(read_run(gpipe_m1_run(tmp_path, RUN_JSON if with_run_json else None)))
    assert result.summary.parts == tuple(f"{part}_ms" for part in RANK_PARTS)
    for entry in result.summary.ranks:
        total = sum(getattr(entry, key) or 0.0 for key in result.summary.parts)
        assert total == pytest.approx(result.summary.step_time_ms, abs=1e-12)
    assert result.summary.step_time_ms == pytest.approx(0.1)


def _unit_step(orders, blocking=False) -> Step:
    inputs = {a: Inputs(work=1.0 if a.kind.is_compute else 0.0) for order in orders for a in order}
    return Step(orders, inputs, [Tail()] * len(orders), blocking)


@pytest.mark.parametrize(
    "name,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2), ("zb", 3, 6, 1)]
)
def test_unit_replay_reproduces_the_schedule_simulator_lowered_or_not(name, p, m, v):
    schedule = build(name, p, m, v)
    expected = max(end for *_, end in simulate(schedule).rows)
    assert replay(schedule, _unit_step(schedule.orders)).makespan == expected
    assert replay(schedule, _unit_step(lower(schedule).orders)).makespan == expected


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 4, 1), ("interleaved", 2, 4, 2)])
def test_equal_slots_give_the_formula_bubble(name, p, m, v):
    schedule = build(name, p, m, v)
    actions = [a for order in schedule.orders for a in order]
    unit = {a: 1.0 if a.kind.value == "F" else 2.0 for a in actions}
    rows = [(a.stage, a.kind.value, a.microbatch, ns, ns) for a, ns in unit.items()]
    ref = Reference(pl.DataFrame(rows, schema=REFERENCE_SCHEMA, orient="row"), calibrated=True)
    kinds = {(a.stage, a.kind.value): Inputs(work=ns) for a, ns in unit.items()}
    model = StepModel(
        kinds, (Tail(),) * p, lower(schedule).orders, blocking_sends=False, eager_receives=False
    )
    rungs = ladder(schedule, model, ref, step_ns=1e6, own_ns=1e6)
    terms = rungs.waterfall
    step = terms.ideal + terms.fill_drain
    assert terms.fill_drain / step == pytest.approx((p - 1) / (v * m + p - 1))
    assert terms.imbalance == 0 and terms.small_batches == 0 and terms.interference == 0
    assert sum(msgspec.structs.asdict(terms).values()) == pytest.approx(1.0)  # ms
    assert sum(msgspec.structs.asdict(rungs.shapley).values()) == pytest.approx(1.0)


def run_queue(t_us: float, delay_ns: int) -> dict:
    return {
        "ph": "C",
        "cat": "pp_sched",
        "name": RUN_QUEUE_COUNTER,
        "pid": 1,
        "tid": 1,
        "ts": t_us,
        "args": {"run_delay_ns": delay_ns},
    }


def test_cpu_contention_is_the_run_queue_delay_across_compute_cells_on_their_busy_share(tmp_path):
    # rank 1: 5 us runnable-but-waiting inside 1F0 [17,37], 0.5 us inside 1B0 [38,68] (bare labels: all
    # busy), 3 us after its last action that no compute cell holds; rank 0: an operator covers 15 of
    # 0B0's 20 us and 4 us of delay fall across it: 3 us on the operator
    extra = {
        1: [run_queue(t, ns) for t, ns in ((17, 1000), (37, 6000), (38, 6000), (68, 6500), (90, 9500))],
        0: [span("aten::mm", 76, 91, cat="cpu_op"), run_queue(71, 0), run_queue(91, 4000)],
    }
    ranks = analyze_pipeline(read_run(gpipe_m1_run(tmp_path, extra=extra))).summary.ranks
    assert ranks[1].cpu_contention_ms == pytest.approx(0.0055, abs=1e-12)
    assert ranks[0].cpu_contention_ms == pytest.approx(0.003, abs=1e-12)
    bare = analyze_pipeline(read_run(gpipe_m1_run(tmp_path / "bare"))).summary.ranks
    assert [r.cpu_contention_ms for r in bare] == [None, None]  # no counter: unknown, not zero


def _cells(rows, step=0):
    """A cells table (with busy_ns: the whole span of a compute cell) from (rank, stage, kind, mb, start,
    end) rows."""
    frame = pl.DataFrame(
        [(rank, step, stage, kind, mb, start, end, 0, False) for rank, stage, kind, mb, start, end in rows],
        schema=CELL_SCHEMA,
        orient="row",
    )
    compute = pl.col("kind").is_in(["F", "B", "I", "W"])
    return frame.with_columns(
        busy_ns=pl.when(compute).then(pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64)
    )


def _waits(rows, step=0):
    schema = {name: CELL_SCHEMA[name] for name in (*CELL_KEY, "start_ns", "end_ns")}
    return pl.DataFrame(
        [(r, step, s, k, mb, a, b) for r, s, k, mb, a, b in rows], schema=schema, orient="row"
    )


def _gaps(rows, step=0):
    schema = {"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "class": pl.Utf8}
    return pl.DataFrame([(r, step, a, b, c) for r, a, b, c in rows], schema=schema, orient="row")


def _windows(ends, step=0, start=0):
    return pl.DataFrame({"rank": list(range(len(ends))), "step": step, "start_ns": start, "end_ns": ends})


def test_host_time_between_actions_is_measured_in_exact_nanoseconds_at_epoch_times():
    """Cells carry nanoseconds since the epoch (~1.8e18, where a double resolves only 256 ns): host gaps
    of 3 and 37 ns before an action come out as 3 and 37."""
    schedule = build("gpipe", 2, 1)
    t0 = 1_764_000_000_123_456_789
    cells = _cells(
        [  # F0, 3 ns later F1, B1, 37 ns later B0 (no RECV cells: compute waits for compute)
            (0, 0, "F", 0, t0, t0 + 1000),
            (1, 1, "F", 0, t0 + 1003, t0 + 2003),
            (1, 1, "B", 0, t0 + 2003, t0 + 3003),
            (0, 0, "B", 0, t0 + 3040, t0 + 4040),
        ]
    )
    gaps = _gaps([(1, t0 + 1000, t0 + 1003, "launch_overhead"), (0, t0 + 3003, t0 + 3040, "launch_overhead")])
    own = measure(schedule, cells, _waits([]), gaps, _windows([t0 + 4040] * 2, start=t0), on_gpu=False)
    assert sorted(own.actions["lead"]) == [0.0, 0.0, 3.0, 37.0]
    assert replay(schedule, own.step(0, 2)).makespan == 4040  # nothing else: exact


def _rendezvous_run(recv_b_post: int):
    """gpipe p=2 m=1 in ns: rank 1 posts 1RECV_F0 at 500, before 0SEND_F0 begins at 1000, and its wait
    ends at 1300; rank 0 posts 0RECV_B0 at `recv_b_post` and waits until 300 ns after the later of that
    and 1SEND_B0's start at 4300 (a late receiver still pays the transfer: gloo's rendezvous)."""
    arrival = max(recv_b_post, 4300) + 300
    rows = [
        (0, 0, "F", 0, 0, 1000),
        (0, 0, "SEND_F", 0, 1000, 1100),
        (1, 1, "RECV_F", 0, 500, 1300),
        (1, 1, "F", 0, 1300, 2300),
        (1, 1, "B", 0, 2300, 4300),
        (1, 1, "SEND_B", 0, 4300, 4400),
        (0, 0, "RECV_B", 0, recv_b_post, arrival),
        (0, 0, "B", 0, arrival, arrival + 2000),
    ]
    waits = _waits([(1, 1, "RECV_F", 0, 500, 1300), (0, 0, "RECV_B", 0, recv_b_post, arrival)])
    host = _gaps([(0, 1100, recv_b_post, "launch_overhead")])  # rank 0's host time before it posts
    return rows, waits, host, arrival + 2000


@pytest.mark.parametrize("recv_b_post", [1200, 4500])  # early, and after the send began
def test_a_rendezvous_receive_posted_early_or_late_replays_to_the_measured_step(recv_b_post):
    schedule = build("gpipe", 2, 1)
    rows, waits, gaps, end = _rendezvous_run(recv_b_post)
    own = measure(schedule, _cells(rows), waits, gaps, _windows([end, 4400]), on_gpu=False)
    transfers = dict(
        own.actions.filter(pl.col("kind").str.starts_with("RECV")).select("kind", "transfer").iter_rows()
    )
    assert transfers == {"RECV_F": 300.0, "RECV_B": 300.0}
    replayed = replay(schedule, own.step(0, 2))
    assert replayed.makespan == end  # the late receiver's 300 ns are in the replay, not a residual
    assert replayed.spans[Action(0, Kind.B, 0)] == (end - 2000, end)


def test_a_blocking_send_waits_for_its_receiver_in_the_replay():
    """A c10d::send that blocks: 0SEND_F0 begins at 1000 and ends at 2300, 300 ns after rank 1 began
    waiting in 1RECV_F0 at 2000 (its host was busy before). Its transfer is those 300 ns; posting the
    receive earlier would end the send earlier."""
    schedule = build("gpipe", 2, 1)
    rows = [
        (0, 0, "F", 0, 0, 1000),
        (0, 0, "SEND_F", 0, 1000, 2300),
        (1, 1, "RECV_F", 0, 2000, 2300),
        (1, 1, "F", 0, 2300, 3300),
        (1, 1, "B", 0, 3300, 5300),
        (1, 1, "SEND_B", 0, 5300, 5400),
        (0, 0, "RECV_B", 0, 2300, 5700),
        (0, 0, "B", 0, 5700, 7700),
    ]
    waits = _waits(
        [(1, 1, "RECV_F", 0, 2000, 2300), (0, 0, "RECV_B", 0, 2300, 5700), (0, 0, "SEND_F", 0, 1000, 2300)]
    )
    gaps = _gaps([(1, 0, 2000, "launch_overhead"), (0, 1000, 2000, "bubble"), (0, 2000, 2300, "p2p_wait")])
    own = measure(schedule, _cells(rows), waits, gaps, _windows([7700, 5400]), on_gpu=False)
    assert own.blocking_sends
    send = own.actions.filter(pl.col("kind") == "SEND_F").row(0, named=True)
    assert (send["pre"], send["transfer"]) == (0.0, 300.0)
    step = own.step(0, 2)
    assert replay(schedule, step).makespan == 7700
    earlier = dict(step.inputs)
    earlier[Action(1, Kind.RECV_F, 0)] = Inputs(lead=1000.0, transfer=300.0)
    sooner = replay(schedule, Step(step.orders, earlier, step.tails, step.blocking_sends))
    assert sooner.spans[Action(0, Kind.SEND_F, 0)][1] == 1300  # 1000 + 300: it no longer waits


def test_a_receive_only_posted_waits_in_its_consumer_as_a_hop_not_host_time():
    """torch's runtime (gpipe p=2 m=2 in ns): each RECV label only posts its receive (gloo:recv opens
    inside it), both before either consumer runs, and gloo closes the receive when the consumer's wait
    returns. Transfers take 400 ns after both sides posted (rendezvous). 1F0, 0B0 and 0B1 wait for their
    data (1100, 3620 and 400 ns: hops); 1F1's data came at 2500, before it began at 2600, and its wait
    call returned 20 ns in: host time, as are 1F0's 200 ns after its data and 1B1's 300 before its work.
    The path: 0F0, the hop to 1F0 (400), 200 host, 1F0, 1F1's 20 host, 1F1, 1B0, 1SEND_B0's 100 ns call,
    1B1's 300 host, 1B1, the hop to 0B1 (400), 0B1. The lane goes on past each RECV."""
    schedule = build("gpipe", 2, 2)
    rows = [
        (0, 0, "F", 0, 0, 1000),
        (0, 0, "SEND_F", 0, 1000, 1100),
        (0, 0, "F", 1, 1100, 2100),
        (0, 0, "SEND_F", 1, 2100, 2200),
        (0, 0, "RECV_B", 0, 2200, 2300),
        (0, 0, "RECV_B", 1, 2300, 2400),
        (0, 0, "B", 0, 2400, 8020),  # waits until 6020
        (0, 0, "B", 1, 8020, 10420),  # waits until 8420
        (1, 1, "RECV_F", 0, 100, 200),
        (1, 1, "RECV_F", 1, 200, 300),
        (1, 1, "F", 0, 300, 2600),  # waits until 1400, 200 host, works from 1600
        (1, 1, "F", 1, 2600, 3620),  # its wait call returns at 2620, the data there since 2500
        (1, 1, "B", 0, 3620, 5620),
        (1, 1, "SEND_B", 0, 5620, 5720),
        (1, 1, "B", 1, 5720, 8020),  # 300 host, then its work
        (1, 1, "SEND_B", 1, 8020, 8120),
    ]
    waits = _waits(  # each receive's gloo:recv inside its label, then its consumer's wait
        [
            (0, 0, "RECV_B", 0, 2250, 2300),
            (0, 0, "RECV_B", 0, 2400, 6020),
            (0, 0, "RECV_B", 1, 2350, 2400),
            (0, 0, "RECV_B", 1, 8020, 8420),
            (1, 1, "RECV_F", 0, 150, 200),
            (1, 1, "RECV_F", 0, 300, 1400),
            (1, 1, "RECV_F", 1, 250, 300),
            (1, 1, "RECV_F", 1, 2600, 2620),
        ]
    )
    work = pl.when(pl.col("kind") == "F").then(1000.0).otherwise(2000.0)  # a compute span less its waits
    cells = _cells(rows).with_columns(busy_ns=pl.when(pl.col("busy_ns").is_not_null()).then(work))
    own = measure(schedule, cells, waits, _gaps([]), _windows([10420, 8120]), on_gpu=False)
    assert own.posted_receives
    inputs = {
        f"{s}{k}{mb}": (pre, t)
        for s, k, mb, pre, t in own.actions.select(*KEY, "pre", "transfer").iter_rows()
    }
    assert {name: inputs[name] for name in ("1RECV_F0", "1RECV_F1", "0RECV_B0", "0RECV_B1")} == {
        "1RECV_F0": (50.0, 400.0),  # the post's host time inside the label
        "1RECV_F1": (50.0, 20.0),  # no longer than its consumer waited
        "0RECV_B0": (50.0, 400.0),
        "0RECV_B1": (50.0, 400.0),
    }
    assert [inputs[name][0] for name in ("1F0", "1F1", "1B1", "0B0", "0B1")] == [200.0, 20.0, 300.0, 0.0, 0.0]
    replayed = replay(schedule, own.step(0, 2))
    assert replayed.makespan == 10420
    parts = {}
    for segment in replayed.path:
        parts[segment.part] = parts.get(segment.part, 0.0) + segment.end - segment.start
    assert parts == {"compute": 9000.0, "hop": 800.0, "launch_overhead": 620.0}


def test_an_isend_whose_slow_call_outlasted_its_receivers_post_is_not_taken_for_a_blocking_send():
    """gpipe p=2 m=2 in ns, every send an isend; a loaded host slowed both forward calls: each began before
    its receiver's wait and ended inside it. Of the three sends that began before their receiver's wait,
    two ended after it, so timing alone votes blocking.
    gloo's span of each send outlived its call (it closes when the step's wait for sends returns): isends.
    Where gloo's spans ended inside the calls, the same timing is a blocking send's."""
    schedule = build("gpipe", 2, 2)
    rows = [
        (0, 0, "F", 0, 0, 1000),
        (0, 0, "SEND_F", 0, 1000, 2300),  # the call ran on 300 ns into 1RECV_F0's wait
        (0, 0, "F", 1, 2300, 3300),
        (0, 0, "SEND_F", 1, 3300, 4600),  # and this one 300 ns into 1RECV_F1's
        (1, 1, "RECV_F", 0, 2000, 2400),
        (1, 1, "F", 0, 2400, 3400),
        (1, 1, "RECV_F", 1, 4300, 4700),
        (1, 1, "F", 1, 4700, 5700),
        (1, 1, "B", 0, 5700, 6700),
        (1, 1, "SEND_B", 0, 6700, 6800),
        (1, 1, "B", 1, 6800, 7800),
        (1, 1, "SEND_B", 1, 7800, 7900),
        (0, 0, "RECV_B", 0, 4600, 7200),
        (0, 0, "B", 0, 7200, 8200),
        (0, 0, "RECV_B", 1, 8200, 8400),
        (0, 0, "B", 1, 8400, 9400),
    ]
    recvs = [(r, s, k, mb, a, b) for r, s, k, mb, a, b in rows if k.startswith("RECV")]
    sends = [(r, 0, s, k, mb) for r, s, k, mb, *_ in rows if k.startswith("SEND")]

    def blocking(outlives: bool | None) -> bool:
        spans = None
        if outlives is not None:
            schema = {name: CELL_SCHEMA[name] for name in CELL_KEY} | {"outlives": pl.Boolean}
            spans = pl.DataFrame([(*key, outlives) for key in sends], schema=schema, orient="row")
        windows = _windows([9400, 7900])
        return measure(
            schedule, _cells(rows), _waits(recvs), _gaps([]), windows, False, None, spans
        ).blocking_sends

    assert blocking(None)  # timing alone: misled
    assert not blocking(True)
    assert blocking(False)


def test_the_critical_path_crosses_ranks_and_tiles_the_replay(tmp_path):
    analysis = analyze_pipeline(read_run(gpipe_m1_run(tmp_path)))
    path = analysis.critical.sort("start_ns")
    assert (path["end_ns"] - path["start_ns"]).sum() == 91_000  # the own replay: the step less 9 us
    assert (path["start_ns"].slice(1) == path["end_ns"].slice(0, path.height - 1)).all()  # no holes
    work = path.filter(pl.col("part") == "compute")
    assert [f"{s}{k}{mb}" for s, k, mb in work.select("stage", "kind", "microbatch").iter_rows()] == [
        "0F0",
        "1F0",
        "1B0",
        "0B0",
    ]
    hops = path.filter(pl.col("part") == "hop").select("kind", d=pl.col("end_ns") - pl.col("start_ns"))
    assert hops.rows() == [("RECV_F", 3000), ("RECV_B", 1000)]  # after the partners posted
    assert analysis.cells.filter(pl.col("kind").is_in(["F", "B"]))["slack_ns"].to_list() == [0.0] * 4


def test_a_cell_off_the_critical_path_has_slack():
    """gpipe p=2 m=2, stage 1's backwards 2 units, the rest 1: 1B0 ends at 5 and 1B1 at 7, so 0B0 runs
    [5, 6] while 0B1 waits for 1B1 until 7: 0B0 could grow by 1 before the step does, 0B1 not at all."""
    schedule = build("gpipe", 2, 2)
    step = _unit_step(lower(schedule).orders)
    inputs = dict(step.inputs)
    for action in inputs:
        if action.kind is Kind.B and action.stage == 1:
            inputs[action] = Inputs(work=2.0)
    replayed = replay(schedule, Step(step.orders, inputs, step.tails))
    assert replayed.makespan == 8
    assert replayed.slack[Action(0, Kind.B, 0)] == 1
    assert replayed.slack[Action(0, Kind.B, 1)] == 0


def _reachable(root: object) -> int:
    """How many distinct objects `root` reaches (shared ones counted once)."""
    seen, todo = set(), [root]
    while todo:
        obj = todo.pop()
        if id(obj) not in seen:
            seen.add(id(obj))
            todo.extend(gc.get_referents(obj))
    return len(seen)


def test_the_replays_of_many_steps_hold_no_object_per_action_for_their_spans():
    """A measured run replays every step and keeps the replays; their spans are read from the node
    times shared by the steps, not held as a dict of tuples per step (three objects an action)."""
    schedule = build("1f1b", 2, 8)
    orders = lower(schedule).orders
    step = Step(orders, {a: Inputs(lead=1.0, work=10.0) for o in orders for a in o}, [Tail()] * 2)
    actions = sum(map(len, orders))

    def held(n: int) -> int:
        return _reachable([r.spans for r in replay_all(schedule, [step] * n)])

    assert (held(40) - held(20)) / 20 < actions


def test_the_inputs_of_all_steps_taken_at_once_are_each_steps_own(tmp_path):
    """OwnSteps.steps (one pass over the tables, as a measured run takes every step's inputs) gives what
    OwnSteps.step gives one step at a time, and an empty step for a number not analysed; each step's
    lead and DP-sync tail are made to differ, so a row given to the wrong step shows."""
    write_job(tmp_path, build("1f1b", 2, 4), 2, slow_pipeline=1, slow_factor=1.2, sync_us=500.0)
    own = analyze_job(read_run(tmp_path)).own
    own = own._replace(
        actions=own.actions.with_columns(pl.col("lead") + pl.col("step")),
        tails=own.tails.with_columns(pl.col("dp_sync") + pl.col("step")),
    )
    numbers = sorted(own.tails["step"].unique().to_list())
    assert len(numbers) > 1 and own.tails["dp_sync"].min() > 0
    asked = [*numbers, max(numbers) + 1]
    assert own.steps(asked, 2) == [own.step(n, 2) for n in asked]
