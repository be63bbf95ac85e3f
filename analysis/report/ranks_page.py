"""The page of some ranks of a bigger job (summary.json scope "ranks": analysis.job.partial): the trust
and the verdict, each present rank's own figures, and what is unknown without the others
(docs/numbers.md#ranks-alone). Nothing is computed here."""

from __future__ import annotations

import html

from analysis.report import verdict_section
from analysis.report.pages import Column, number, table
from analysis.report.run_tables import config_html, merged_html
from analysis.report.runs import Run

COLUMNS = [
    Column("rank", "the rank in the job"),
    Column("stages", "the stages its cells name", text=True),
    Column("step (ms)", "its step of median length, on its own clock", show=number(3)),
    Column("busy (ms)", "time its work ran", show=number(3)),
    Column("own bubble", "1 - busy / its step", show=number(3)),
    Column("launch_overhead (ms)", "idle while the host had not issued the next work", show=number(3)),
    Column("other (ms)", "work outside the schedule, and waits on ranks not in the traces", show=number(3)),
    Column(
        "unmatched wait (ms)",
        "of other: blocked in receives whose sender is not in the traces (bubble or p2p_wait: which, "
        "unknown without the sender)",
        show=number(3),
    ),
    Column(
        "bubble (ms)",
        "idle before its first and after its last action, and waits on known senders",
        show=number(3),
    ),
    Column(
        "p2p_wait (ms)", "transfers after both sides had posted, where both are in the traces", show=number(3)
    ),
]


def body(run: Run, merged_href: str | None) -> str:
    summary = run.summary
    formula = "unknown (run.json does not say the job's schedule, p and m)"
    if summary.bubble_formula is not None:
        formula = f"{summary.bubble_formula:.3f} ({summary.schedule} p={summary.p} m={summary.m})"
    rows = [
        [
            r.rank,
            ", ".join(map(str, r.stage_ids)),
            r.step_time_ms,
            r.busy_ms,
            r.bubble_measured,
            r.launch_overhead_ms,
            r.other_ms,
            r.unmatched_wait_ms,
            r.bubble_ms,
            r.p2p_wait_ms,
        ]
        for r in summary.ranks
    ]
    unknown = "".join(f"<li>{html.escape(what)}</li>" for what in summary.unknown)
    return "\n".join(
        [
            '<p><a href="../index.html">all runs</a></p>',
            f"<h1>{html.escape(run.run_id)}</h1>",
            verdict_section.section_html(summary),
            f"<h2>Each rank alone: {len(summary.ranks_present)} of the job's {summary.world_size}</h2>",
            f"<p>The formula's bubble at the job's p: {html.escape(formula)}.</p>",
            table(COLUMNS, rows),
            "<h2>Unknown without the other ranks</h2>",
            f"<ul>{unknown}</ul>",
            "<h2>Merged trace</h2>",
            merged_html(merged_href, run.path),
            "<h2>Configuration</h2>",
            config_html(run),
        ]
    )
