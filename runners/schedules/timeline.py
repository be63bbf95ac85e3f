"""The replay's result: when each action started and ended, per rank, in schedule time units."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .actions import Action


@dataclass(frozen=True)
class Timeline:
    rows: tuple[tuple[int, Action, float, float], ...]  # (rank, action, start, end), by rank then order

    @cached_property
    def makespan(self) -> float:
        """The step's length: the replay starts every rank at 0, so the last end (gaps included)."""
        return max((end for _, _, _, end in self.rows), default=0.0)

    @cached_property
    def _busy(self) -> dict[int, float]:
        busy: dict[int, float] = {}
        for rank, action, start, end in self.rows:
            if action.kind.is_compute:
                busy[rank] = busy.get(rank, 0.0) + end - start
        return busy

    def busy(self, rank: int) -> float:
        """Time the rank spends in compute actions (comm actions are waiting, not work)."""
        return self._busy.get(rank, 0.0)
