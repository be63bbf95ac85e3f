"""Diff pages: a diff is stored in its B's run directory (by `diff`, or by `report` for a sweep's
neighbours), and the report draws a page for each stored pair and lists it on the index, computing
nothing itself."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import msgspec
import pytest
from test_report import write_contract_run

import analysis.cli.report as report_command
from analysis import results
from analysis.cli import main
from analysis.diff.neighbours import sweep_neighbours
from analysis.diff.stored import DIFFS_DIR, STORED_FORMAT, read_diff
from analysis.errors import InputError
from analysis.report import build_report
from analysis.report.runs import load_run, run_directories
from analysis.schema import Summary
from runners.schedules import build
from synthetic import write_run
from synthetic.data_parallel import write_job

STEPS = 5  # the fewest a side whose changes can be significant (analysis.diff.significance)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """A gpipe sweep over m = 1, 2, 4 and a 1f1b run at m = 4, of STEPS steps each."""
    found = tmp_path_factory.mktemp("diffpage") / "traces"
    for m in (1, 2, 4):
        write_contract_run(found, f"gpipe-m{m}", m=m, forward_ms=(1 + 0.2 * m) / m, steps=STEPS)
    write_contract_run(found, "1f1b-m4", schedule="1f1b", m=4, forward_ms=0.3, steps=STEPS)
    return found


def _stored(traces: Path) -> set[tuple[str, str]]:
    return {(path.stem, path.parent.parent.name) for path in traces.glob(f"*/{DIFFS_DIR}/*.json")}


def test_a_diff_the_user_asked_for_gets_a_page_linked_from_the_index(traces, tmp_path, capsys):
    assert main(["diff", str(traces / "gpipe-m4"), str(traces / "1f1b-m4")]) == 0
    kept = traces / "1f1b-m4" / DIFFS_DIR / "gpipe-m4.json"
    assert f"stored for the report: {kept}" in capsys.readouterr().err
    stored = read_diff(kept)
    assert (stored.format, stored.a_run, stored.b_run) == (STORED_FORMAT, "gpipe-m4", "1f1b-m4")
    assert any(change.significant for change in stored.changes)
    index = build_report(traces, tmp_path / "reports")
    page = index.parent / "diffs" / "1f1b-m4" / "gpipe-m4.html"
    text = page.read_text()
    assert "gpipe-m4 → 1f1b-m4" in text and "../../runs/gpipe-m4.html" in text
    significant = re.findall(r'<tr class="significant">', text)
    assert len(significant) == sum(change.significant for change in stored.changes)
    assert {"waterfalls", "parts", "timelines"} <= set(re.findall(r'<div class="chart" id="(\w+)">', text))
    listed = index.read_text()
    assert 'href="diffs/1f1b-m4/gpipe-m4.html"' in listed
    picker = re.search(r'<form class="diff-picker" data-pages="([^"]*)"', listed)
    pages = json.loads(picker.group(1).replace("&quot;", '"'))
    assert pages["gpipe-m4\n1f1b-m4"] == "diffs/1f1b-m4/gpipe-m4.html"


def test_the_report_command_compares_each_sweeps_neighbours(traces, tmp_path):
    assert main(["report", "--traces", str(traces), "--out", str(tmp_path / "reports")]) == 0
    assert {("gpipe-m1", "gpipe-m2"), ("gpipe-m2", "gpipe-m4")} <= _stored(traces)
    assert ("gpipe-m1", "gpipe-m4") not in _stored(traces)
    for a, b in (("gpipe-m1", "gpipe-m2"), ("gpipe-m2", "gpipe-m4")):
        assert (tmp_path / "reports" / "diffs" / b / f"{a}.html").is_file()
        assert read_diff(traces / b / DIFFS_DIR / f"{a}.json").changes


def test_the_report_makes_a_kept_diff_again_only_where_a_run_was_analysed_since(traces, tmp_path):
    reports = tmp_path / "reports"
    kept = traces / "gpipe-m2" / DIFFS_DIR / "gpipe-m1.json"
    assert main(["report", "--traces", str(traces), "--out", str(reports)]) == 0
    made = kept.stat().st_mtime_ns
    assert main(["report", "--traces", str(traces), "--out", str(reports)]) == 0
    assert kept.stat().st_mtime_ns == made
    summary = traces / "gpipe-m1" / results.ANALYSIS_DIR / "summary.json"
    later = made + 10**9
    os.utime(summary, ns=(later, later))  # as if analysed again after the diff was made
    assert main(["report", "--traces", str(traces), "--out", str(reports)]) == 0
    assert kept.stat().st_mtime_ns > made


def test_a_stored_diff_that_cannot_be_read_is_a_warning_and_its_page_is_gone(traces, tmp_path):
    reports = tmp_path / "reports"
    assert main(["diff", str(traces / "gpipe-m1"), str(traces / "1f1b-m4")]) == 0
    build_report(traces, reports)
    page = reports / "diffs" / "1f1b-m4" / "gpipe-m1.html"
    assert page.is_file()
    kept = traces / "1f1b-m4" / DIFFS_DIR / "gpipe-m1.json"
    kept.write_text("{")
    try:
        with pytest.warns(UserWarning, match="not a stored diff"):
            build_report(traces, reports)
        assert not page.exists() and "diffs/1f1b-m4/gpipe-m1.html" not in (reports / "index.html").read_text()
        with pytest.raises(InputError, match="not a stored diff"):
            read_diff(kept)
    finally:
        kept.unlink()


def test_without_a_stored_diff_the_index_says_how_to_make_one(tmp_path):
    traces = tmp_path / "traces"
    write_contract_run(traces, "alone")
    index = build_report(traces, tmp_path / "reports")
    assert "No two runs compared yet" in index.read_text()
    assert not (tmp_path / "reports" / "diffs").exists()


def test_neighbours_are_consecutive_m_of_one_family_with_the_median_run_for_a_repeated_m(traces):
    summary = results.read_stored(traces / "gpipe-m1").summary

    def run(run_id: str, schedule: str, m: int, step_ms: float) -> tuple[str, Summary]:
        return run_id, msgspec.structs.replace(summary, schedule=schedule, m=m, step_time_ms=step_ms)

    runs = [
        run("m1", "gpipe", 1, 9.0),
        run("m2-fast", "gpipe", 2, 7.0),
        run("m2-median", "gpipe", 2, 8.0),
        run("m2-slow", "gpipe", 2, 9.5),
        run("m8", "gpipe", 8, 6.0),
        run("1f1b-m2", "1f1b", 2, 7.0),  # a family of one m: no neighbour
    ]
    assert sorted(sweep_neighbours(runs)) == [("m1", "m2-median"), ("m2-median", "m8")]


def test_an_out_the_report_may_not_write_is_refused_before_any_pair_is_compared(tmp_path, capsys):
    traces = tmp_path / "traces"
    for m in (1, 2):
        write_contract_run(traces, f"gpipe-m{m}", m=m)
    taken = tmp_path / "mine.html"
    taken.write_text("mine")
    assert main(["report", "--traces", str(traces), "--out", str(taken)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert _stored(traces) == set()


def test_run_ids_from_traces_cannot_inject_markup_into_a_diff_page_or_the_picker(tmp_path):
    name = "x<img src=x onerror=alert(1)>"
    traces = tmp_path / "traces"
    write_contract_run(traces, name, m=2)
    write_contract_run(traces, "plain", m=4)
    assert main(["report", "--traces", str(traces), "--out", str(tmp_path / "reports")]) == 0
    pages = sorted((tmp_path / "reports" / "diffs").rglob("*.html"))
    assert len(pages) == 1
    for page in [*pages, tmp_path / "reports" / "index.html"]:
        text = page.read_text()
        assert "<img" not in text and "x&lt;img" in text, page
    for script in (tmp_path / "reports" / "diffs").rglob("*.charts.js"):
        assert "<" not in script.read_text(), script


def test_a_job_of_several_pipelines_is_drawn_against_one_pipeline_by_its_slowest(tmp_path):
    traces = tmp_path / "traces"
    write_job(traces / "job", build("1f1b", 2, 4), 2, slow_pipeline=1, slow_factor=1.2)
    write_run(traces / "one", build("1f1b", 2, 4))
    assert main(["diff", str(traces / "job"), str(traces / "one")]) == 0
    index = build_report(traces, tmp_path / "reports")
    page = (index.parent / "diffs" / "one" / "job.html").read_text()
    assert "the layouts differ" in page
    script = (index.parent / "diffs" / "one" / "job.charts.js").read_text()
    charts = json.loads(script.removeprefix("window.REPORT_CHARTS = ").rstrip().rstrip(";"))
    timelines = next(chart for chart in charts if chart["id"] == "timelines")["spec"]["datasets"]
    summary = results.read_stored(traces / "job").summary
    slowest = summary.pipelines[summary.straggler.pipeline].ranks
    assert {row["rank"] for row in timelines["timeline_a"]} == set(slowest)
    assert {row["rank"] for row in timelines["timeline_b"]} == {0, 1}


def test_a_pair_that_cannot_be_compared_is_a_warning_and_the_report_is_built(traces, tmp_path, monkeypatch):
    def broken(a, b):
        raise ZeroDivisionError("float division by zero")

    for kept in traces.glob(f"*/{DIFFS_DIR}"):
        shutil.rmtree(kept)
    monkeypatch.setattr(report_command, "diff", broken)
    with pytest.warns(UserWarning, match="no diff page \\(ZeroDivisionError: float division by zero\\)"):
        report_command.store_diffs([load_run(path) for path in run_directories(traces)])
    assert _stored(traces) == set()
    index = build_report(traces, tmp_path / "reports")
    assert "No two runs compared yet" in index.read_text()


def test_a_diff_that_cannot_be_kept_is_a_warning_and_the_gate_still_decides(traces, tmp_path, capsys):
    b = tmp_path / "b"
    shutil.copytree(traces / "1f1b-m4", b, ignore=shutil.ignore_patterns(DIFFS_DIR))
    (b / DIFFS_DIR).write_text("a file where the folder of diffs would go")
    assert main(["diff", str(traces / "gpipe-m4"), str(b), "--fail-on", "step_time:-1%"]) == 1
    err = capsys.readouterr().err
    assert f"warning: {b / DIFFS_DIR}: cannot write here" in err and "fail: step_time:-1%" in err
