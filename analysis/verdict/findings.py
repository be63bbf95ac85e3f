"""The findings of a run: each a change a pipeline user can make, with its recoverable time from the
replay (analysis.verdict.removals, analysis.attribution.waterfall.gains), the evidence it rests on and,
where the model can replay the change, its predicted step with the interval the run's own step levels
give it (analysis.attribution.predict.step_levels; docs/numbers.md#verdict).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import polars as pl

from analysis.attribution.predict import step_levels
from analysis.attribution.reference import reference
from analysis.attribution.replay import replay
from analysis.attribution.waterfall import gains
from analysis.results import Analysis
from analysis.schema import Finding, Prediction
from analysis.verdict import balance
from analysis.verdict.removals import NS_PER_MS, Recovered, recovered
from analysis.vocabulary import STRAGGLER, Effect, GapClass, Part

SHOWN = 6  # findings kept, largest first


@dataclass(frozen=True)
class _Context:
    analysis: Analysis
    config: dict
    typical_ns: float
    levels: list[float]

    def interval(self, step_ns: float) -> dict[str, float]:
        """A predicted step with the interval the run's step levels give it, as Finding's fields."""
        levels = self.levels or [1.0]
        ms = step_ns / NS_PER_MS
        return {
            "predicted_step_ms": ms,
            "predicted_low_ms": ms * min(min(levels), 1.0),
            "predicted_high_ms": ms * max(max(levels), 1.0),
        }


def _pieces(context: _Context, effects: dict[str, float]) -> list[Finding]:
    """The host, transfer and tail effects, each with its gain ceiling and, as its change, the piece of
    it that recovers the most (analysis.verdict.removals)."""
    best: dict[str, Recovered] = {}
    for found in recovered(context.analysis.schedule, context.analysis.model)[1]:
        best.setdefault(found.removal.effect, found)
    return [
        _piece_finding(context, effects[effect], found) for effect, found in best.items() if effect in effects
    ]


def _piece_finding(context: _Context, gain_ns: float, found: Recovered) -> Finding:
    r, piece = found.removal, found.recoverable_ns / NS_PER_MS
    evidence = (
        f"{r.what}: {r.held_ns / NS_PER_MS:.1f} ms a typical step, {piece:.1f} ms of it on the critical path; "
        f"all of {r.effect} {gain_ns / NS_PER_MS:.1f} ms"
    )
    actions = {
        Effect.HOST: f"cut {r.what}: host code inside or between actions (a sync, data loading, "
        "Python); on GPU, fewer and larger kernels or CUDA graphs",
        Effect.TRANSFER: f"overlap {r.what} with compute: post the receive early and send on a stream of its "
        "own (batch_isend_irecv), or send less",
        Effect.TAIL: f"shorten or overlap {r.what} (the optimizer step, data loading)",
        GapClass.DP_SYNC: "overlap the gradient all-reduce with the last backward (DDP's buckets; our runners: "
        "DP_OVERLAP=1)"
        if not context.config.get("dp_overlap")
        else "the all-reduce already overlaps the last backward: fewer or larger buckets, or a faster link",
    }
    return Finding(
        kind=r.kind,
        rank=r.rank,
        stage=r.stage,
        recoverable_ms=gain_ns / NS_PER_MS,
        action=actions[r.kind],
        evidence=evidence,
        **context.interval(context.typical_ns - found.recoverable_ns),
    )


def _slowest_by_step(analysis: Analysis) -> list[int]:
    """Each analysed step's stage with the most work (its own compute cells' busy time)."""
    per_stage = analysis.own.actions.group_by("step", "stage").agg(pl.col("work").sum())
    slowest = per_stage.sort("work", descending=True).group_by("step", maintain_order=True).first()
    return slowest.sort("step")["stage"].to_list()


def _imbalance(context: _Context, gain_ns: float) -> Finding:
    """The slowest stage and the move that evens the stages; a change only where that stage is the
    slowest in every analysed step (else the difference is the steps' noise, not the split)."""
    analysis = context.analysis
    typical = analysis.model.step()
    work = balance.stage_work(typical)
    slow = max(work, key=lambda stage: sum(work[stage].values()))
    totals = {stage: sum(kinds.values()) for stage, kinds in work.items()}
    by_step = _slowest_by_step(analysis)
    steady = all(stage == slow for stage in by_step)
    evidence = (
        "work a typical step by stage: "
        + ", ".join(f"{s}: {ns / NS_PER_MS:.1f} ms" for s, ns in totals.items())
        + f"; stage {slow} the slowest in {by_step.count(slow)} of {len(by_step)} steps"
    )
    if analysis.summary.waterfall_ms.small_batches is None:
        evidence += " (no isolated calibration: a stage's slowdown counts as its work)"
    base = {
        "kind": Effect.IMBALANCE,
        "rank": analysis.schedule.rank_of(slow),
        "stage": slow,
        "recoverable_ms": gain_ns / NS_PER_MS,
    }
    if not steady:
        return Finding(
            **base, action="none yet: the slowest stage changes from step to step", evidence=evidence
        )
    layers = balance.layers_of(context.config, len(work))
    if layers is None:
        excess = (totals[slow] - sum(totals.values()) / len(totals)) / NS_PER_MS
        action = f"move about {excess:.1f} ms a step of stage {slow}'s work to its neighbours"
        return Finding(
            **base, action=action, evidence=evidence, **context.interval(context.typical_ns - gain_ns)
        )
    split = balance.even_split(layers, [totals[s] for s in sorted(totals)])
    predicted = replay(analysis.schedule, balance.moved(typical, layers, split)).makespan
    action = f"{balance.moves(layers, split)} (layers {layers} -> {split})"
    return Finding(
        **base, action=action, evidence=f"{evidence}; layers {layers}", **context.interval(predicted)
    )


def _m_change(context: _Context, best: Prediction) -> dict:
    """Finding's fields for running predict's best m instead of the run's own."""
    bubble = context.analysis.summary.bubble_formula
    return {
        "action": f"run m={best.m} (the formula's bubble {bubble:.1%} -> {best.bubble_formula:.1%})",
        "predicted_step_ms": best.step_time_ms,
        "predicted_low_ms": best.step_time_low_ms,
        "predicted_high_ms": best.step_time_high_ms,
    }


def _bubble(context: _Context, best: Prediction | None) -> list[Finding]:
    """More microbatches, where predict finds a shorter step with them: the fill and drain they save,
    net of their smaller GEMMs (fewer microbatches are the small_gemm finding's change)."""
    m = context.analysis.schedule.m
    if best is None or best.m <= m:
        return []
    gain = context.typical_ns / NS_PER_MS - best.step_time_ms
    evidence = (
        f"predict: m={best.m} {best.step_time_ms:.1f} ms against the typical step at m={m} (`make advise` "
        "ranks other schedules and v too)"
    )
    return [
        Finding(
            kind=Part.BUBBLE,
            rank=None,
            stage=None,
            recoverable_ms=gain,
            evidence=evidence,
            **_m_change(context, best),
        )
    ]


def _small_gemm(context: _Context, gain_ns: float, best: Prediction | None) -> Finding:
    """The small-GEMM loss; where predict finds fewer, larger microbatches better, running them."""
    m = context.analysis.schedule.m
    evidence = f"the cells' work at their microbatch size against the full batch's share, m={m}"
    if best is not None and best.m < m:
        change = _m_change(context, best)
    elif best is not None:
        change = {"action": f"none in m: m={m} is predict's best (larger microbatches cost more bubble)"}
    else:
        change = {
            "action": "larger microbatches recover it but lengthen the bubble: `make predict` finds the best m"
        }
    return Finding(
        kind=Effect.SMALL_BATCHES,
        rank=None,
        stage=None,
        recoverable_ms=gain_ns / NS_PER_MS,
        evidence=evidence,
        **change,
    )


def _slowdown(context: _Context, gain_ns: float) -> Finding:
    ranks = context.analysis.summary.ranks
    slowdown = sum(r.slowdown_ms or 0.0 for r in ranks)
    waited = sum(r.cpu_contention_ms or 0.0 for r in ranks)
    if slowdown > 0 and waited >= slowdown / 2:
        action = (
            f"the machine, not your pipeline: the ranks waited {waited:.1f} ms for a core "
            "(cpu_contention); run P x DP <= cores, on a quiet machine"
        )
    else:
        action = "contention between ranks running together (memory, caches): no schedule change recovers it"
    return Finding(
        kind=Effect.INTERFERENCE,
        rank=None,
        stage=None,
        recoverable_ms=gain_ns / NS_PER_MS,
        action=action,
        evidence=f"slowdown {slowdown:.1f} ms, of it cpu_contention {waited:.1f} ms (the median step, all ranks)",
    )


def _slowest_rank(summary, pipeline: int) -> tuple[int, float]:
    """The straggling pipeline's rank whose busy time most exceeds the median of its stage's ranks in the
    other pipelines, and by how much (ms)."""
    busy = {entry.rank: entry.busy_ms for entry in summary.ranks}
    others = [line.ranks for j, line in enumerate(summary.pipelines) if j != pipeline]
    excess = {
        rank: busy[rank] - statistics.median(busy[line[position]] for line in others)
        for position, rank in enumerate(summary.pipelines[pipeline].ranks)
    }
    rank = max(excess, key=excess.get)
    return rank, excess[rank]


def _straggler(context: _Context) -> list[Finding]:
    """The replica every other waits for in the gradient sync, and its rank that works longest."""
    summary = context.analysis.summary
    late = summary.straggler
    if late is None or late.slower_ms <= 0:
        return []
    rank, excess = _slowest_rank(summary, late.pipeline)
    stage = summary.rank_entry(rank).stage_ids
    return [
        Finding(
            kind=STRAGGLER,
            rank=rank,
            stage=stage[0] if len(stage) == 1 else None,
            recoverable_ms=late.slower_ms,
            action=f"find why rank {rank} of pipeline {late.pipeline} works longer than its replicas' "
            "(its host, its device, its data): every replica waits for it in the gradient sync",
            evidence=f"pipeline {late.pipeline}'s step alone {late.slower_ms:.1f} ms "
            f"({late.slower_fraction:.1%}) longer than the fastest; rank {rank} busy {excess:+.1f} ms "
            "against its stage's other replicas",
            **context.interval((summary.step_time_ms - late.slower_ms) * NS_PER_MS),
        )
    ]


def findings_of(analysis: Analysis, config: dict) -> list[Finding]:
    """Every finding of the analysed run, largest recoverable first (those that recover nothing left out)."""
    typical = analysis.model.step()
    replayed_ms = [s.step_time_ms for s in analysis.summary.replayed_steps]
    context = _Context(
        analysis, config, replay(analysis.schedule, typical).makespan, step_levels(replayed_ms, config)
    )
    effect = gains(analysis.schedule, analysis.model, reference(analysis.cells, config, analysis.schedule.m))
    # predict's best m for the executed schedule, where the run can predict
    best = min(analysis.predictions, key=lambda p: p.step_time_ms) if analysis.predictions else None
    found = [*_pieces(context, effect), *_bubble(context, best), *_straggler(context)]
    found.append(_imbalance(context, effect[Effect.IMBALANCE]))
    if Effect.SMALL_BATCHES in effect:
        found += [
            _small_gemm(context, effect[Effect.SMALL_BATCHES], best),
            _slowdown(context, effect[Effect.INTERFERENCE]),
        ]
    kept = [f for f in found if f.recoverable_ms > 0]
    return sorted(kept, key=lambda f: -f.recoverable_ms)[:SHOWN]
