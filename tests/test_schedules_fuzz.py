"""Random requests over the whole range (p 1..8, m 1..32, v 1..4): each is refused in one line or builds a
schedule that validates lowered, keeps its unit-time span, and replays the same with or without comm.

FUZZ_EXAMPLES sets the number of requests (small by default; `make fuzz` raises it).
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from runners.schedules import SCHEDULES, Kind, ScheduleError, build, in_flight, lower, simulate, validate

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))


def _unit_span(name: str, p: int, m: int, v: int) -> int | None:
    if name == "zb":
        return 3 * m + p - 1 if v == 1 else 3 * v * m + 2 * (p - 1)
    if name == "zbv":  # 6m units per rank, and the last rank waits p-1 for its first input, once m
        # reaches the 2p-1 microbatches torch plans its steady state for; below, the dropped surplus idles
        return 6 * m + p - 1 if m >= 2 * p - 1 else None
    if name == "dualpipev":  # no closed form here; its order is checked against torch's own
        return None
    return 2 * (v * m + p - 1)  # gpipe and 1f1b have v = 1


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    name=st.sampled_from(sorted(SCHEDULES)),
    p=st.integers(0, 8),
    m=st.integers(0, 32),
    v=st.integers(0, 4),
    seed=st.integers(1, 1000),
)
def test_fuzz_requests(name, p, m, v, seed):
    try:
        schedule = build(name, p, m, v)
    except ScheduleError as refused:
        assert "\n" not in str(refused) and name in str(refused)
        return
    lowered = lower(schedule)
    validate(lowered)
    if _unit_span(name, p, m, v) is not None:
        assert simulate(schedule).makespan == _unit_span(name, p, m, v)
    assert all(counts[-1] == 0 for counts in in_flight(schedule))

    def duration(_rank, action):  # a different cost per (stage, kind), deterministic per example
        return (
            0.0
            if action.kind.is_comm
            else 1 + (seed * (action.stage + 1) * (1 + "FBIW".index(action.kind.value))) % 7
        )

    def latency(_src, _dst):
        return seed % 3 * 0.5

    assert simulate(lowered, duration, latency).makespan == simulate(schedule, duration, latency).makespan
    assert sum(a.kind is Kind.F for order in schedule.orders for a in order) == m * schedule.n_stages
