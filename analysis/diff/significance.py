"""Whether a figure changed by more than the two runs' own spread over their analysed steps
(docs/numbers.md#diff-significance).

The difference of the medians (B's - A's), its bootstrap percentile interval, and a permutation test
that decides: under "no change" the two runs' steps are exchangeable, so every way of splitting the
pooled steps into groups of A's and B's sizes is as likely as the one observed. p is the share of splits
whose rank statistic is at least as extreme as the observed one's (Mann-Whitney's: every split where
there are at most EXACT_SPLITS, else PERMUTATIONS seeded shuffles), and the change is significant when p is at
most 1 - CONFIDENCE and the difference exceeds the figure's resolution. The bootstrap shows how large
the change is (each run's steps resampled RESAMPLES times, the middle CONFIDENCE of the differences); it
does not decide, because with a few steps a side it calls one run's steps all above the other's beyond
noise though that happens by chance in 1 pooled split of 10 (3 steps each). Few steps can never reach
the level: with 3 and 3 the rarest split has p = 0.1, so nothing is called significant and `why` says
how many steps would do. It assumes that a run's steps are exchangeable (no warm-up or drift within the
run) and that two runs of one configuration differ only as much as their steps do; a figure with one
value per run, or a run with fewer than MIN_STEPS steps, has no spread to measure and is never
significant.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from analysis.diff.figures import BYTES, FRACTION, MS

CONFIDENCE = 0.99  # a diff tests some 40 figures at once: at 95% a third of A/A pairs flagged one
RESAMPLES = 2000
PERMUTATIONS = 2000
EXACT_SPLITS = 20_000  # up to 8 and 8 steps: every split of the pooled steps
SEED = 0
MIN_STEPS = 2  # a bootstrap of one step is that step: no spread
# Below these a difference is rounding, not a change: the traces' 1 ns, a bubble's float error, a byte.
RESOLUTION = {MS: 1e-6, FRACTION: 1e-9, BYTES: 0.5}
TEST = (
    f"permutation (Mann-Whitney) test over the analysed steps (significant at p <= "
    f"{1 - CONFIDENCE:.2f}); interval: bootstrap {CONFIDENCE:.0%} percentile ({RESAMPLES} resamples, seed {SEED})"
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


def _splits(total: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the pooled steps taken as A's, one row per split: every split, or seeded shuffles."""
    if math.comb(total, size) <= EXACT_SPLITS:
        return np.array(list(itertools.combinations(range(total), size)))
    return np.argsort(rng.random((PERMUTATIONS, total)), axis=1)[:, :size]


def permutation_p(first: np.ndarray, second: np.ndarray, rng: np.random.Generator) -> float:
    """The share of splits of the pooled steps whose Mann-Whitney statistic (over each pair of a B step
    and an A step: +1 where B's is larger, -1 where smaller) is at least as far from 0 as the observed
    split's, which is one of them. A rank statistic, not the difference of medians: a median hardly moves
    when one step changes sides, so nearly every split would look as extreme as the observed one."""
    pooled = np.concatenate([first, second])
    signs = np.sign(pooled[:, None] - pooled[None, :])
    taken = _splits(len(pooled), len(first), rng)
    as_a = np.zeros((len(taken), len(pooled)))
    np.put_along_axis(as_a, taken, 1.0, axis=1)
    statistic = np.abs(np.einsum("ki,ij,kj->k", 1.0 - as_a, signs, as_a))
    observed = abs(float(np.sign(second[:, None] - first[None, :]).sum()))
    at_least = int(np.count_nonzero(statistic >= observed))
    exact = math.comb(len(pooled), len(first)) <= EXACT_SPLITS
    return at_least / len(taken) if exact else (at_least + 1) / (len(taken) + 1)


def _too_few(a_steps: int, b_steps: int) -> str | None:
    """Why no split of these many steps can be rare enough, where none can (the two extreme splits are
    the rarest: 2 of all)."""
    rarest = 2 / math.comb(a_steps + b_steps, a_steps)
    if rarest <= 1 - CONFIDENCE:
        return None
    enough = next(n for n in itertools.count(2) if 2 / math.comb(2 * n, n) <= 1 - CONFIDENCE)
    return (
        f"{a_steps} and {b_steps} steps: no split of them is rarer than p = {rarest:.2g}, so none can be "
        f"significant at {CONFIDENCE:.0%} ({enough} steps each can: STEPS={enough})"
    )


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
    too_few = _too_few(len(first), len(second))
    if too_few is not None or abs(middle_b - middle_a) <= RESOLUTION[unit]:
        return Outcome(middle_a, middle_b, low, high, False, too_few)
    significant = permutation_p(first, second, rng) <= 1 - CONFIDENCE
    return Outcome(middle_a, middle_b, low, high, significant, None)
