"""The report in a real browser: headless Chromium opens the pages from file:// with every non-file
request blocked, and the charts must render with no console errors and no attempt to reach out."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_report import write_contract_run

from analysis.report import build_report

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

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


def open_page(browser, page_path: Path, screenshot: Path) -> dict:
    """Open one page, wait for every chart, and report what went wrong (errors, outside requests)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
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
    seen["state"] = page.evaluate("document.body.dataset.charts")
    seen["charts"] = page.evaluate(
        "Array.from(document.querySelectorAll('div.chart')).map(d => [d.id, !!d.querySelector('svg, canvas')])"
    )
    page.screenshot(path=str(screenshot), full_page=True)
    context.close()
    return seen


def assert_clean(seen: dict) -> None:
    assert seen["state"] == "rendered", seen
    assert seen["charts"], "the page has no chart slots"
    assert all(drawn for _, drawn in seen["charts"]), seen["charts"]
    assert seen["errors"] == []
    assert seen["outside"] == []


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


def test_timeline_with_a_hundred_thousand_cells_opens_in_seconds(browser, tmp_path):
    traces = tmp_path / "traces"
    write_contract_run(traces, "big", schedule="1f1b", p=8, m=3200, forward_ms=0.01, steps=1)
    index = build_report(traces, tmp_path / "reports")
    seen = open_page(browser, index.parent / "runs" / "big.html", tmp_path / "big.png")
    assert_clean(seen)
    assert seen["seconds"] < 15, (
        f"the run page of 8 x 3200 x (F, B, SEND, RECV) cells took {seen['seconds']:.1f} s to render"
    )
