"""Dependency-driven replay of a schedule: when each action starts and ends, per rank, in its order.

Each rank runs its actions in the scheduled order; an action starts once the rank is free and every
action it waits for has ended (plus `latency` on an edge between ranks), then after `gap` more idle.
On a lowered schedule a RECV blocks until the peer has reached the matching SEND, and a SEND never
blocks (asynchronous); compute reads its cross-rank input from the RECV before it. On a compute-only
schedule the compute waits for the producing compute directly. A rank that can never proceed is a
deadlock: ScheduleError with the grid, the stuck steps marked.
"""

from __future__ import annotations

from collections.abc import Callable

from .actions import Action, Kind
from .dependencies import dependencies, matching_send, receiving
from .grid import grid
from .schedule import Schedule, ScheduleError
from .timeline import Timeline

Duration = Callable[[int, Action], float]
Latency = Callable[[Action, Action], float]
Gap = Callable[[int, Action], float]
Edge = tuple[Action, bool]  # (action waited for, crosses ranks)
Wait = tuple[int, int, bool, Action]  # (its rank, its step there or -1, crosses ranks, the action)


def _edges(schedule: Schedule, rank: int, action: Action) -> tuple[Edge, ...]:
    if action.kind in (Kind.RECV_F, Kind.RECV_B):
        return ((matching_send(action), True),)
    if action.kind.is_comm:
        return tuple((dep, False) for dep in dependencies(schedule, action))
    edges = []
    for dep in dependencies(schedule, action):
        if schedule.rank_of(dep.stage) == rank:
            edges.append((dep, False))
        elif schedule.lowered:
            edges.append((receiving(action), False))
        else:
            edges.append((dep, True))
    return tuple(edges)


def _unit(_rank: int, action: Action) -> float:
    return 1.0 if action.kind.is_compute else 0.0


def _positions(schedule: Schedule) -> list[list[tuple[Wait, ...]]]:
    """Each action's edges as (rank, step, crosses, action) of what it waits for; step -1 if absent."""
    where = {action: (r, k) for r, order in enumerate(schedule.orders) for k, action in enumerate(order)}
    return [
        [
            tuple((*where.get(dep, (r, -1)), crosses, dep) for dep, crosses in _edges(schedule, r, action))
            for action in order
        ]
        for r, order in enumerate(schedule.orders)
    ]


def simulate(
    schedule: Schedule,
    duration: Duration | None = None,
    latency: Latency | None = None,
    gap: Gap | None = None,
) -> Timeline:
    """Replay `schedule`; by default every compute action takes 1 unit, comm 0, no latency, no gaps.

    An action is done once its rank's position has passed it, so waiting is a comparison of positions.
    """
    duration = duration or _unit
    edges = _positions(schedule)
    ends: list[list[float]] = [[] for _ in schedule.orders]  # per rank, end time by step
    rows: list[tuple[int, Action, float, float]] = []
    free = [0.0] * schedule.p
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(schedule.orders):
            done = ends[r]
            while len(done) < len(order):
                action, ready = order[len(done)], free[r]
                for dep_rank, dep_step, crosses, dep in edges[r][len(done)]:
                    if not 0 <= dep_step < len(ends[dep_rank]):
                        break
                    end = ends[dep_rank][dep_step]
                    if crosses and latency is not None:
                        end += latency(dep, action)
                    ready = max(ready, end)
                else:
                    start = ready + (gap(r, action) if gap is not None else 0.0)
                    free[r] = start + duration(r, action)
                    done.append(free[r])
                    rows.append((r, action, start, free[r]))
                    progress = True
                    continue
                break
    if any(len(done) < len(order) for done, order in zip(ends, schedule.orders)):
        raise _deadlock(schedule, [len(done) for done in ends], edges)
    return Timeline(tuple(sorted(rows, key=lambda row: (row[0], row[2]))))


def _deadlock(schedule: Schedule, position: list[int], edges: list[list[tuple[Wait, ...]]]) -> ScheduleError:
    stuck = []
    for r, k in enumerate(position):
        if k == len(schedule.orders[r]):
            continue
        _, dep_step, _, waiting = next(e for e in edges[r][k] if not 0 <= e[1] < position[e[0]])
        why = "which is not in the schedule" if dep_step < 0 else "which cannot run before it"
        stuck.append((r, k, f"rank {r} step {k} ({schedule.orders[r][k]}) waits for {waiting}, {why}"))
    lines = "; ".join(text for _, _, text in stuck)
    marks = {(r, k) for r, k, _ in stuck}
    return ScheduleError(f"{schedule.name}: deadlock: {lines}\n{grid(schedule, marks=marks)}")
