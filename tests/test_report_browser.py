"""The report in a real browser: headless Chromium opens the pages from file:// with every non-file
request blocked, and the charts must render with no console errors and no attempt to reach out."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_report import write_contract_run
from test_report_many_ranks import DP, SLOW, P, write_job_run

from analysis.cli import main
from analysis.report import build_report, job_view
from analysis.report.frames import TIMELINE_BINS
from bench.report_page import ARGS, CHROMIUM

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="Chromium not found at /usr/bin/chromium (run `make browser`)"
    ),
]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield chromium
        chromium.close()


VIEWPORT_WIDTH = 1400
# every pair of axis labels in one chart whose boxes intersect (the report draws labels level or
# upright, never aslant, so a box is its text's extent)
OVERLAPPING_LABELS = """Array.from(document.querySelectorAll('div.chart')).flatMap(chart => {
  const boxes = Array.from(chart.querySelectorAll('.role-axis-label text'))
    .map(t => [t.textContent, t.getBoundingClientRect()]);
  const found = [];
  boxes.forEach(([a, p], i) => boxes.slice(i + 1).forEach(([b, q]) => {
    if (p.left < q.right && q.left < p.right && p.top < q.bottom && q.top < p.bottom) found.push([chart.id, a, b]);
  }));
  return found; })"""


def open_page(browser, page_path: Path, screenshot: Path, pick: dict[str, int] | None = None) -> dict:
    """Open one page, wait for every chart, and report what went wrong (errors, outside requests);
    `pick`: chart slot -> the option to pick in its list, and wait for it to be drawn."""
    context = browser.new_context(viewport={"width": VIEWPORT_WIDTH, "height": 1000})
    seen = {"outside": [], "errors": []}

    def route(request_route):
        if request_route.request.url.startswith("file://"):
            request_route.continue_()
        else:
            seen["outside"].append(request_route.request.url)
            request_route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda message: message.type == "error" and seen["errors"].append(message.text))
    page.on("pageerror", lambda error: seen["errors"].append(str(error)))
    started = time.perf_counter()
    page.goto(page_path.as_uri())
    page.wait_for_function("document.body.dataset.charts !== 'pending'", timeout=60_000)
    seen["seconds"] = time.perf_counter() - started
    for slot, option in (pick or {}).items():
        picker = page.locator(f"select[data-chart={slot}]")
        picker.select_option(index=option)
        wanted = picker.input_value()
        page.wait_for_function(
            f"document.getElementById('{slot}').dataset.shown === '{wanted}'", timeout=60_000
        )
    seen["state"] = page.evaluate("document.body.dataset.charts")
    seen["charts"] = page.evaluate(
        "Array.from(document.querySelectorAll('div.chart')).map(d => [d.id, !!d.querySelector('svg, canvas')])"
    )
    # what the page handed each chart: its rows (every dataset), its renderer, the SVG nodes it drew
    charts = "window.REPORT_CHARTS.map(c => [c.id, %s])"
    rows = "Object.values(c.spec.datasets || {}).reduce((n, d) => n + d.length, 0)"
    seen["rows"] = dict(page.evaluate(charts % rows))
    seen["renderers"] = dict(page.evaluate(charts % "c.renderer"))
    seen["shown"] = dict(
        page.evaluate("Array.from(document.querySelectorAll('div.chart')).map(d => [d.id, d.dataset.shown])")
    )
    seen["svg_nodes"] = dict(
        page.evaluate(charts % "document.getElementById(c.id).querySelectorAll('svg *').length")
    )
    seen["width"] = page.evaluate("document.documentElement.scrollWidth")
    seen["overlapping_labels"] = page.evaluate(OVERLAPPING_LABELS)
    seen["text"] = page.evaluate("document.body.innerText")
    page.screenshot(path=str(screenshot), full_page=True)
    context.close()
    return seen


def assert_clean(seen: dict) -> None:
    assert seen["state"] == "rendered", seen
    assert seen["charts"], "the page has no chart slots"
    assert all(drawn for _, drawn in seen["charts"]), seen["charts"]
    assert seen["errors"] == []
    assert seen["outside"] == []
    assert seen["width"] <= VIEWPORT_WIDTH, f"the page scrolls sideways: {seen['width']} px"
    assert seen["overlapping_labels"] == []
    assert "None" not in seen["text"]


def test_index_and_run_page_render_offline(browser, tmp_path):
    traces = tmp_path / "traces"
    for m in (1, 2, 4, 8):
        write_contract_run(traces, f"gpipe-m{m}", m=m, forward_ms=(1 + 0.2 * m) / m)
    write_contract_run(traces, "1f1b-m8", schedule="1f1b", m=8, forward_ms=0.3, peak_bytes=3 * 2**20)
    write_contract_run(traces, "torch-gpipe-m8", m=8, engine="torch", forward_ms=0.35)
    (traces / "broken").mkdir()
    (traces / "broken" / "rank0.json").write_text("{")
    index = build_report(traces, tmp_path / "reports")
    assert_clean(open_page(browser, index, tmp_path / "index.png"))
    assert_clean(open_page(browser, index.parent / "runs" / "1f1b-m8.html", tmp_path / "run.png"))


def test_timeline_with_tens_of_thousands_of_cells_opens_with_its_rows_binned(browser, tmp_path):
    """What keeps this page fast is counted, not timed (a loaded machine's seconds say nothing): the
    charts get at most 600 time bins per rank and track (analysis.report.frames.coarsen), and the timeline
    draws on a canvas, not as one SVG node per row. The size is what binning needs, not scale: m=3200 puts
    each rank's cells past the bins (so the bound below is strict) and the frame past TIMELINE_ROWS_MAX
    (44,806 rows unbinned); two ranks are enough for "per rank" (p=8, 102,400 cells, took 227 s at load 6,
    p=2 34 s at load 2). The seconds are only reported."""
    p, m = 2, 3200
    traces = tmp_path / "traces"
    write_contract_run(traces, "big", schedule="1f1b", p=p, m=m, forward_ms=0.01, steps=1)
    index = build_report(traces, tmp_path / "reports")
    seen = open_page(browser, index.parent / "runs" / "big.html", tmp_path / "big.png")
    assert_clean(seen)
    rows = seen["rows"]["timeline"]
    cells = p * m * 4  # F, B, SEND and RECV of every microbatch on every rank, before the idle gaps
    # measured (3 tracks per rank) and ideal (1), each at most TIMELINE_BINS bars per rank and track
    assert 0 < rows <= (3 + 1) * p * TIMELINE_BINS < cells / 4, (rows, seen["seconds"])
    assert seen["renderers"]["timeline"] == "canvas" and seen["svg_nodes"]["timeline"] == 0, seen


def test_a_job_of_many_ranks_draws_the_pipeline_the_reader_picks_offline(browser, tmp_path, monkeypatch):
    """The page opens with the slowest pipeline's timeline, loaded from its file; picking another loads
    that one's, from file:// alone."""
    monkeypatch.setattr(job_view, "TIMELINE_RANKS_MAX", P * DP - 2)
    write_job_run(tmp_path / "traces")
    page_path = build_report(tmp_path / "traces", tmp_path / "reports").parent / "runs" / "job.html"
    seen = open_page(browser, page_path, tmp_path / "job.png")
    assert_clean(seen)
    assert {"stages", "timeline"} <= {slot for slot, _ in seen["charts"]}
    assert seen["shown"]["timeline"] == f"job.timeline-{SLOW}.js"
    other = (SLOW + 1) % DP
    seen = open_page(browser, page_path, tmp_path / "other.png", pick={"timeline": other})
    assert_clean(seen)
    assert seen["shown"]["timeline"] == f"job.timeline-{other}.js"


def test_a_diff_page_renders_offline_and_the_index_opens_it(browser, tmp_path):
    """A sweep's neighbours, compared by `report` itself: their page draws every chart within the width,
    and the index's picker opens it from file://."""
    traces, reports = tmp_path / "traces", tmp_path / "reports"
    for m in (2, 4):
        write_contract_run(traces, f"gpipe-m{m}", m=m, forward_ms=(1 + 0.2 * m) / m)
    assert main(["report", "--traces", str(traces), "--out", str(reports)]) == 0
    page = reports / "diffs" / "gpipe-m4" / "gpipe-m2.html"
    seen = open_page(browser, page, tmp_path / "diff.png")
    assert_clean(seen)
    assert {slot for slot, _ in seen["charts"]} == {"waterfalls", "parts", "timelines"}
    assert_clean(open_page(browser, reports / "index.html", tmp_path / "index.png"))
    context = browser.new_context(viewport={"width": VIEWPORT_WIDTH, "height": 1000})
    index = context.new_page()
    index.goto((reports / "index.html").as_uri())
    index.select_option("form.diff-picker select[name=a]", "gpipe-m2")
    index.select_option("form.diff-picker select[name=b]", "gpipe-m4")
    index.click("form.diff-picker button")
    index.wait_for_url(page.as_uri(), timeout=60_000)
    context.close()
