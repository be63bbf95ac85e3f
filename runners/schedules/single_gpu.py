"""P pipeline ranks on one GPU, as data: which stream runs each action, which CUDA events order the
streams, and the order one host thread issues every rank's actions in (torch-free).

Virtual rank r is compute stream r: it runs the compute of the stages the schedule places on rank r,
and its RECVs wait there. A SEND is a device-to-device copy on the sender's own copy stream (one per
sending rank, as each GPU of a multi-GPU run has its own NCCL stream: copies queued on one shared
stream would wait behind hops whose data is not ready yet). Events order them:

    SEND s->t, microbatch i: record `produced` on compute stream s; copy stream s waits for it, copies,
                             records `arrived`
    RECV of it on rank t:    compute stream t waits for that `arrived`

A stream that waits for an event recorded later does not wait at all, so the host must issue every
SEND before the RECV that waits for its copy; `issue_plan` orders the actions so, keeping each rank's
own order, and takes the action a P-GPU run would start first (the unit-time replay) among those that
may go next, so the host issues work in the order the device needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .actions import Action, Kind
from .bubble import unit_time
from .dependencies import matching_send
from .schedule import Schedule
from .simulate import simulate

SINGLE_GPU = "single_gpu"  # run.json's "mode" of such a run
PROCESSES = "processes"  # run.json's "mode" of a run with one process (and device) per rank
COMPUTE, COPY = "compute", "copy"  # the two kinds of stream a virtual rank has


@dataclass(frozen=True)
class Stream:
    kind: str  # COMPUTE or COPY
    rank: int  # the virtual rank it belongs to


@dataclass(frozen=True)
class Issue:
    """One action as the host issues it: the stream its work runs on and the order it keeps."""

    action: Action
    stream: Stream
    after: Stream | None = None  # SEND: the copy starts once this stream (the producer's) got here
    waits_for: Action | None = None  # RECV: the SEND whose copy its stream waits for


def issue(schedule: Schedule, action: Action) -> Issue:
    """The streams and events of one action of a lowered schedule (the module docstring)."""
    rank = schedule.rank_of(action.stage)
    if action.kind in (Kind.SEND_F, Kind.SEND_B):
        return Issue(action, Stream(COPY, rank), after=Stream(COMPUTE, rank))
    if action.kind in (Kind.RECV_F, Kind.RECV_B):
        return Issue(action, Stream(COMPUTE, rank), waits_for=matching_send(action))
    return Issue(action, Stream(COMPUTE, rank))


def issue_plan(schedule: Schedule) -> tuple[Issue, ...]:
    """Every rank's actions merged into the one order the host issues them in (the module docstring).

    Each step takes, among the ranks whose next action may go (a RECV only once its SEND is issued),
    the one whose action starts first in the unit-time replay, the lower rank on a tie. The replay has
    checked the schedule runs, so some rank can always go."""
    start = {(rank, action): begin for rank, action, begin, _ in simulate(schedule, duration=unit_time).rows}
    position = [0] * schedule.p
    issued: set[Action] = set()
    plan: list[Issue] = []
    total = sum(len(order) for order in schedule.orders)
    while len(plan) < total:
        ready = [
            rank
            for rank, order in enumerate(schedule.orders)
            if position[rank] < len(order) and _may_go(schedule, order[position[rank]], issued)
        ]
        rank = min(ready, key=lambda r: (start[(r, schedule.orders[r][position[r]])], r))
        action = schedule.orders[rank][position[rank]]
        position[rank] += 1
        issued.add(action)
        plan.append(issue(schedule, action))
    return tuple(plan)


def _may_go(schedule: Schedule, action: Action, issued: set[Action]) -> bool:
    waited = issue(schedule, action).waits_for
    return waited is None or waited in issued
