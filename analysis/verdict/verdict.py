"""The verdict: a few sentences that answer first, and the findings ranked by what they recover
(analysis.verdict.findings; docs/numbers.md#verdict).

The one change worth making is the largest finding the model can replay with the change made; nothing
is recommended where the trust is low, where the run is flagged noisy, or where that change gains no
more than the run's steps spread (max - min over its profiled, and unprofiled, steps): a gain inside
the noise is not evidence.
"""

from __future__ import annotations

import dataclasses

import msgspec

from analysis.attribution.predict import standard_predictions
from analysis.results import Analysis
from analysis.schema import Finding, Trust, Verdict
from analysis.trust.gate import trust_of
from analysis.verdict.findings import findings_of
from analysis.vocabulary import Effect, Level

SAID = 3  # findings named in the verdict's sentences


def _spread_ms(analysis: Analysis, config: dict) -> float | None:
    """The run's own step-to-step spread, ms: the larger range (max - min) of its profiled and its
    unprofiled steps; None with a single step and no unprofiled ones (no spread was measured)."""
    ranges = []
    for times in (
        [s.step_time_ms for s in analysis.summary.replayed_steps],
        config.get("step_times_unprofiled_ms"),
    ):
        times = [t for t in times or [] if isinstance(t, (int, float))]
        if len(times) > 1:
            ranges.append(max(times) - min(times))
    return max(ranges) if ranges else None


def _why_not(
    trust: Trust, flags: list[str], top: Finding | None, spread: float | None, typical_ms: float
) -> str | None:
    """Why nothing is recommended; None where the top change clears the evidence bar: its gain, the
    typical step less its predicted one (both the model's), beyond the run's own spread."""
    if trust.level != Level.HIGH:
        return "the trust is low (" + "; ".join(trust.reasons) + ")"
    if "noisy" in flags:
        return "the run is noisy: repeat it on a quiet machine"
    if top is None:
        return "no change to the pipeline recovers measurable time"
    gain = typical_ms - top.predicted_step_ms
    if spread is not None and gain <= spread:
        return (
            f"its largest change ({top.kind}{_where(top)}) gains {gain:.1f} ms, inside the run's own "
            f"step-to-step spread ({spread:.1f} ms)"
        )
    return None


def verdict_of(analysis: Analysis, config: dict, trust: Trust) -> Verdict:
    """The run's verdict: sentences, whether it recommends, and its findings."""
    summary = analysis.summary
    findings = findings_of(analysis, config)
    spread = _spread_ms(analysis, config)
    # a change is a finding the model can replay with it made: the others say what the time is
    top = next((f for f in findings if f.predicted_step_ms is not None), None)
    why = _why_not(trust, summary.flags, top, spread, summary.typical_step_ms)
    sentences = [
        f"Step {summary.step_time_ms:.1f} ms (the median of {summary.steps_analyzed} profiled step(s); "
        + ("no spread measured" if spread is None else f"they spread {spread:.1f} ms")
        + ").",
        f"Bubble: the formula gives {summary.bubble_formula:.1%} for {summary.schedule} p={summary.p} "
        f"m={summary.m}{f' v={summary.v}' if summary.v > 1 else ''}; measured {summary.bubble_measured:.1%} "
        "of the ranks' time idle.",
    ]
    if findings:
        sentences.append(
            "Largest recoverable: "
            + ", ".join(f"{f.kind} {f.recoverable_ms:.1f} ms{_where(f)}" for f in findings[:SAID])
            + "."
        )
    if why is None:
        predicted = (
            ""
            if top.predicted_step_ms is None
            else (
                f": predicted {top.predicted_step_ms:.1f} ms ({top.predicted_low_ms:.1f}-{top.predicted_high_ms:.1f})"
            )
        )
        sentences.append(f"Worth changing: {top.action}{predicted}.")
    else:
        sentences.append(f"Nothing recommended: {why}.")
    contention = next(
        (f for f in findings if f.kind == Effect.INTERFERENCE and f.action.startswith("the machine")), None
    )
    if contention is not None:
        sentences.append(f"Slowdown: {contention.action}.")
    return Verdict(sentences=sentences, recommends=why is None, findings=findings)


def _where(finding: Finding) -> str:
    if finding.rank is not None and finding.kind in (Effect.HOST, Effect.TAIL):
        return f" (rank {finding.rank})"
    if finding.stage is not None:
        return f" (stage {finding.stage})"
    return ""


def assessed(analysis: Analysis, config: dict, where) -> Analysis:
    """`analysis` with its standard predictions (analysis.attribution.predict), its summary's trust
    (analysis.trust.gate) and verdict."""
    analysis = dataclasses.replace(analysis, predictions=standard_predictions(analysis, config, where))
    summary = analysis.summary
    trust = trust_of(summary, analysis.cells.height, summary.rules)
    verdict = verdict_of(analysis, config, trust)
    return dataclasses.replace(
        analysis, summary=msgspec.structs.replace(summary, trust=trust, verdict=verdict)
    )
