"""Two analysed runs' figures matched and compared (docs/numbers.md#diff): whole-step figures always,
rank to rank where the layouts match (the same ranks holding the same stages), stage to stage where
only p matches (one stage per rank: the summary's pipeline's rank of each stage), the critical path per
stage where p and v match and as totals otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.diff import figures
from analysis.diff.figures import FRACTION, MS, Figure
from analysis.diff.significance import compare
from analysis.diff.stored import StoredChange
from analysis.results import Analysis
from analysis.vocabulary import Level

UNIT_ORDER = (MS, FRACTION, figures.BYTES)  # ms first: the step's time is what a change costs


class Change(StoredChange, frozen=True):
    """One figure of A against B (docs/numbers.md#diff): what B's run directory keeps of it, ordered by
    the change it supports."""

    @property
    def supported(self) -> float:
        """The least change the interval supports: its bound nearest 0 (0 when not significant)."""
        if not self.significant or self.low is None or self.high is None:
            return 0.0
        return min(abs(self.low), abs(self.high))


@dataclass(frozen=True)
class Diff:
    a: Analysis
    b: Analysis
    changes: list[Change]  # significant first, largest first
    notes: list[str]  # what could not be matched, and why


def _layout(analysis: Analysis) -> dict[int, tuple[int, ...]]:
    return {entry.rank: tuple(entry.stage_ids) for entry in analysis.summary.ranks}


def _rank_figures(a: Analysis, b: Analysis, notes: list[str]) -> list[tuple[Figure, Figure]]:
    """Each rank's figures paired: by rank, or by stage (rank None), or none."""
    found_a, found_b = figures.per_rank(a), figures.per_rank(b)
    layout = _layout(a)
    if layout == _layout(b):
        keys = {rank: (rank, stages[0] if len(stages) == 1 else None) for rank, stages in layout.items()}
        pairs = {rank: (rank, rank) for rank in layout}
    elif a.summary.p == b.summary.p and a.summary.v == b.summary.v == 1:
        notes.append("the layouts differ: ranks matched by stage in each run's slowest pipeline")
        ranks_a, ranks_b = figures.pipeline_ranks(a.summary), figures.pipeline_ranks(b.summary)
        keys = {stage: (None, stage) for stage in range(a.summary.p)}
        pairs = {stage: (ranks_a[stage], ranks_b[stage]) for stage in range(a.summary.p)}
    else:
        notes.append("p or v differs: no rank or stage of A is one of B's, whole-step figures only")
        return []
    matched = []
    for key, (rank_a, rank_b) in pairs.items():
        rank, stage = keys[key]
        of_b = {figure.name: figure for figure in found_b.get(rank_b, [])}
        for figure in found_a.get(rank_a, []):
            if figure.name in of_b:
                matched.append((_at(figure, rank, stage), _at(of_b[figure.name], rank, stage)))
    return matched


def _at(figure: Figure, rank: int | None, stage: int | None) -> Figure:
    return Figure(figure.name, rank, stage, figure.unit, figure.values, figure.once)


def _by_key(found: list[Figure]) -> dict[tuple, Figure]:
    return {(figure.name, figure.rank, figure.stage): figure for figure in found}


def _critical_pairs(a: Analysis, b: Analysis) -> list[tuple[Figure, Figure]]:
    """The critical path's parts (per stage where p and v match) in either run: 0 in the other."""
    by_stage = (a.summary.p, a.summary.v) == (b.summary.p, b.summary.v)
    found_a, found_b = (
        _by_key(figures.critical_path(a, by_stage)),
        _by_key(figures.critical_path(b, by_stage)),
    )
    steps_a, steps_b = (analysis.critical["step"].n_unique() for analysis in (a, b))
    return [
        (
            found_a[key] if key in found_a else figures.none_of(found_b[key], steps_a),
            found_b[key] if key in found_b else figures.none_of(found_a[key], steps_b),
        )
        for key in found_a | found_b
    ]


def _pairs(a: Analysis, b: Analysis, notes: list[str]) -> list[tuple[Figure, Figure]]:
    whole_b = _by_key(figures.whole_step(b))
    pairs = [
        (figure, whole_b[key]) for key, figure in _by_key(figures.whole_step(a)).items() if key in whole_b
    ]
    return pairs + _critical_pairs(a, b) + _rank_figures(a, b, notes)


def configuration(analysis: Analysis) -> tuple:
    summary = analysis.summary
    return summary.schedule, summary.p, summary.m, summary.v


# Where an expected change comes from, by the figure it goes with (docs/numbers.md#diff-expected).
EXPECTED_FROM = {"bubble_measured": "formula", figures.STEP_TIME: "model"}


def _predicted_step(a: Analysis, b: Analysis) -> float | None:
    """The step's change A's model predicts at B's m (A's predictions.json), where only m differs."""
    first, second = a.summary, b.summary
    if (first.schedule, first.p, first.v) != (second.schedule, second.p, second.v) or a.predictions is None:
        return None
    by_m = {prediction.m: prediction.step_time_ms for prediction in a.predictions}
    return by_m[second.m] - by_m[first.m] if first.m in by_m and second.m in by_m else None


def _expected(a: Analysis, b: Analysis, name: str) -> float | None:
    """The change the theory expects where the configurations differ: the formula's of the bubble, the
    model's of the step (docs/numbers.md#diff-expected)."""
    if configuration(a) == configuration(b):
        return None
    if name == "bubble_measured":
        return b.summary.bubble_formula - a.summary.bubble_formula
    return _predicted_step(a, b) if name == figures.STEP_TIME else None


def order(change: Change) -> tuple:
    """Significant first; then ms, fractions, bytes; the largest first: a significant change by the
    least the interval supports, the others by their size; at one size, a rank's figure first (it says
    where the time went)."""
    size = change.supported if change.significant else abs(change.delta)
    return (not change.significant, UNIT_ORDER.index(change.unit), -size, change.rank is None)


def _caveats(a: Analysis, b: Analysis) -> list[str]:
    """What a reader of the changes must know of each run: its low trust, its flags (analysis.caveats)."""
    notes = []
    for side, analysis in (("A", a), ("B", b)):
        trust, flags = analysis.summary.trust, analysis.summary.flags
        if trust is not None and trust.level == Level.LOW:
            notes.append(f"{side}'s trust is low: {'; '.join(trust.reasons)}")
        if flags:
            notes.append(f"{side} is flagged {', '.join(flags)}: its steps may not be a steady sample")
    return notes


def diff(a: Analysis, b: Analysis) -> Diff:
    """Every figure A and B share, compared."""
    notes = _caveats(a, b)
    changes = []
    for first, second in _pairs(a, b, notes):
        outcome = compare(first.values, second.values, first.unit, first.once or second.once)
        expected = _expected(a, b, first.name)
        changes.append(
            Change(
                first.name,
                first.rank,
                first.stage,
                first.unit,
                outcome.a,
                outcome.b,
                outcome.low,
                outcome.high,
                outcome.significant,
                outcome.why,
                expected,
            )
        )
    return Diff(a, b, sorted(changes, key=order), notes)
