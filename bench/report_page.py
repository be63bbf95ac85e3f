"""A job's run page at scale: the report of one analysed job built in this process (the shared assets
written first, so the time is the pages'), its page's HTML and chart data sizes, and the seconds headless
Chromium takes from opening the page from file:// to every chart drawn (median of a few)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from analysis.report import build_report
from analysis.report.site import RUNS_DIR

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOADS = 3
TIMEOUT_MS = 120_000


def load_seconds(page: Path, loads: int = LOADS) -> list[float] | None:
    """Seconds from opening `page` to its charts drawn, per load; None without Chromium or playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not CHROMIUM.exists():
        return None
    seconds = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        for _ in range(loads):
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            started = time.perf_counter()
            tab.goto(page.as_uri())
            tab.wait_for_function("document.body.dataset.charts !== 'pending'", timeout=TIMEOUT_MS)
            if tab.evaluate("document.body.dataset.charts") != "rendered":
                raise RuntimeError(f"{page}: the charts failed to draw")
            seconds.append(time.perf_counter() - started)
            tab.close()
        browser.close()
    return seconds


def report_page(job: Path, workdir: Path) -> dict:
    """Build the report of the analysed job `job` (alone in its traces folder) and measure its run page."""
    out, empty = workdir / f"report-{job.name}", workdir / "no-runs"
    empty.mkdir(exist_ok=True)
    build_report(empty, out)  # the assets alone
    started = time.perf_counter()
    build_report(job.parent, out)
    build_s = time.perf_counter() - started
    page = out / RUNS_DIR / f"{job.name}.html"
    text = page.read_text()
    scripts = sorted(page.parent.glob(f"{job.name}.*.js"))
    # what opening the page loads: its chart script and the option files its pickers have selected
    opened = [p for p in scripts if p.name.endswith(".charts.js") or f'value="{p.name}" selected' in text]
    seconds = load_seconds(page)
    return {
        "build_s": build_s,
        "html_kb": len(text.encode()) / 1e3,
        "chart_data_mb": sum(p.stat().st_size for p in scripts) / 1e6,
        "opened_data_mb": sum(p.stat().st_size for p in opened) / 1e6,
        "load_s": None if seconds is None else statistics.median(seconds),
        "load_s_range": None if seconds is None else [min(seconds), max(seconds)],
    }
