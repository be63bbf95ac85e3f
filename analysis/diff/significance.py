"""Whether a figure changed by more than the two runs' own spread over their analysed steps
(docs/numbers.md#diff-significance).

The difference of the medians (B's - A's) and its bootstrap percentile interval: each run's steps are
resampled with replacement, RESAMPLES times, from a generator seeded with SEED (the same pair of runs
gives the same interval), and the interval is the middle CONFIDENCE of the resampled differences. The
change is significant when the interval excludes 0 by more than the figure's resolution. It assumes a
run's steps are exchangeable (no warm-up or drift within the run) and that two runs of one configuration
differ only as much as their steps do; a figure with one value per run, or a run with fewer than
MIN_STEPS steps, has no spread to measure and is never significant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.diff.figures import BYTES, FRACTION, MS

CONFIDENCE = 0.99  # a diff tests some 40 figures at once: at 95% a third of A/A pairs flagged one
RESAMPLES = 2000
SEED = 0
MIN_STEPS = 2  # a bootstrap of one step is that step: no spread
# Below these a difference is rounding, not a change: the traces' 1 ns, a bubble's float error, a byte.
RESOLUTION = {MS: 1e-6, FRACTION: 1e-9, BYTES: 0.5}
TEST = (
    f"bootstrap {CONFIDENCE:.0%} percentile interval of the difference of medians over the analysed steps "
    f"({RESAMPLES} resamples, seed {SEED}); significant when it excludes 0"
)
TOO_FEW_STEPS = f"a run with fewer than {MIN_STEPS} analysed steps: its spread is unknown"


@dataclass(frozen=True)
class Outcome:
    a: float  # A's median over its steps (its one value where it has one)
    b: float
    low: float | None  # the interval of b - a; None: untested (`why`)
    high: float | None
    significant: bool
    why: str | None  # why it cannot be called significant, where it cannot


def _medians(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
    return np.median(values[picks], axis=1)


def compare(a: tuple[float, ...], b: tuple[float, ...], unit: str, once: str | None = None) -> Outcome:
    """B's figure against A's, each given per step; `once`: why either run has one value of it (then
    untested)."""
    first, second = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    middle_a, middle_b = float(np.median(first)), float(np.median(second))
    if once is not None:
        return Outcome(middle_a, middle_b, None, None, False, once)
    if min(len(first), len(second)) < MIN_STEPS:
        return Outcome(middle_a, middle_b, None, None, False, TOO_FEW_STEPS)
    rng = np.random.default_rng(SEED)
    differences = _medians(second, rng) - _medians(first, rng)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = (float(x) for x in np.percentile(differences, [tail, 100 - tail]))
    resolution = RESOLUTION[unit]
    return Outcome(middle_a, middle_b, low, high, low > resolution or high < -resolution, None)
