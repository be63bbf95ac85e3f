"""The V placement (rank r holds stages r and 2p-1-r) and the two schedules that use it, zbv and
dualpipev: placement, lowering, validation and replay honour it, and our orders are torch's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.distributed.pipelining import schedules

from runners.schedules import (
    Action,
    Kind,
    ScheduleError,
    build,
    dependencies,
    in_flight,
    lower,
    simulate,
    validate,
)

A = Action.parse
COMPUTE = {"F", "B", "I", "W"}


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_v_placement_puts_stage_r_and_its_mirror_on_rank_r(name):
    schedule = build(name, 4, 8, 2)
    assert schedule.n_stages == 8
    assert [schedule.stages_of(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [schedule.rank_of(s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    for rank, order in enumerate(schedule.orders):
        assert {a.stage for a in order} == set(schedule.stages_of(rank))


def test_lowering_skips_the_turn_of_the_v_and_crosses_everywhere_else():
    lowered = lower(build("zbv", 3, 6, 2))
    comms = {a for order in lowered.orders for a in order if a.kind.is_comm}
    # stages 2 and 3 share rank 2: the turn hands over in memory
    assert A("3RECV_F0") not in comms and A("2SEND_F0") not in comms
    assert A("2RECV_B0") not in comms and A("3SEND_B0") not in comms
    # stage 4 (rank 1) feeds stage 5 (rank 0): a real hop, and the gradient comes back
    assert {A("4SEND_F0"), A("5RECV_F0"), A("5SEND_B0"), A("4RECV_B0")} <= comms
    assert all(a.microbatch < 6 for a in comms)
    validate(lowered)


def test_the_loss_is_on_rank_0_and_its_backward_waits_only_for_its_forward():
    zbv = build("zbv", 2, 4, 2)
    assert zbv.rank_of(zbv.n_stages - 1) == 0
    assert dependencies(zbv, A("3I0")) == (A("3F0"),)
    assert set(dependencies(zbv, A("2I0"))) == {A("2F0"), A("3I0")}
    assert dependencies(zbv, A("2F1")) == (A("1F1"),)


def test_dualpipev_mixes_full_and_split_backwards_and_dependencies_follow_each():
    schedule = build("dualpipev", 2, 4, 2)
    kinds = {
        (a.stage, a.microbatch): a.kind
        for order in schedule.orders
        for a in order
        if a.kind is not Kind.F and a.kind is not Kind.W
    }
    assert Kind.B in kinds.values() and Kind.I in kinds.values()
    # 3I0 is split, 3B1 is not: the stage below waits for whichever carries the gradient
    assert kinds[(3, 0)] is Kind.I and kinds[(3, 1)] is Kind.B
    assert A("3I0") in dependencies(schedule, A("2B0"))
    assert A("3B1") in dependencies(schedule, A("2B1"))
    assert dependencies(schedule, A("2RECV_B1")) == (A("3B1"),)


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
@pytest.mark.parametrize(("p", "m"), [(1, 2), (2, 4), (2, 5), (3, 6), (4, 8), (4, 13), (8, 16)])
def test_v_schedules_validate_lowered_and_replay_the_same(name, p, m):
    schedule = build(name, p, m, 2)
    validate(lower(schedule))
    assert simulate(lower(schedule)).makespan == simulate(schedule).makespan
    assert all(counts[-1] == 0 for counts in in_flight(schedule))


@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 9), (4, 8), (8, 32)])
def test_zbv_at_unit_costs_idles_p_minus_1_slots_per_rank(p, m):
    timeline = simulate(build("zbv", p, m, 2))  # F = I = W = 1 unit: 6m units of work per rank
    assert timeline.makespan == 6 * m + p - 1
    assert all(timeline.makespan - timeline.busy(r) == p - 1 for r in range(p))


@pytest.mark.parametrize(
    ("name", "p", "m", "v", "words"),
    [
        ("zbv", 2, 4, 1, ["v=1", "use v=2"]),
        ("dualpipev", 2, 4, 3, ["v=3"]),
        ("dualpipev", 4, 7, 2, ["m=7 < 2p=8"]),
    ],
)
def test_bad_v_requests_refused_in_one_line(name, p, m, v, words):
    with pytest.raises(ScheduleError) as raised:
        build(name, p, m, v)
    assert "\n" not in str(raised.value) and all(word in str(raised.value) for word in words)


def _torch_orders(name: str, p: int, m: int) -> list[list[str]]:
    """torch's own per-rank compute order, its fused OVERLAP_F_B opened into its two sub-actions."""
    cls = {"zbv": schedules.ScheduleZBVZeroBubble, "dualpipev": schedules.ScheduleDualPipeV}[name]
    planner = SimpleNamespace(pp_group_size=p, num_stages=2 * p, _n_microbatches=m)
    orders = []
    for rank in range(p):
        actions = [a for a in cls._calculate_single_rank_operations(planner, rank) if a is not None]
        opened = [sub for a in actions for sub in (a.sub_actions or (a,))]
        orders.append([str(a) for a in opened if str(a).rstrip("0123456789")[-1:] in COMPUTE])
    return orders


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
@pytest.mark.parametrize(("p", "m"), [(1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 11), (8, 32)])
def test_v_orders_match_torch(name, p, m):
    ours = [[str(a) for a in order] for order in build(name, p, m, 2).orders]
    assert ours == _torch_orders(name, p, m)
