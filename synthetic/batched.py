"""Batched p2p, as torch.distributed.batch_isend_irecv runs it on NCCL: a rank's SEND and the RECV right
after it in its order (1F1B's steady state: SEND_F then RECV_B, SEND_B then RECV_F) are issued together
and run as one ncclDevKernel_SendRecv that carries both.

runners.schedules.simulate cannot express such a pair: there a SEND never holds its rank and the compute
after a RECV starts once the received data arrived. A coalesced kernel completes as one, and the
consumer's work.wait() makes the compute stream wait for all of it, so the compute after the pair also
waits until the sent data reached its receiver, which needs that receiver to have posted its receive.
`replay` is simulate's rule with that one change; without pairs it gives simulate's times exactly.

Times of a pair (S, R) on a rank, with post = when the rank reached it (S's issue, start and end; R's
issue), sent = when the peer's matching SEND ran, and the receiver's post = when the receiver of S
reached that RECV:
- R's data arrives at max(post, sent + latency) (R's start, as for an unbatched RECV);
- S's data reaches its receiver at max(receiver's post, post + latency) (the receiving RECV's start);
- the pair's kernel runs from post until the later of the two (R's end); the next action waits for it.
"""

from __future__ import annotations

from collections.abc import Callable

from runners.schedules import Action, Kind, Schedule
from runners.schedules.dependencies import dependencies, matching_recv, matching_send, receiving

Row = tuple[int, Action, int, int]  # (rank, action, start, end), by rank then order, as Timeline.rows


class BatchedError(ValueError):
    """A batched replay that cannot proceed (a pair waiting on a receive that waits on it)."""


def pairs(schedule: Schedule) -> dict[Action, Action]:
    """RECV -> the SEND just before it in its rank's order: the pairs batch_isend_irecv issues together."""
    return {
        recv: send
        for order in schedule.orders
        for send, recv in zip(order, order[1:])
        if send.kind in (Kind.SEND_F, Kind.SEND_B) and recv.kind in (Kind.RECV_F, Kind.RECV_B)
    }


def replay(
    schedule: Schedule,
    duration: Callable[[int, Action], int],
    latency: int,
    gap: Callable[[int, Action], int],
    batched: dict[Action, Action],
) -> list[Row]:
    """The lowered `schedule` replayed in integer ns with the pairs in `batched` (RECV -> SEND) coalesced.

    Each rank runs its order; an action starts once the rank is free and what it waits for has ended
    (a compute: its same-rank producers and its RECV; a SEND: its compute; a RECV: the peer's SEND plus
    `latency`, and if paired also the receiver of its SEND having reached that RECV), then after `gap`.
    """
    where = {action: (r, k) for r, order in enumerate(schedule.orders) for k, action in enumerate(order)}
    ends: list[list[int]] = [[] for _ in schedule.orders]
    starts: list[list[int]] = [[] for _ in schedule.orders]

    def done(action: Action) -> int | None:
        r, k = where[action]
        return ends[r][k] if k < len(ends[r]) else None

    def reached(action: Action) -> int | None:
        """When the rank of `action` turned to it (the end of the action before), once it has."""
        r, k = where[action]
        if k > len(ends[r]):
            return None
        return ends[r][k - 1] if k else 0

    def times(r: int, action: Action, free: int) -> tuple[int, int] | None:
        if action.kind in (Kind.RECV_F, Kind.RECV_B):
            sent = done(matching_send(action))
            if sent is None:
                return None
            arrival = max(free, sent + latency)
            if action not in batched:
                return arrival, arrival
            posted = reached(matching_recv(batched[action]))
            if posted is None:
                return None
            return arrival, max(arrival, posted, free + latency)
        waits = []
        for dep in dependencies(schedule, action):
            if schedule.rank_of(dep.stage) == r:
                waits.append(done(dep))
            elif action.kind.is_compute:
                waits.append(done(receiving(action)))
        if any(w is None for w in waits):
            return None
        start = max([free, *waits]) + gap(r, action)
        return start, start + duration(r, action)

    progress = True
    while progress:
        progress = False
        for r, order in enumerate(schedule.orders):
            while len(ends[r]) < len(order):
                got = times(r, order[len(ends[r])], ends[r][-1] if ends[r] else 0)
                if got is None:
                    break
                starts[r].append(got[0])
                ends[r].append(got[1])
                progress = True
    stuck = [
        f"rank {r} at {order[len(ends[r])]}"
        for r, order in enumerate(schedule.orders)
        if len(ends[r]) < len(order)
    ]
    if stuck:
        raise BatchedError(f"{schedule.name}: batched p2p deadlocks ({', '.join(stuck)})")
    return [
        (r, action, start, end)
        for r, order in enumerate(schedule.orders)
        for action, start, end in zip(order, starts[r], ends[r])
    ]
