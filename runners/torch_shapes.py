"""Which torch.distributed.pipelining class runs each schedule name, and which requests it can run.

Torch-free, so the launcher can refuse a bad `--engine torch` request before any process starts. The
names shared with the native engine keep the native checks (same split, same m); torch's zero-bubble
classes add their own: `zb` is ScheduleInterleavedZeroBubble (ZB1P, any v), and `zbv`/`dualpipev`
exist for this engine only, with exactly two stages per rank placed in a V (rank r holds stages r and
2p-1-r), not round-robin.
"""

from __future__ import annotations

from runners.schedules import ScheduleError, build

TORCH_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
MULTI_STAGE = frozenset({"interleaved", "zb", "zbv", "dualpipev"})  # classes taking a list of stages
V_SHAPED = frozenset({"zbv", "dualpipev"})


def check_torch_request(name: str, p: int, m: int, v: int) -> None:
    """Raise a one-line ScheduleError for a request torch's class for `name` would refuse."""
    if name not in TORCH_CLASSES:
        raise ScheduleError(f"unknown schedule {name!r} for engine torch; known: {', '.join(TORCH_CLASSES)}")
    if name in V_SHAPED:
        if v != 2:
            raise ScheduleError(f"{name}: v={v} but {name} places exactly two stages per rank (use --v 2)")
        if name == "dualpipev" and m < 2 * p:
            raise ScheduleError(f"dualpipev: m={m} must be at least the {2 * p} stages")
        return
    if name == "zb":
        rounds = max(1, m // p)  # torch's flexible rounds: m must split into equal rounds
        if m % rounds:
            raise ScheduleError(f"zb: m={m} does not split into {rounds} equal rounds of about p={p}")
        return
    build(name, p, m, v)


def stage_ids(name: str, p: int, v: int, rank: int) -> tuple[int, ...]:
    """The global stages `rank` holds under torch's placement for `name`."""
    if name in V_SHAPED:
        return (rank, 2 * p - 1 - rank)
    return tuple(range(rank, p * v, p))
