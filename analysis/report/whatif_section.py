"""The run page's what-if section for an op-level run: the StragglerAnalysis paper's figures that
summary.json's `whatif` holds (analysis.whatif.figures), none for a profiled run."""

from __future__ import annotations

import html

from analysis.report.pages import Column, number, table
from analysis.schema import Summary

SHOWN_REPLICAS = 5  # the slowest replicas listed; a job may have hundreds


def section_html(summary: Summary) -> str:
    found = summary.whatif
    if found is None:
        return ""
    columns = [
        Column("figure", "the paper's name of the figure", text=True),
        Column("value", "a slowdown (ratio of mean steps) or a share of the slowdown", show=number(3)),
        Column(
            "meaning",
            "what the op graph's replay held at measured times, the rest at typical ones",
            text=True,
        ),
    ]
    rows = [
        ["S", found.S, "every op measured, against every op typical (compute: mean; communication: median)"],
        [
            "M_S",
            found.M_S,
            "the share of the slowdown (replayed less typical step) that the last stage at typical times removes",
        ],
        [
            "M_W",
            found.M_W,
            f"the same share for the worst workers {found.worst_workers} ([stage, dp_rank])",
        ],
    ]
    rows += [[f"S_stage {s}", v, f"stage {s}'s ops measured"] for s, v in found.by_stage.items()]
    slowest = sorted(found.by_dp_rank.items(), key=lambda item: -item[1])[:SHOWN_REPLICAS]
    rows += [[f"S_w {d}", v, f"replica {d}'s ops measured"] for d, v in slowest]
    rows += [
        [f"S_t {t}", v, f"{t} measured"] for t, v in sorted(found.by_optype.items(), key=lambda i: -i[1])
    ]
    intro = (
        f"{found.steps} steps of {found.step_ms:.1f} ms on average; replayed on the op graph without launch "
        f"delays {found.replay_ms:.1f} ms, with every op at its typical time {found.ideal_ms:.1f} ms "
        f"(python -m analysis whatif writes the same figures to whatif.json)."
    )
    return f"<h2>What-if: stragglers</h2>\n<p>{html.escape(intro)}</p>\n{table(columns, rows)}"
