"""The V-shaped schedules, zbv and dualpipev: two stages per rank, rank r holding stages r and 2p-1-r.

Both are torch.distributed.pipelining's (ScheduleZBVZeroBubble, ScheduleDualPipeV), rewritten here as
data so the analysis can replay them and the tests can check them against torch's own tables. In
torch's DualPipeV a forward and a full backward of two microbatches run back to back inside one fused
OVERLAP_F_B action; here they are the two actions they are, in the order torch runs them (F, then B).
"""

from __future__ import annotations

from collections import Counter

from .actions import Action, Kind


class _Order:
    """One rank's order being written: each stage's forwards and backwards take microbatches in turn,
    and a W runs the weight gradient of the oldest I still owed one."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self._next: Counter[tuple[int, str]] = Counter()
        self._owed: list[Action] = []  # I's awaiting their W, oldest first

    def forward(self, stage: int) -> None:
        self.actions.append(Action(stage, Kind.F, self._take(stage, "F")))

    def backward(self, stage: int, split: bool = True) -> None:
        """I (its W comes later) when split, else the full B."""
        action = Action(stage, Kind.I if split else Kind.B, self._take(stage, "B"))
        self.actions.append(action)
        if split:
            self._owed.append(action)

    def weight(self, stage: int | None = None) -> None:
        """The W of the oldest owed I (of `stage`, if given); nothing if none is owed."""
        owed = next((a for a in self._owed if stage is None or a.stage == stage), None)
        if owed is not None:
            self._owed.remove(owed)
            self.actions.append(Action(owed.stage, Kind.W, owed.microbatch))

    def count(self, stage: int, kind: str) -> int:
        """How many forwards ("F") or backwards ("B", I or B) of `stage` are written so far."""
        return self._next[(stage, kind)]

    def owes(self, stage: int) -> bool:
        return any(a.stage == stage for a in self._owed)

    def _take(self, stage: int, kind: str) -> int:
        self._next[(stage, kind)] += 1
        return self._next[(stage, kind)] - 1


def _zbv_rank(p: int, m: int, rank: int) -> tuple[Action, ...]:
    """torch's ZBV order: planned for at least 2p-1 microbatches (the steady state's need), the
    surplus dropped afterwards, as torch does."""
    planned = max(2 * p - 1, m)
    down, up = rank, 2 * p - 1 - rank
    order = _Order()
    for _ in range(2 * (p - rank) - 1):
        order.forward(down)
    for _ in range(rank):
        order.forward(up)
        order.forward(down)
    for _ in range(p - rank):
        order.forward(up)
        order.backward(up)
        order.weight(up)
    while order.count(up, "F") < order.count(down, "F") or order.count(down, "F") < planned:
        if order.count(down, "F") < planned:
            order.forward(down)
        order.backward(down)
        order.weight(down)
        order.forward(up)
        order.backward(up)
        order.weight(up)
    for _ in range(rank):
        order.backward(down)
        order.backward(up)
    for _ in range(p - rank):
        order.backward(down)
        order.weight(down)
    for stage in (up, down):
        while order.owes(stage):
            order.weight(stage)
    return tuple(a for a in order.actions if a.microbatch < m)


def zbv(p: int, m: int, v: int = 2) -> tuple[tuple[Action, ...], ...]:
    """Zero-bubble ZB-V (Qi et al., section 6) as torch's ScheduleZBVZeroBubble orders it."""
    return tuple(_zbv_rank(p, m, r) for r in range(p))


def _dualpipev_rank(p: int, m: int, rank: int) -> tuple[Action, ...]:
    """torch's DualPipeV order (after DeepSeek's DualPipe): its eight phases, each a loop below."""
    down, up = rank, 2 * p - 1 - rank
    order = _Order()
    for _ in range(2 * (p - rank - 1)):
        order.forward(down)
    for _ in range(rank + 1):
        order.forward(down)
        order.forward(up)
    for _ in range(p - rank - 1):
        order.backward(up)
        order.weight()
        order.forward(up)
    for _ in range(m - 2 * p + rank + 1):  # the steady state: torch fuses each F with the B after it
        order.forward(down)
        order.backward(up, split=False)
        order.forward(up)
        order.backward(down, split=False)
    for _ in range(p - rank - 1):
        order.backward(up, split=False)
        order.forward(up)
        order.backward(down, split=False)
    split = False  # the second half of the last backwards is split, to fill the cool-down with W's
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        order.backward(up, split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        order.backward(down, split)
    for _ in range(p - rank - 1):
        order.weight()
        order.backward(down, split)
    for _ in range(rank + 1):
        order.weight()
    return tuple(order.actions)


def dualpipev(p: int, m: int, v: int = 2) -> tuple[tuple[Action, ...], ...]:
    """DualPipeV as torch's ScheduleDualPipeV orders it (fused F+B pairs written as F then B)."""
    return tuple(_dualpipev_rank(p, m, r) for r in range(p))
