"""Lowering, validation, simulation with costs, the grid and the dependency rules."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from runners.schedules import (
    SCHEDULES,
    V_SHAPED,
    Action,
    Kind,
    ScheduleError,
    build,
    dependencies,
    grid,
    lower,
    simulate,
    validate,
)

A = Action.parse


def _requests():
    for name in sorted(SCHEDULES.keys() - V_SHAPED):  # V-shaped: tests/test_schedules_vshape.py
        for p in (1, 2, 3, 8):
            for v in (1, 2, 4) if name == "interleaved" else (1,):
                for m in (p, 2 * p) if name != "gpipe" else (1, p + 1):
                    yield name, p, m, v


@pytest.mark.parametrize(("name", "p", "m", "v"), list(_requests()))
def test_lowered_schedules_validate_and_keep_the_unit_span(name, p, m, v):
    schedule = build(name, p, m, v)
    validate(schedule)
    lowered = lower(schedule)
    validate(lowered)
    assert lowered.lowered and not schedule.lowered
    assert simulate(lowered).makespan == simulate(schedule).makespan


def test_dependencies_follow_the_data():
    one_f_one_b, zb = build("1f1b", 3, 3), build("zb", 3, 3)
    assert dependencies(one_f_one_b, A("0F2")) == ()
    assert dependencies(one_f_one_b, A("1F2")) == (A("0F2"),)
    assert set(dependencies(one_f_one_b, A("1B2"))) == {A("1F2"), A("2B2")}
    assert dependencies(one_f_one_b, A("2B0")) == (A("2F0"),)  # the loss is on the last stage
    assert set(dependencies(zb, A("0I1"))) == {A("0F1"), A("1I1")}
    assert dependencies(zb, A("1W1")) == (A("1I1"),)
    assert dependencies(zb, A("1RECV_B1")) == (A("2I1"),)
    assert dependencies(one_f_one_b, A("1SEND_F0")) == (A("1F0"),)


def test_lower_sends_after_the_producer_and_receives_before_the_consumer():
    lowered = lower(build("1f1b", 3, 4))
    for order in lowered.orders:
        for k, action in enumerate(order):
            if action.kind in (Kind.SEND_F, Kind.SEND_B):
                producer = Kind.F if action.kind is Kind.SEND_F else Kind.B
                assert order[k - 1] == Action(action.stage, producer, action.microbatch)
            if action.kind in (Kind.RECV_F, Kind.RECV_B):
                consumer = Kind.F if action.kind is Kind.RECV_F else Kind.B
                assert order[k + 1] == Action(action.stage, consumer, action.microbatch)
    kinds = [a.kind for order in lowered.orders for a in order]
    # p - 1 = 2 boundaries, 4 microbatches, each crossed once forward and once backward
    for kind in (Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B):
        assert kinds.count(kind) == 8


def test_no_comm_between_chunks_on_one_rank():
    lowered = lower(build("interleaved", 1, 3, 4))
    assert all(a.kind.is_compute for a in lowered.orders[0])
    validate(lowered)


def test_interleaved_sends_across_the_wrap_from_last_rank_to_first():
    lowered = lower(build("interleaved", 2, 2, 2))
    assert A("1SEND_F0") in lowered.orders[1] and A("2RECV_F0") in lowered.orders[0]
    assert A("2SEND_B0") in lowered.orders[0] and A("1RECV_B0") in lowered.orders[1]


def _swap(schedule, rank, i, j):
    order = list(schedule.orders[rank])
    order[i], order[j] = order[j], order[i]
    orders = list(schedule.orders)
    orders[rank] = tuple(order)
    return replace(schedule, orders=tuple(orders))


def test_deadlock_shows_the_grid_with_the_stuck_steps_marked():
    schedule = build("1f1b", 2, 3)
    broken = _swap(schedule, 1, 0, 1)  # rank 1: B0 before F0
    with pytest.raises(ScheduleError) as raised:
        validate(broken)
    message = str(raised.value)
    assert "deadlock" in message and "1B0" in message
    marked = [line for line in message.splitlines() if line.startswith(">>")]
    assert len(marked) >= 1 and all("[" in line for line in marked)
    assert "rank 0" in message and "rank 1" in message  # the grid's header


def test_receive_placed_after_its_consumer_deadlocks():
    lowered = lower(build("gpipe", 2, 1))
    order = lowered.orders[1]
    assert order[0] == A("1RECV_F0")
    with pytest.raises(ScheduleError, match="1F0.*waits for 1RECV_F0"):
        validate(_swap(lowered, 1, 0, 1))


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda o: o[1] + (A("1F0"),), "1F0 twice"),
        (lambda o: o[1][:-1], "never scheduled: 1B1"),
        (lambda o: o[1] + (A("0F1"),), "0F1 on rank 1, but stage 0 lives on rank 0"),
        (lambda o: o[1] + (A("1F9"),), "not an action of this pipeline"),
        (lambda o: o[1] + (A("1SEND_F0"),), "comm action in a schedule not marked lowered"),
    ],
)
def test_validate_names_the_problem(edit, words):
    schedule = build("gpipe", 2, 2)
    broken = replace(schedule, orders=(schedule.orders[0], edit(schedule.orders)))
    with pytest.raises(ScheduleError, match=words):
        validate(broken)


def test_validate_rejects_unpaired_and_missing_comm():
    lowered = lower(build("gpipe", 2, 2))
    extra = replace(lowered, orders=(lowered.orders[0] + (A("1SEND_F0"),), lowered.orders[1]))
    with pytest.raises(ScheduleError, match="no partner"):
        validate(extra)
    without_recv = tuple(a for a in lowered.orders[1] if a != A("1RECV_F1"))
    with pytest.raises(ScheduleError, match="never scheduled: 1RECV_F1"):
        validate(replace(lowered, orders=(lowered.orders[0], without_recv)))


def test_latency_and_gap_by_hand():
    # gpipe p=2 m=1; every compute idles 0.25 before it starts, each hop between ranks costs 0.5:
    # r0 F 0.25-1.25; r1 F (1.25+0.5)+0.25 = 2.0-3.0; r1 B 3.25-4.25; r0 B (4.25+0.5)+0.25 = 5.0-6.0
    schedule = build("gpipe", 2, 1)

    def gap(_rank, action):
        return 0.25 if action.kind.is_compute else 0.0

    def latency(_src, _dst):
        return 0.5

    for variant in (schedule, lower(schedule)):
        timeline = simulate(variant, latency=latency, gap=gap)
        spans = {str(a): (start, end) for _, a, start, end in timeline.rows if a.kind.is_compute}
        assert spans == {"0F0": (0.25, 1.25), "1F0": (2.0, 3.0), "1B0": (3.25, 4.25), "0B0": (5.0, 6.0)}
        assert timeline.makespan == 6.0  # from 0, so rank 0's first gap is part of the step
        assert timeline.busy(0) == timeline.busy(1) == 2.0


def test_measured_durations_make_the_slowest_stage_the_bottleneck():
    # stage 1 three times slower: the fast neighbours always have its next input ready (stage 0 keeps
    # one forward ahead, stage 2 turns a gradient around in 2 units), so stage 1 works without a break
    # from the end of 0F0 (t=1) for m*(F+B) = 48 units, and 0B7 adds 1: the step is exactly 50
    schedule = build("1f1b", 3, 8)

    def duration(rank, action):
        return (3.0 if rank == 1 else 1.0) if action.kind.is_compute else 0.0

    timeline = simulate(schedule, duration=duration)
    assert timeline.busy(1) == 48.0
    assert timeline.makespan == 1 + 48 + 1


def test_lowered_comm_durations_count_as_waiting_not_work():
    lowered = lower(build("gpipe", 2, 2))

    def duration(_rank, action):
        return 1.0 if action.kind.is_compute else 0.5

    timeline = simulate(lowered, duration=duration)
    assert timeline.busy(0) == timeline.busy(1) == 4.0
    assert timeline.makespan > simulate(lowered).makespan


def test_timeline_grid_shows_the_bubble_as_blanks():
    schedule = build("gpipe", 2, 2)
    text = grid(schedule, simulate(schedule))
    rows = [line.split() for line in text.splitlines()[2:]]
    assert [row[0] for row in rows] == ["0", "1", "2", "3", "4", "5"]  # 2(m+p-1) = 6 unit slots
    assert rows[0][1:] == ["0F0"]  # rank 1 idle at t=0
    assert rows[-1][1:] == ["0B1"]
    step_text = grid(schedule)
    assert step_text.splitlines()[1].split() == ["step", "rank", "0", "rank", "1"]
    assert len(step_text.splitlines()) == 2 + 4  # header lines + 2m steps


def test_simulate_is_fast_enough_for_the_analysis():
    lowered = lower(build("interleaved", 8, 32, 4))
    best = min(_cpu_seconds(lambda: simulate(lowered)) for _ in range(3))
    # the bound is several times what the replay needs, leaving room for a busy CI runner
    assert best < 0.2


def _cpu_seconds(work) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start
