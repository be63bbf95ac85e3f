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
from dataclasses import dataclass

from .actions import Action, Kind
from .dependencies import dependencies, matching_send, receiving
from .grid import grid
from .schedule import Schedule, ScheduleError

Duration = Callable[[int, Action], float]
Latency = Callable[[Action, Action], float]
Gap = Callable[[int, Action], float]
Edge = tuple[Action, bool]  # (action waited for, crosses ranks)


@dataclass(frozen=True)
class Timeline:
    rows: tuple[tuple[int, Action, float, float], ...]  # (rank, action, start, end), by rank then order

    @property
    def makespan(self) -> float:
        return max((end for _, _, _, end in self.rows), default=0.0) - min(
            (start for _, _, start, _ in self.rows), default=0.0
        )

    def busy(self, rank: int) -> float:
        """Time the rank spends in compute actions (comm actions are waiting, not work)."""
        return sum(end - start for r, a, start, end in self.rows if r == rank and a.kind.is_compute)


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


def simulate(
    schedule: Schedule, duration: Duration | None = None, latency: Latency | None = None, gap: Gap | None = None
) -> Timeline:
    """Replay `schedule`; by default every compute action takes 1 unit, comm 0, no latency, no gaps."""
    duration = duration or _unit
    edges = [[_edges(schedule, r, a) for a in order] for r, order in enumerate(schedule.orders)]
    ends: dict[Action, float] = {}
    rows: list[list[tuple[int, Action, float, float]]] = [[] for _ in schedule.orders]
    position = [0] * schedule.p
    free = [0.0] * schedule.p
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(schedule.orders):
            k = position[r]
            while k < len(order):
                action = order[k]
                ready = free[r]
                for dep, crosses in edges[r][k]:
                    end = ends.get(dep)
                    if end is None:
                        break
                    if crosses and latency is not None:
                        end += latency(dep, action)
                    ready = max(ready, end)
                else:
                    start = ready + (gap(r, action) if gap is not None else 0.0)
                    free[r] = ends[action] = start + duration(r, action)
                    rows[r].append((r, action, start, free[r]))
                    k += 1
                    progress = True
                    continue
                break
            position[r] = k
    if any(k < len(order) for k, order in zip(position, schedule.orders)):
        raise _deadlock(schedule, position, edges, ends)
    return Timeline(tuple(row for rank_rows in rows for row in rank_rows))


def _deadlock(schedule: Schedule, position: list[int], edges, ends: dict[Action, float]) -> ScheduleError:
    known = {action for order in schedule.orders for action in order}
    stuck = []
    for r, k in enumerate(position):
        if k == len(schedule.orders[r]):
            continue
        waiting = next(dep for dep, _ in edges[r][k] if dep not in ends)
        why = "which is not in the schedule" if waiting not in known else "which never runs"
        stuck.append((r, k, f"rank {r} step {k} ({schedule.orders[r][k]}) waits for {waiting}, {why}"))
    lines = "; ".join(text for _, _, text in stuck)
    marks = {(r, k) for r, k, _ in stuck}
    return ScheduleError(f"{schedule.name}: deadlock: {lines}\n{grid(schedule, marks=marks)}")
