"""The bubble by schedule geometry alone: the executed order replayed at unit times.

One rule for every order: F takes 1 unit, B 2, I and W 1 each (a split backward), communication none;
the bubble is the idle share of p ranks over the replay's span, 1 - sum of busy / (p * span). For
GPipe, 1F1B and interleaved 1F1B with v chunks this is (p-1)/(v*m+p-1); zero-bubble and custom orders
get their own geometry.
"""

from __future__ import annotations

from .actions import Action, Kind
from .schedule import Schedule
from .simulate import simulate

UNIT_TIMES = {Kind.F: 1.0, Kind.B: 2.0, Kind.I: 1.0, Kind.W: 1.0}


def unit_time(_rank: int, action: Action) -> float:
    """An action's length in the replay at unit times (communication takes none)."""
    return UNIT_TIMES.get(action.kind, 0.0)


def bubble_formula(schedule: Schedule) -> float:
    """The idle fraction of the step the schedule's order alone implies (0 for one rank)."""
    timeline = simulate(schedule, duration=unit_time)
    busy = sum(timeline.busy(rank) for rank in range(schedule.p))
    return 1 - busy / (schedule.p * timeline.makespan) if timeline.makespan else 0.0
