"""One run's measurements carried to another geometry: p ranks holding n' stages instead of the run's n,
with a backward split into I and W where the run ran B (or the other way round), so that
analysis.attribution.predict replays any schedule at the run's p from one run.

Stages split the model's layers evenly, in order, whatever their placement: stage c of n' holds the
layers of [c/n', (c+1)/n'), so its share of the run's stage s is their overlap times n. A compute
action's inputs (work and host time) are the sum of its stages' shares of theirs: a chunk of half a
stage takes half its time. Its kind comes from the same kind where the run measured it, else B splits
into I and W in the ratio of their unit times (runners.schedules.bubble.UNIT_TIMES) and I + W make B.
A hop carries one activation whatever the stage: its inputs are the mean of the run's hops of that kind
on the stages it overlaps, else on every stage. The calibration's stages are carried the same way;
each rank's tail and the transport stay as measured. On the run's own geometry every measured key is
its own only source, with weight 1: its values are carried unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from fractions import Fraction

import polars as pl

from analysis.attribution.model import Key, StepModel
from analysis.attribution.own_step import INPUT_COLUMNS, OwnSteps
from analysis.attribution.replay import Inputs
from runners.schedules import COMM_KINDS, COMPUTE_KINDS, Kind
from runners.schedules.bubble import UNIT_TIMES

CALIBRATION_KEYS = ("calibration", "calibration_by_rows", "calibration_by_rows_samples_ms")


def stage_shares(n_source: int, n_target: int) -> dict[int, list[tuple[int, Fraction]]]:
    """Target stage -> [(source stage, the share of the source stage's layers it holds)]."""
    shares: dict[int, list[tuple[int, Fraction]]] = {}
    for c in range(n_target):
        low, high = Fraction(c, n_target), Fraction(c + 1, n_target)
        for s in range(n_source):
            overlap = min(high, Fraction(s + 1, n_source)) - max(low, Fraction(s, n_source))
            if overlap > 0:
                shares.setdefault(c, []).append((s, overlap * n_source))
    return shares


def _kind_sources(kind: str, measured: set[str]) -> list[tuple[str, float]]:
    """The measured kinds (with weights) that make `kind` on a stage that measured `measured`."""
    if kind in measured:
        return [(kind, 1.0)]
    if kind == Kind.B.value and {Kind.I.value, Kind.W.value} <= measured:
        return [(Kind.I.value, 1.0), (Kind.W.value, 1.0)]
    if kind in (Kind.I.value, Kind.W.value) and Kind.B.value in measured:
        return [(Kind.B.value, UNIT_TIMES[Kind(kind)] / UNIT_TIMES[Kind.B])]
    return []


@dataclass(frozen=True)
class Projection:
    """The run's (stage, kind) keys each target (stage, kind) is made of, with their weights."""

    sources: dict[Key, list[tuple[Key, float]]]
    shares: dict[int, list[tuple[int, Fraction]]]  # stage_shares: target stage -> its run stages' shares

    @property
    def own_geometry(self) -> bool:
        """The run's own stages: every measured key is its own source."""
        return all(parts == [(c, 1)] for c, parts in self.shares.items())

    def inputs(self, measured: dict[Key, Inputs]) -> dict[Key, Inputs]:
        """Each target key's inputs: the weighted sum of its sources' (`measured`: per run key)."""
        return {
            key: Inputs(
                *(sum(w * getattr(measured[src], f.name) for src, w in parts) for f in fields(Inputs))
            )
            for key, parts in self.sources.items()
        }

    def model(self, model: StepModel) -> StepModel:
        """The typical step's inputs per target key (the executed orders kept on the run's own geometry)."""
        return replace(
            model, kinds=self.inputs(model.kinds), orders=model.orders if self.own_geometry else ()
        )

    def own(self, own: OwnSteps, model: StepModel) -> OwnSteps:
        """Every analysed cell of each target key's largest source, scaled to the target key's typical
        inputs (the resampled interval's pools): the measured spread, carried."""
        typical = self.inputs(model.kinds)
        frames = []
        for (stage, kind), parts in self.sources.items():
            (src_stage, src_kind), _ = max(parts, key=lambda part: part[1])
            base = model.kinds[(src_stage, src_kind)]
            ratio = {c: getattr(typical[(stage, kind)], c) / (getattr(base, c) or 1.0) for c in INPUT_COLUMNS}
            rows = own.actions.filter((pl.col("stage") == src_stage) & (pl.col("kind") == src_kind))
            frames.append(
                rows.with_columns(
                    pl.lit(stage, pl.Int64).alias("stage"),
                    pl.lit(kind).alias("kind"),
                    *((pl.col(c) * ratio[c]).alias(c) for c in INPUT_COLUMNS),
                )
            )
        return own._replace(actions=pl.concat(frames) if frames else own.actions.clear())

    def calibrated(self, source: dict, target: dict, rows: int) -> Projection:
        """The work of each target compute key weighted by what the runner timed (run.json
        advice_calibration's calibration_by_rows on the run's stages, `source`, and on the target's,
        `target`) instead of by layer shares and unit times: its sources' weights scaled so that their
        sum of the source times at `rows` rows makes the target's time there."""

        def ms(entries: dict, key: Key) -> float:
            return entries[str(key[0])][str(rows)][f"{key[1]}_ms"]

        sources = dict(self.sources)
        for key, parts in self.sources.items():
            if key[1] in COMPUTE_KINDS:
                made = sum(weight * ms(source, src) for src, weight in parts)
                sources[key] = [(src, weight * ms(target, key) / made) for src, weight in parts]
        return replace(self, sources=sources)

    def config(self, config: dict, measured: dict | None = None) -> dict:
        """run.json with each calibration's stages carried to the target's (B also from I + W), or
        replaced by what the runner timed on them (`measured`: run.json advice_calibration at the
        target's v)."""
        if measured is not None:
            by_rows = measured["calibration_by_rows"]
            total = str(sum((config.get("dims") or {}).get("microbatch_rows") or []))
            return config | {
                "calibration": {stage: sizes[total] for stage, sizes in by_rows.items() if total in sizes},
                "calibration_by_rows": by_rows,
                "calibration_by_rows_samples_ms": measured["calibration_by_rows_samples_ms"],
            }
        carried = {}
        for name in CALIBRATION_KEYS:
            entries = config.get(name) or {}
            if all(str(s) in entries for parts in self.shares.values() for s, _ in parts):
                carried[name] = {
                    str(c): _combine([(entries[str(s)], w) for s, w in parts])
                    for c, parts in self.shares.items()
                }
        return config | carried


def _combine(weighted: list[tuple[dict, Fraction]]):
    """The weighted sum of calibration entries of one shape: {rows: {kind_ms: value or samples}} or
    {kind_ms: ...}; a sample list sums element by element; B_ms from I_ms + W_ms where missing."""
    first = weighted[0][0]
    if isinstance(first, list):
        return [
            sum(float(w) * values[i] for values, w in weighted)
            for i in range(min(len(v) for v, _ in weighted))
        ]
    if not isinstance(first, dict):
        return sum(float(w) * value for value, w in weighted)
    keys = set.intersection(*(set(entry) for entry, _ in weighted))
    combined = {key: _combine([(entry[key], w) for entry, w in weighted]) for key in keys}
    if "B_ms" not in combined and {"I_ms", "W_ms"} <= set(combined):
        pair = combined["I_ms"], combined["W_ms"]
        combined["B_ms"] = [a + b for a, b in zip(*pair)] if isinstance(pair[0], list) else sum(pair)
    return combined


def projection(kinds: dict[Key, Inputs], n_source: int, n_target: int) -> Projection:
    """How the run's typical inputs per (stage, kind) (`kinds`, on n_source stages) make a geometry of
    n_target stages, every compute kind on every stage where the run's kinds allow it."""
    measured: dict[int, set[str]] = {}
    for stage, kind in kinds:
        measured.setdefault(stage, set()).add(kind)
    shares = stage_shares(n_source, n_target)
    sources: dict[Key, list[tuple[Key, float]]] = {}
    for c, parts in shares.items():
        for kind in COMPUTE_KINDS:
            made = [(s, _kind_sources(kind, measured.get(s, set())), share) for s, share in parts]
            if all(kinds_of for _, kinds_of, _ in made):  # every overlapped stage can make it
                sources[(c, kind)] = [
                    ((s, k), float(share) * w) for s, kinds_of, share in made for k, w in kinds_of
                ]
        for kind in COMM_KINDS:
            near = [(s, kind) for s, _ in parts if (s, kind) in kinds]
            hops = near or [key for key in kinds if key[1] == kind]
            if hops:
                sources[(c, kind)] = [(hop, 1.0 / len(hops)) for hop in hops]
    return Projection(sources, shares)
