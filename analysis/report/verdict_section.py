"""The top of a run page and its index row's answer: the trust mark, the verdict's sentences and its
findings, as summary.json holds them (analysis.verdict; docs/numbers.md#verdict). Nothing is computed
here."""

from __future__ import annotations

import html

from analysis.report.pages import Column, Markup, number, table
from analysis.schema import RanksSummary, Summary, Trust
from analysis.traces.integrity import PROBLEMS
from analysis.vocabulary import Level

FINDING_COLUMNS = [
    Column("finding", "the part or effect the time rests on (docs/numbers.md#verdict)", text=True),
    Column("where", "the rank or stage it is on, where it is one", text=True),
    Column(
        "recoverable (ms)",
        "the typical step less its replay without this time: what the step would lose were it gone",
        show=number(1),
    ),
    Column("change", "what to change", text=True),
    Column(
        "predicted step (ms)",
        "the typical step replayed with the change made, and the interval the run's step levels give it",
        text=True,
    ),
    Column("evidence", "the measurements it rests on", text=True),
]


def trust_mark(trust: Trust | None) -> Markup:
    """The trust level as a table cell, its reasons in the tooltip."""
    if trust is None:
        return Markup("—")
    reasons = (
        "; ".join(trust.reasons) or "the pipeline model fits: hops, an order that replays, a closing replay"
    )
    return Markup(
        f'<span title="{html.escape(reasons)}">{html.escape(trust.level)}</span>',
        css=f"text trust-{trust.level}",
    )


def top_finding(summary: Summary) -> str:
    """The verdict's first finding in a few words, or why there is none."""
    verdict = summary.verdict
    if verdict is None or not verdict.findings:
        return "—"
    first = verdict.findings[0]
    return f"{first.kind} {first.recoverable_ms:.1f} ms" + (
        "" if verdict.recommends else " (nothing recommended)"
    )


def _where(finding) -> str:
    places = [
        f"rank {finding.rank}" if finding.rank is not None else "",
        f"stage {finding.stage}" if finding.stage is not None else "",
    ]
    return ", ".join(p for p in places if p) or "—"


def _predicted(finding) -> str:
    if finding.predicted_step_ms is None:
        return "—"
    if finding.predicted_low_ms is None:
        return f"{finding.predicted_step_ms:.1f}"
    return f"{finding.predicted_step_ms:.1f} ({finding.predicted_low_ms:.1f}-{finding.predicted_high_ms:.1f})"


def figures_heading(summary: Summary) -> str:
    """The heading over the figures, marked where the trust is low: no figure of such a run is shown
    without it."""
    low = summary.trust is not None and summary.trust.level != Level.HIGH
    return (
        "<h2>Figures"
        + (' <span class="trust-low-mark">(low trust: see above)</span>' if low else "")
        + "</h2>"
    )


def section_html(summary: Summary | RanksSummary) -> str:
    """The answer first: the trust (with its reasons where low), the sentences, the findings table, the
    trace integrity counts."""
    trust, verdict = summary.trust, summary.verdict
    parts = []
    if trust is not None and trust.level != Level.HIGH:
        reasons = "".join(f"<li>{html.escape(reason)}</li>" for reason in trust.reasons)
        parts.append(
            f'<div class="low-trust-banner"><b>Low trust</b>: every figure on this page rests on a model the trace '
            f"fits poorly.<ul>{reasons}</ul></div>"
        )
    if verdict is None:
        return "\n".join(parts)
    parts.append(
        '<div class="verdict">' + "".join(f"<p>{html.escape(s)}</p>" for s in verdict.sentences) + "</div>"
    )
    if verdict.findings:
        rows = [
            [f.kind, _where(f), f.recoverable_ms, f.action, _predicted(f), f.evidence]
            for f in verdict.findings
        ]
        parts.append(table(FINDING_COLUMNS, rows, css="prose"))
    parts.append(integrity_html(summary))
    return "\n".join(parts)


INTEGRITY_COLUMNS = [
    Column("rank", "the rank whose trace this is"),
    Column("events", "the events in its file"),
    *(
        Column(name.replace("_", " "), f"{name}: docs/numbers.md#integrity (analysis.traces.integrity)")
        for name in PROBLEMS
    ),
]


def integrity_html(summary: Summary | RanksSummary) -> str:
    """Each rank's trace integrity counts; one line where every count is 0."""
    if not summary.integrity:
        return ""
    if all(found.total() == 0 for found in summary.integrity):
        return f"<p>Trace integrity: every count is 0 on all {len(summary.integrity)} rank(s).</p>"
    rows = [
        [found.rank, found.events, *(getattr(found, name) for name in PROBLEMS)]
        for found in summary.integrity
    ]
    return "<h3>Trace integrity</h3>" + table(INTEGRITY_COLUMNS, rows)
