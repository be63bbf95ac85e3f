"""P ranks on one GPU as data (runners.schedules.single_gpu): which stream runs each action, which event
each RECV waits for, and the one order the host issues every rank's actions in. Torch-free."""

from __future__ import annotations

import pytest

from runners.schedules import Action, Kind, build, lower
from runners.schedules.dependencies import matching_send
from runners.schedules.single_gpu import COMPUTE, COPY, Stream, issue_plan

SCHEDULES = [
    ("gpipe", 4, 8, 1),
    ("gpipe", 4, 1, 1),
    ("1f1b", 4, 8, 1),
    ("interleaved", 2, 4, 2),
    ("zb", 3, 6, 1),
    ("zb", 2, 4, 2),
    ("zbv", 3, 6, 2),
    ("dualpipev", 2, 4, 2),
]


@pytest.mark.parametrize("name,p,m,v", SCHEDULES)
def test_the_plan_issues_every_action_once_in_each_ranks_order(name, p, m, v):
    schedule = lower(build(name, p, m, v))
    plan = issue_plan(schedule)
    assert len(plan) == sum(len(order) for order in schedule.orders)
    for rank, order in enumerate(schedule.orders):
        assert tuple(item.action for item in plan if item.stream.rank == rank) == order


@pytest.mark.parametrize("name,p,m,v", SCHEDULES)
def test_every_receive_waits_for_a_copy_the_host_issued_before_it(name, p, m, v):
    """A CUDA stream waiting for an event not yet recorded does not wait at all."""
    schedule = lower(build(name, p, m, v))
    issued: set[Action] = set()
    for item in issue_plan(schedule):
        if item.action.kind in (Kind.RECV_F, Kind.RECV_B):
            assert item.waits_for == matching_send(item.action) and item.waits_for in issued
        else:
            assert item.waits_for is None
        issued.add(item.action)


@pytest.mark.parametrize("name,p,m,v", SCHEDULES)
def test_each_virtual_rank_computes_and_waits_on_its_stream_and_copies_on_its_own(name, p, m, v):
    schedule = lower(build(name, p, m, v))
    for item in issue_plan(schedule):
        rank = schedule.rank_of(item.action.stage)
        if item.action.kind in (Kind.SEND_F, Kind.SEND_B):
            # the copy starts once the sender's compute stream has produced the tensor
            assert item.stream == Stream(COPY, rank) and item.after == Stream(COMPUTE, rank)
        else:
            assert item.stream == Stream(COMPUTE, rank) and item.after is None


def test_the_host_issues_in_the_order_a_pipeline_needs_the_work():
    """gpipe p=2 m=2: rank 1's receive goes out as soon as rank 0's send, not after all of rank 0."""
    plan = [str(item.action) for item in issue_plan(lower(build("gpipe", 2, 2)))]
    assert plan == [
        "0F0",
        "0SEND_F0",
        "0F1",
        "1RECV_F0",
        "1F0",
        "0SEND_F1",
        "1RECV_F1",
        "1F1",
        "1B0",
        "1SEND_B0",
        "0RECV_B0",
        "0B0",
        "1B1",
        "1SEND_B1",
        "0RECV_B1",
        "0B1",
    ]


def test_stages_of_one_rank_hand_over_without_events():
    """Interleaved with p=1: both chunks on one stream, no SEND or RECV, so no copy and no wait."""
    plan = issue_plan(lower(build("interleaved", 1, 2, 2)))
    assert {item.stream for item in plan} == {Stream(COMPUTE, 0)}
    assert all(item.waits_for is None and item.after is None for item in plan)
