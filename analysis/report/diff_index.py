"""The index's comparisons: two lists to pick runs A and B from, which open their diff page, and every
diff page in a table.

The picker works from file:// with no server: the form carries each pair's page (data-pages) and
assets/embed.js goes there (analysis.report.assets.DIFF_PICKER_JS), or says the pair was never compared.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

from analysis.report.pages import Column, link, table

DIFFS_DIR = "diffs"  # the report's folder of diff pages: diffs/<B's page stem>/<A's page stem>.html


COLUMNS = [
    Column("A", "the run before", text=True),
    Column("B", "the run after; links to the pair's page", text=True),
    Column("significant changes", "figures that changed beyond the runs' noise, of those compared"),
]


@dataclass(frozen=True)
class DiffPage:
    a_run: str
    b_run: str
    href: str  # relative to the index
    significant: int
    figures: int


def page_href(a_stem: str, b_stem: str) -> str:
    return f"{DIFFS_DIR}/{b_stem}/{a_stem}.html"


def _options(name: str, run_ids: list[str], chosen: str) -> str:
    options = "".join(
        f'<option value="{html.escape(run_id)}"{" selected" if run_id == chosen else ""}>'
        f"{html.escape(run_id)}</option>"
        for run_id in run_ids
    )
    return f'<select name="{name}">{options}</select>'


def section(pages: list[DiffPage]) -> str:
    heading = "<h2>Compare two runs</h2>"
    if not pages:
        return (
            f"{heading}<p>No two runs compared yet: <code>make diff A=traces/RUN B=traces/RUN</code> compares "
            "a pair, and <code>make report</code> each m of a sweep with the next.</p>"
        )
    ordered = sorted(pages, key=lambda page: (page.a_run, page.b_run))
    targets = {f"{page.a_run}\n{page.b_run}": page.href for page in ordered}
    first = ordered[0]
    picker = (
        f'<form class="diff-picker" data-pages="{html.escape(json.dumps(targets, sort_keys=True))}"><p>'
        f"<label>A (before) {_options('a', sorted({p.a_run for p in ordered}), first.a_run)}</label> "
        f"<label>B (after) {_options('b', sorted({p.b_run for p in ordered}), first.b_run)}</label> "
        '<button type="submit">compare</button> <output></output></p></form>'
    )
    rows = [
        [page.a_run, link(page.href, page.b_run), f"{page.significant} of {page.figures}"] for page in ordered
    ]
    return (
        f'{heading}<p class="note">Pairs compared by <code>make diff</code> and each sweep\'s neighbours '
        "(one m against the next): what changed beyond the runs' noise, and the two runs side by side.</p>"
        f"{picker}{table(COLUMNS, rows)}"
    )
