"""The offline HTML report: reports/index.html, one page per run, from every run under traces/, and one
page per pair of them compared (a diff stored in B's run directory, analysis.diff.stored).

The pages work offline from file://: scripts come from reports/assets/, chart data from a script
file beside each page (browsers refuse fetch() on file:// URLs, but load <script src>).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from analysis.diff.stored import StoredDiff, read_diff, stored_diffs
from analysis.errors import InputError, TraceWarning
from analysis.report import diff_index, diff_page, index_page, ranks_page, run_page
from analysis.report.assets import write_assets
from analysis.report.diff_index import DiffPage
from analysis.report.pages import assets_path, chart_script, document
from analysis.report.runs import Run, load_run, run_directories
from analysis.report.site import RUNS_DIR, Site, page_stem
from analysis.results import Analysis


def _write_page(
    site: Site, path: Path, title: str, body: str, figures: list, depth: int, choices: tuple = ()
) -> None:
    """Write the page, its chart script and its choices' option scripts, the page last."""
    script = path.with_suffix(".charts.js")
    scripts = {script.name: chart_script(figures)} | {
        name: text for choice in choices for name, text in choice.scripts().items()
    }
    site.write({path.parent / name: text for name, text in scripts.items()})
    site.write({path: document(title, body, script.name, assets_path(depth))})


def _write_run_page(site: Site, run: Run, stem: str) -> None:
    page = site.out / RUNS_DIR / f"{stem}.html"
    merged = run.merged_trace
    merged_href = (
        Path(os.path.relpath(merged.resolve(), page.parent.resolve())).as_posix() if merged else None
    )
    if run.summary.scope == "ranks":
        _write_page(
            site, page, f"{run.run_id}: some ranks of a job", ranks_page.body(run, merged_href), [], 1
        )
        return
    body, figures, choices = run_page.body(run, merged_href, stem)
    _write_page(site, page, f"{run.run_id}: pipeline run", body, figures, 1, choices)


def _stored_diffs(runs: list[Run]) -> list[tuple[StoredDiff, Run, Run]]:
    """Each diff stored in a run's directory whose both runs the report draws whole; one that cannot be
    read is a warning (`python -m analysis report` makes it again)."""
    whole = {run.run_id: run for run in runs if run.error is None and isinstance(run.analysis, Analysis)}
    found = []
    for b in whole.values():
        for path in stored_diffs(b.path):
            try:
                stored = read_diff(path)
            except InputError as error:
                warnings.warn(f"{error}; no diff page for it", TraceWarning, stacklevel=2)
                continue
            if stored.a_run in whole and stored.b_run == b.run_id:
                found.append((stored, whole[stored.a_run], b))
    return found


def _write_diff_pages(site: Site, runs: list[Run], stems: dict[str, str]) -> list[DiffPage]:
    pages = []
    for stored, a, b in _stored_diffs(runs):
        href = diff_index.page_href(stems[a.run_id], stems[b.run_id])
        run_pages = tuple(f"../../{RUNS_DIR}/{stems[run.run_id]}.html" for run in (a, b))
        body, figures = diff_page.body(stored, (a, b), run_pages)
        _write_page(site, site.out / href, f"{a.run_id} against {b.run_id}", body, figures, 2)
        significant = sum(change.significant for change in stored.changes)
        pages.append(DiffPage(a.run_id, b.run_id, href, significant, len(stored.changes)))
    return pages


def build_report(traces: Path, out: Path, runs: list[Run] | None = None) -> Path:
    """Write every page (only what changed) into `out`, a folder of the report's own (analysis.report.site:
    refused before any run is read where it is not), and return the index's path; `runs`: those under
    `traces` loaded already (analysis.report.runs), by a caller that compared some first."""
    site = Site(out)
    runs = [load_run(path) for path in run_directories(traces)] if runs is None else runs
    stems = _unique_stems([r.run_id for r in runs])
    write_assets(site)
    for run in runs:
        if run.error is None:
            _write_run_page(site, run, stems[run.run_id])
    diff_pages = _write_diff_pages(site, runs, stems)
    pages = {run_id: f"{RUNS_DIR}/{stem}.html" for run_id, stem in stems.items()}
    body, figures = index_page.body(runs, pages, diff_index.section(diff_pages))
    _write_page(site, out / "index.html", "Pipeline runs", body, figures, 0)
    site.finish()
    return out / "index.html"


def _unique_stems(run_ids: list[str]) -> dict[str, str]:
    """File stems per run; two ids that clean up to the same stem get numbered apart."""
    stems: dict[str, str] = {}
    for run_id in sorted(run_ids):
        stem, n = page_stem(run_id), 1
        while stem in stems.values():
            n += 1
            stem = f"{page_stem(run_id)}-{n}"
        stems[run_id] = stem
    return stems
