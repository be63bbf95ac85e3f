"""Repeated measurements -> median with min and max, and whether the spread allows a conclusion.

This machine is shared and noisy, so a figure is never one sample: it is the median of repeats with
its range, and a comparison against a target is called only when the whole range is on one side.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

WIDE_SPREAD = 0.25  # (max - min) / median above this: too noisy to read the median alone


@dataclass(frozen=True)
class Stats:
    median: float
    min: float
    max: float
    n: int

    @property
    def spread(self) -> float:
        """Range relative to the median (0 for one sample)."""
        return (self.max - self.min) / abs(self.median) if self.median else 0.0

    @property
    def too_wide(self) -> bool:
        return self.spread > WIDE_SPREAD

    def to_json(self) -> dict:
        return asdict(self) | {"spread": self.spread, "too_wide": self.too_wide}

    def text(self, digits: int = 3) -> str:
        """ "1.23 (1.10-1.40)"; a single sample is just the number; a wide range is flagged."""
        if self.n == 1:
            return f"{self.median:.{digits}f}"
        flag = " wide" if self.too_wide else ""
        return f"{self.median:.{digits}f} ({self.min:.{digits}f}-{self.max:.{digits}f}{flag})"


def stats(samples: list[float]) -> Stats:
    if not samples:
        raise ValueError("no samples")
    return Stats(statistics.median(samples), min(samples), max(samples), len(samples))


def verdict(figure: Stats, target: float, lower_is_better: bool = True) -> str:
    """'meets' / 'misses' when the whole range is on one side of the target, else 'inconclusive'.
    A single sample has no range to speak of; its verdict says so."""
    caveat = " (one sample)" if figure.n == 1 else ""
    good, bad = (
        (figure.max <= target, figure.min > target)
        if lower_is_better
        else (figure.min >= target, figure.max < target)
    )
    if good:
        return "meets" + caveat
    if bad:
        return "misses" + caveat
    return "inconclusive (range straddles the target)"
