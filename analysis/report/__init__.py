"""The offline HTML report: reports/index.html and one page per run, from every run under traces/.

The pages work offline from file://: scripts come from reports/assets/, chart data from a script
file beside each page (browsers refuse fetch() on file:// URLs, but load <script src>).
"""

from __future__ import annotations

import os
from pathlib import Path

from analysis.report import index_page, ranks_page, run_page
from analysis.report.assets import write_assets
from analysis.report.pages import assets_path, chart_script, document
from analysis.report.runs import Run, load_run, run_directories
from analysis.report.site import RUNS_DIR, page_stem, remove_stale_pages, write_atomic


def _write_page(
    path: Path, title: str, body: str, figures: list, depth: int, choices: tuple = ()
) -> set[str]:
    """Write the page, its chart script and its choices' option scripts; return their file names."""
    script = path.with_suffix(".charts.js")
    files = {script.name: chart_script(figures)} | {
        name: text for choice in choices for name, text in choice.scripts().items()
    }
    for name, text in files.items():
        write_atomic(path.parent / name, text)
    write_atomic(path, document(title, body, script.name, assets_path(depth)))
    return {path.name, *files}


def _write_run_page(run: Run, out: Path, stem: str) -> set[str]:
    page = out / RUNS_DIR / f"{stem}.html"
    merged = run.merged_trace
    merged_href = (
        Path(os.path.relpath(merged.resolve(), page.parent.resolve())).as_posix() if merged else None
    )
    if run.summary.scope == "ranks":
        return _write_page(
            page, f"{run.run_id}: some ranks of a job", ranks_page.body(run, merged_href), [], 1
        )
    body, figures, choices = run_page.body(run, merged_href, stem)
    return _write_page(page, f"{run.run_id}: pipeline run", body, figures, 1, choices)


def build_report(traces: Path, out: Path) -> Path:
    """Write every page (only what changed) and return the index's path."""
    runs = [load_run(path) for path in run_directories(traces)]
    stems = _unique_stems([r.run_id for r in runs])
    write_assets(out)
    written = {
        name for run in runs if run.error is None for name in _write_run_page(run, out, stems[run.run_id])
    }
    remove_stale_pages(out / RUNS_DIR, written)
    pages = {run_id: f"{RUNS_DIR}/{stem}.html" for run_id, stem in stems.items()}
    body, figures = index_page.body(runs, pages)
    _write_page(out / "index.html", "Pipeline runs", body, figures, 0)
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
