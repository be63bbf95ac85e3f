"""The run page of a job of many ranks: per-pipeline and per-stage summaries, and one pipeline's timeline
at a time from a script file beside the page. The threshold is lowered here so that a 6-rank job (p=2,
dp=3, analysed in a second) stands for the hundreds of ranks it is there for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.job.run_dir import analyze_dir
from analysis.report import build_report, job_view
from runners.schedules import build
from synthetic.data_parallel import write_job

P, DP, SLOW = 2, 3, 1


def write_job_run(traces: Path, name: str = "job") -> Path:
    """A p=2 x dp=3 job whose pipeline 1 computes 1.5x slower, analysed."""
    run = traces / name
    write_job(
        run,
        build("1f1b", P, 4),
        DP,
        slow_pipeline=SLOW,
        slow_factor=1.5,
        sync_us=300,
        shape="gpu",
        durations_us={"F": 1000, "B": 2000},
        p2p_latency_us=50,
        launch_gap_us=10,
    )
    analyze_dir(run)
    return run


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """The job, analysed once for the module."""
    folder = tmp_path_factory.mktemp("traces")
    write_job_run(folder)
    return folder


@pytest.fixture
def many(monkeypatch):
    """The job counts as many ranks: past the threshold by two."""
    monkeypatch.setattr(job_view, "TIMELINE_RANKS_MAX", P * DP - 2)


def chosen_file(page: str) -> str:
    return page.split("selected>")[0].rsplit('<option value="', 1)[1].split('"')[0]


def drawn(script: Path) -> dict:
    """The chart an option's script hands to the page."""
    text = script.read_text()
    assert text.startswith("window.REPORT_DRAW(") and text.endswith(");\n")
    return json.loads(text.removeprefix("window.REPORT_DRAW(").removesuffix(");\n"))


def test_many_ranks_get_pipeline_and_stage_summaries_and_a_timeline_file_per_pipeline(traces, tmp_path, many):
    build_report(traces, tmp_path / "reports")
    runs = tmp_path / "reports" / "runs"
    page = (runs / "job.html").read_text()
    assert "<h2>Pipelines and stages</h2>" in page and "<h3>Per stage</h3>" in page
    assert f"Slowest pipeline: {SLOW}," in page
    assert '<tr class="flagged"><td title="pipeline">1</td>' in page  # the straggler's row
    charts = json.loads((runs / "job.charts.js").read_text().removeprefix("window.REPORT_CHARTS = ")[:-2])
    by_id = {chart["id"]: chart for chart in charts}
    assert "timeline" not in by_id and "parts" not in by_id  # drawn on demand, and by the heatmap
    cells = by_id["stages"]["spec"]["datasets"]["stages"]
    assert {(c["pipeline"], c["stage"]) for c in cells} == {(j, s) for j in range(DP) for s in range(P)}
    assert chosen_file(page) == f"job.timeline-{SLOW}.js"
    for j in range(DP):
        chart = drawn(runs / f"job.timeline-{j}.js")
        assert chart["id"] == "timeline" and chart["file"] == f"job.timeline-{j}.js"
        ranks = {row["rank"] for name, rows in chart["spec"]["datasets"].items() for row in rows}
        assert ranks == {j + DP * s for s in range(P)}, (j, ranks)  # its own ranks, measured and ideal
    assert sorted(p.name for p in runs.glob("job.timeline-*.js")) == [
        f"job.timeline-{j}.js" for j in range(DP)
    ]


def test_a_job_at_the_threshold_keeps_every_timeline_on_the_page_and_drops_the_files(
    traces, tmp_path, monkeypatch
):
    monkeypatch.setattr(job_view, "TIMELINE_RANKS_MAX", P * DP - 1)
    build_report(traces, tmp_path / "reports")
    runs = tmp_path / "reports" / "runs"
    assert len(list(runs.glob("job.timeline-*.js"))) == DP
    monkeypatch.setattr(job_view, "TIMELINE_RANKS_MAX", P * DP)
    build_report(traces, tmp_path / "reports")
    page = (runs / "job.html").read_text()
    assert "<select" not in page and "Pipelines and stages" not in page
    charts = (runs / "job.charts.js").read_text()
    assert all(f"measured, pipeline {j} (ranks" in charts for j in range(DP)) and '"id":"parts"' in charts
    assert list(runs.glob("job.timeline-*.js")) == []  # the files of the summary view, removed as stale
