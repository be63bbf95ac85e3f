"""The HTML report: pages from what `analyze` writes (analysis.results), never re-derived.

`write_contract_run` makes a run directory as the runners and `python -m analysis analyze` leave it:
a synthetic run (synthetic.write_run: a real schedule replayed with F = forward_ms, B = 2 F) analysed
by the real analysis, so the report is tested against the contract its input really has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import msgspec
import polars as pl
import pytest
from conftest import REAL_TRACES, summary_of

from analysis import results
from analysis.errors import TraceWarning
from analysis.job.run_dir import analyze_dir
from analysis.report import build_report, run_charts
from analysis.report.frames import coarsen, ideal_frame, step_origin, timeline_frame, waterfall_frame
from analysis.report.inflight import measured_in_flight, peaks_frame, theory_peaks, thinned
from analysis.report.runs import run_directories
from analysis.report.sweeps import (
    engine_pairs,
    families,
    formula_curve,
    measured_steps,
    median_per_m,
    run_row,
    runs_frame,
)
from runners.schedules import bubble_formula, build
from synthetic import write_run


def write_contract_run(
    traces: Path,
    name: str,
    schedule: str = "gpipe",
    p: int = 2,
    m: int = 4,
    v: int = 1,
    engine: str = "native",
    forward_ms: float = 1.0,
    steps: int = 2,
    peak_bytes=None,
) -> Path:
    """A run directory as the runners and the analysis leave it (`peak_bytes`: every rank's peak activation
    memory, which synthetic traces do not record)."""
    run = traces / name
    write_run(
        run,
        build(schedule, p, m, v),
        durations_us={"F": forward_ms * 1000, "B": 2000 * forward_ms},
        steps=steps,
        run_id=name,
    )
    config = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(config | {"engine": engine}))
    analysis = analyze_dir(run)
    if peak_bytes is not None:
        ranks = [
            msgspec.structs.replace(entry, peak_activation_bytes=peak_bytes)
            for entry in analysis.summary.ranks
        ]
        results.write(run, replace(analysis, summary=msgspec.structs.replace(analysis.summary, ranks=ranks)))
    return run


def _report(tmp_path: Path, **runs) -> tuple[Path, Path]:
    traces = tmp_path / "traces"
    for name, options in runs.items():
        write_contract_run(traces, name, **options)
    return traces, build_report(traces, tmp_path / "reports")


def test_formula_curve_is_each_schedules_own_geometry_at_every_m_it_can_run():
    rows = [
        run_row(f"{name}{m}", summary_of(schedule=name, p=2, m=m, v=v, step_time_ms=10.0 + m))
        for name, v in (("interleaved", 2), ("zb", 1))
        for m in (2, 6)
    ]
    curve = formula_curve(families(runs_frame(rows)))
    interleaved = curve.filter(pl.col("family").str.starts_with("interleaved"))
    assert interleaved["m"].to_list() == [2, 4, 6]  # m a multiple of p only
    assert interleaved.filter(pl.col("m") == 4)["bubble_formula"].item() == pytest.approx(
        1 / 9
    )  # (p-1)/(v*m+p-1)
    zb = curve.filter(pl.col("family").str.starts_with("zb"))
    assert zb["m"].to_list() == [2, 3, 4, 5, 6]  # zb needs m >= p
    assert zb.filter(pl.col("m") == 4)["bubble_formula"].item() == pytest.approx(
        bubble_formula(build("zb", 2, 4))
    )
    assert bubble_formula(build("zb", 2, 4)) < 1 / 5  # below 1F1B's closed form: ZB's own geometry


def test_best_m_is_the_fastest_and_the_median_run_stands_for_a_repeated_m():
    rows = [
        run_row("new-m4", summary_of(m=4, step_time_ms=7.0)),
        run_row("mid-m4", summary_of(m=4, step_time_ms=5.0)),
        run_row("old-m4", summary_of(m=4, step_time_ms=3.0)),
        run_row("m2", summary_of(m=2, step_time_ms=8.0)),
        run_row("m8", summary_of(m=8, step_time_ms=9.0)),
    ]
    steps = measured_steps(median_per_m(families(runs_frame(rows))))
    assert steps.filter(pl.col("best"))["m"].to_list() == [4]
    assert steps.filter(pl.col("m") == 4).select("step_time_ms", "repeats").row(0) == (5.0, 3)
    assert steps.filter(pl.col("m") == 2)["repeats"].item() == 1


def test_waterfall_bars_chain_from_formula_to_measured():
    bars = waterfall_frame(summary_of())
    terms = bars.filter(pl.col("term") != "measured")
    assert terms["start"][1:].to_list() == terms["end"][:-1].to_list()
    assert terms["end"][-1] == pytest.approx(10.0)
    assert bars.filter(pl.col("term") == "measured").select("start", "end").row(0) == (0.0, 10.0)
    assert bars.filter(pl.col("term") == "residual")["bar"].item() == "decrease"
    # summary_of has no isolated calibration: its two unknown terms are drawn as unknown, not as 0.00
    unknown = bars.filter(pl.col("term").is_in(["small_batches", "interference"]))
    assert unknown["label"].to_list() == ["unknown", "unknown"]
    assert (unknown["start"] == unknown["end"]).all()
    assert bars.filter(pl.col("term") == "ideal")["label"].item() == "6.00"


def test_timeline_shows_one_step_from_zero_with_every_cell_and_gap(tmp_path):
    analysis = results.read(write_contract_run(tmp_path, "run", "gpipe", p=2, m=4, steps=3))
    step = analysis.summary.median_step
    frame = timeline_frame(
        analysis.cells, analysis.gaps, step, step_origin(analysis.cells, analysis.gaps, step)
    )
    assert frame.filter(pl.col("track") == "compute").height == 2 * 2 * 4  # p ranks x m microbatches x F, B
    assert (
        frame.filter(pl.col("track") == "idle").height == analysis.gaps.filter(pl.col("step") == step).height
    )
    assert frame["start_ms"].min() == 0.0
    assert set(frame.filter(pl.col("track") == "compute")["action"]) >= {"0F0", "1B3"}


def test_the_timeline_draws_the_median_steps_critical_path_on_its_own_track(tmp_path):
    analysis = results.read(write_contract_run(tmp_path, "run", "gpipe", p=2, m=4, steps=3))
    step = analysis.summary.median_step
    origin = step_origin(analysis.cells, analysis.gaps, step)
    frame = timeline_frame(analysis.cells, analysis.gaps, step, origin, analysis.critical)
    drawn = frame.filter(pl.col("track") == "critical path")
    path = analysis.critical.filter(pl.col("step") == step)
    assert drawn.height == path.height > 0 and set(drawn["rank"]) == {0, 1}  # the path crosses both ranks
    assert drawn["duration_ms"].sum() == pytest.approx(
        (path["end_ns"] - path["start_ns"]).sum() / 1e6, abs=1e-3
    )
    assert "compute 0F0" in set(drawn["action"])
    spec = run_charts.timeline(frame, "measured", 2).spec()
    assert "critical path" in spec["encoding"]["yOffset"]["scale"]["domain"]


def test_a_huge_step_is_drawn_from_time_bins_that_keep_its_time(tmp_path):
    # huge against rows_max below: m=100 gives 2,015 rows, twice the 1,000 (m=400's 8,015 cost 4x the time)
    analysis = results.read(write_contract_run(tmp_path, "run", "1f1b", p=4, m=100, forward_ms=0.01, steps=1))
    frame = timeline_frame(analysis.cells, analysis.gaps, 0, step_origin(analysis.cells, analysis.gaps, 0))
    bars = coarsen(frame, bins=50, rows_max=1000)
    assert frame.height > 1000 and bars.height <= 4 * 3 * 50
    assert bars["cells"].sum() == frame.height
    assert bars["duration_ms"].sum() == pytest.approx(frame["duration_ms"].sum(), rel=1e-6)
    # In 1F1B's steady state B (2 units) outweighs F (1 unit) in every bin of rank 0's compute track.
    assert bars.filter((pl.col("rank") == 0) & (pl.col("track") == "compute"))["what"].mode().to_list() == [
        "B"
    ]
    assert coarsen(frame, rows_max=frame.height) is frame


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_measured_in_flight_peaks_follow_the_schedule(tmp_path, schedule):
    analysis = results.read(write_contract_run(tmp_path, "run", schedule, p=4, m=8, steps=1))
    measured = measured_in_flight(analysis.cells, 0, step_origin(analysis.cells, analysis.gaps, 0))
    peaks = peaks_frame(measured, theory_peaks(analysis.ideal))
    expected = [8, 8, 8, 8] if schedule == "gpipe" else [4, 3, 2, 1]  # m on every stage; p - s on stage s
    assert peaks["measured"].to_list() == expected
    assert peaks["theory"].to_list() == expected
    thin = thinned(measured, bins=4, rows_max=10)
    assert (
        thin.height <= 4 * 4
        and thin.group_by("rank").agg(pl.col("live").max()).sort("rank")["live"].to_list() == expected
    )


def test_the_report_draws_the_waterfalls_ideal_rung(tmp_path):
    # Unequal stages, a small-GEMM loss and a slowdown: the ideal timeline must be the rung at full-batch
    # durations (calibrated F and B per microbatch), not the isolated times, the cells or equal slots.
    run = tmp_path / "run"
    write_run(
        run,
        build("gpipe", 2, 4),
        durations_us={"F": 1000, "B": 2000, (1, "F"): 1500, (1, "B"): 3000},
        small_gemm=1.1,
        slowdown=1.25,
        p2p_latency_us=50,
        launch_gap_us=20,
        steps=2,
    )
    analysis = analyze_dir(run)
    waterfall, ideal = analysis.summary.waterfall_ms, analysis.ideal
    makespan_ms = (ideal["end_ns"].max() - ideal["start_ns"].min()) / 1e6
    assert makespan_ms == pytest.approx(
        waterfall.ideal + waterfall.fill_drain + waterfall.imbalance, abs=1e-6
    )
    # the rung is neither equal slots nor the isolated times nor the cells
    assert waterfall.imbalance > 0 and waterfall.small_batches > 0 and waterfall.interference > 0
    # GPipe at reference durations: stage 1's F (1.5 ms) paces the forwards, its B (3 ms) the backwards.
    assert makespan_ms == pytest.approx(1.0 + 4 * 1.5 + 4 * 3.0 + 2.0)
    drawn = ideal_frame(ideal, step_origin(analysis.cells, analysis.gaps, analysis.summary.median_step))
    assert drawn.height == ideal.height == 2 * 2 * 4
    assert results.read(run).ideal.equals(ideal)


def test_index_lists_runs_newest_first_and_a_broken_run_as_an_error_row(tmp_path):
    traces = tmp_path / "traces"
    write_contract_run(traces, "older", m=2)
    write_contract_run(traces, "newer", m=4)
    (traces / "broken").mkdir()
    (traces / "broken" / "rank0.json").write_text("{")
    (traces / "latest").symlink_to("newer")
    times = {"older": 1_000, "newer": 2_000, "broken": 3_000}
    for name, stamp in times.items():
        target = traces / name / "run.json" if name != "broken" else traces / name
        os.utime(target, ns=(stamp * 10**9, stamp * 10**9))
    assert [p.name for p in run_directories(traces)] == ["broken", "newer", "older"]
    index = build_report(traces, tmp_path / "reports").read_text()
    assert index.index("broken") < index.index("runs/newer.html") < index.index("runs/older.html")
    assert re.search(r'<tr class="error">.*broken.*</tr>', index)
    assert (tmp_path / "reports" / "runs" / "newer.html").is_file()
    assert not (tmp_path / "reports" / "runs" / "broken.html").exists()
    assert "latest" not in index


def test_names_from_traces_cannot_inject_markup(tmp_path):
    name = "x<img src=x onerror=alert(1)>"
    traces, index = _report(tmp_path, **{name: {"m": 2}})
    summary_path = traces / name / "analysis" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps(summary | {"schedule": "</script><script>alert(2)</script>"}))
    build_report(traces, tmp_path / "reports")
    pages = [index, *sorted((tmp_path / "reports" / "runs").glob("*.html"))]
    assert (
        "&lt;/script&gt;" in (tmp_path / "reports" / "index.html").read_text()
    )  # the edited summary was read
    for page in pages:
        text = page.read_text()
        assert "<img" not in text and "<script>alert" not in text, page
    for script in (tmp_path / "reports").rglob("*.charts.js"):
        assert "<" not in script.read_text(), script


def test_rebuild_is_idempotent_and_drops_pages_of_removed_runs(tmp_path):
    traces, index = _report(tmp_path, a={"m": 2}, b={"m": 4})
    written = {
        p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "reports").rglob("*") if p.is_file()
    }
    build_report(traces, tmp_path / "reports")
    again = {
        p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "reports").rglob("*") if p.is_file()
    }
    assert again == written
    shutil.rmtree(traces / "b")
    build_report(traces, tmp_path / "reports")
    assert not (tmp_path / "reports" / "runs" / "b.html").exists()
    assert (tmp_path / "reports" / "runs" / "a.html").exists()


def test_pages_load_only_local_scripts_written_once(tmp_path):
    _, index = _report(tmp_path, a={"m": 2})
    bundles = list((tmp_path / "reports" / "assets").glob("vega-bundle-*.js"))
    assert len(bundles) == 1 and "window.vegaEmbed=" in bundles[0].read_text()
    for page in [index, tmp_path / "reports" / "runs" / "a.html"]:
        sources = re.findall(r'(?:src|href)="([^"]+)"', page.read_text())
        assert sources and not [s for s in sources if "://" in s or s.startswith("//")], sources
        for source in sources:
            assert (page.parent / source).exists(), source


def test_report_command_exits_2_with_one_line_for_a_missing_traces_folder(tmp_path, capsys):
    from analysis.cli import main

    assert main(["report", "--traces", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "nothing" in error


def test_native_and_torch_runs_of_one_configuration_are_compared(tmp_path):
    _, index = _report(
        tmp_path, native={"m": 4, "forward_ms": 1.0}, torch={"m": 4, "engine": "torch", "forward_ms": 1.5}
    )
    ratio = re.search(r'title="torch / native">([0-9.]+)<', index.read_text())
    assert ratio and float(ratio.group(1)) == pytest.approx(1.5, abs=1e-3)


def test_engine_pairs_take_the_median_of_repeated_runs_and_say_how_many():
    rows = [
        run_row(name, summary_of(engine=engine, step_time_ms=ms))
        for name, engine, ms in [
            ("n1", "native", 10.0),
            ("n2", "native", 30.0),
            ("n3", "native", 20.0),
            ("t1", "torch", 25.0),
        ]
    ]
    pair = engine_pairs(runs_frame(rows))
    assert pair.select("native", "native_runs", "torch", "torch_runs", "ratio").row(0) == (
        20.0,
        3,
        25.0,
        1,
        1.25,
    )


def test_the_run_page_says_when_ranks_shared_cores(tmp_path):
    traces = tmp_path / "traces"
    run = write_contract_run(traces, "crowded", p=2)
    config = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(
        json.dumps(config | {"device": "cpu", "threads_per_rank": 1, "host": {"cpu_count": 1}})
    )
    analyze_dir(run)
    build_report(traces, tmp_path / "reports")
    page = (tmp_path / "reports" / "runs" / "crowded.html").read_text()
    assert "Note: 2 ranks x 1 thread(s) on 1 cores: ranks take turns" in page
    index = (tmp_path / "reports" / "index.html").read_text()
    assert re.search(r'<tr class="flagged">.*crowded.*contended.*</tr>', index)


def test_a_run_analysed_by_another_version_is_analysed_again(tmp_path):
    traces = tmp_path / "traces"
    run = write_contract_run(traces, "old")
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    del summary["waterfall_ms"]  # an older summary.json without this key
    (run / "analysis" / "summary.json").write_text(json.dumps(summary))
    with pytest.warns(TraceWarning, match="summary.json: not this version's analysis .*; analysed again"):
        index = build_report(traces, tmp_path / "reports").read_text()
    assert 'class="error"' not in index and (tmp_path / "reports" / "runs" / "old.html").is_file()
    assert "waterfall_ms" in json.loads((run / "analysis" / "summary.json").read_text())


# Each stored table's columns at analysis.results.ANALYSIS_FORMAT. A change to them must bump the format,
# or a report reads an older analysis's tables with this version's code (a replay tail without its
# `barrier` column stopped `make trace`'s report with a traceback).
STORED_FORMAT = 6
STORED_COLUMNS = {
    "cells": "rank step stage kind microbatch start_ns end_ns blocked_ns inferred busy_ns compute_ns small_gemm_ns "
    "slowdown_ns cpu_contention_ns slack_ns",
    "critical": "step rank start_ns end_ns part stage kind microbatch",
    "gaps": "rank step start_ns end_ns class",
    "ideal": "rank step stage kind microbatch start_ns end_ns in_flight",
    "ranks": "rank step step_ms busy_ms cpu_contention_ms dp_skew_ms compute_ms small_gemm_ms slowdown_ms bubble_ms "
    "p2p_wait_ms dp_sync_ms launch_overhead_ms other_ms",
    "replay_inputs": "step rank position stage kind microbatch lead pre work transfer post",
    "replay_tails": "rank step w_start barrier opened active_end labelled_end dp_sync other launch_overhead",
}


def test_a_change_to_a_stored_tables_columns_comes_with_a_new_analysis_format(tmp_path):
    run = write_contract_run(tmp_path / "traces", "pinned")
    stored = {
        path.stem: " ".join(pl.read_parquet_schema(path))
        for path in sorted((run / "analysis").glob("*.parquet"))
    }
    assert (results.ANALYSIS_FORMAT, stored) == (STORED_FORMAT, STORED_COLUMNS), (
        "a stored table changed: bump analysis.results.ANALYSIS_FORMAT and pin the new columns here"
    )


@pytest.mark.parametrize(
    ("stamp", "reason"),
    [(None, "no format stamp"), (b'{"format": 0}', f"format 0; this version reads {STORED_FORMAT}")],
)
def test_an_analysis_of_another_format_is_analysed_again_by_the_report(tmp_path, stamp, reason):
    """An older analysis whose summary still reads (its tables' columns changed) is not read with this
    version's code: the report analyses the run again."""
    traces = tmp_path / "traces"
    run = write_contract_run(traces, "older")
    stamp_file = run / "analysis" / results.FORMAT_FILE
    stamp_file.unlink() if stamp is None else stamp_file.write_bytes(stamp)
    tails = run / "analysis" / "replay_tails.parquet"
    pl.read_parquet(tails).drop("barrier").write_parquet(tails)
    with pytest.warns(
        TraceWarning, match=f"format.json: not this version's analysis \\({reason}.*; analysed again"
    ):
        index = build_report(traces, tmp_path / "reports").read_text()
    assert 'class="error"' not in index and (tmp_path / "reports" / "runs" / "older.html").is_file()
    assert "barrier" in pl.read_parquet_schema(tails)


def test_an_interrupted_run_is_an_error_row_not_missing(tmp_path):
    traces = tmp_path / "traces"
    write_contract_run(traces, "finished", m=2)
    (traces / "interrupted").mkdir()
    (traces / "interrupted" / "torchrun.log").write_text("KeyboardInterrupt\n")  # killed before run.json
    index = build_report(traces, tmp_path / "reports").read_text()
    assert re.search(r'<tr class="error">.*interrupted.*incomplete run.*</tr>', index)


def test_a_job_that_is_not_a_pipeline_is_a_row_of_its_own_and_a_run_page_answers_first(tmp_path):
    """The DLRM set is listed as what it is (never as a gpipe row, never as a failed analysis); a
    pipeline's row carries its trust and top finding, and its page opens with the verdict."""
    traces = tmp_path / "traces"
    write_contract_run(traces, "pipe", m=4)
    shutil.copytree(REAL_TRACES / "param_dlrm_8rank", traces / "dlrm")
    index = build_report(traces, tmp_path / "reports").read_text()
    dlrm = re.search(r'<tr class="not-pipeline">(.*?)</tr>', index)
    assert dlrm and "dlrm" in dlrm[1] and "not a pipeline-parallel job: no send/recv" in dlrm[1]
    assert "gpipe" not in dlrm[1] and "InputError" not in index and ">None<" not in index
    assert "2 runs, newest first, 1 job not pipeline-parallel." in index
    pipe = re.search(r"<tr>(<td[^>]*><a href=\"runs/pipe.html\">.*?)</tr>", index)
    assert pipe and ">high<" in pipe[1]
    page = (tmp_path / "reports" / "runs" / "pipe.html").read_text()
    assert (
        page.index('<div class="verdict">') < page.index("<h2>Figures</h2>") < page.index("<h2>Timeline</h2>")
    )
    assert "Step " in page[page.index('<div class="verdict">') :]


def test_some_ranks_of_a_job_are_a_row_and_a_page_of_their_own(tmp_path):
    """A run with rank 1's file lost: its row says which ranks it holds and its trust is low; its page
    shows each rank alone and what is unknown, and it stays out of the sweeps."""
    traces = tmp_path / "traces"
    run = write_contract_run(traces, "some", m=4)
    (run / "rank1.json.gz").unlink()
    shutil.rmtree(run / "analysis")  # the whole run's, analysed before the file was lost
    index = build_report(traces, tmp_path / "reports").read_text()
    row = re.search(r'<tr class="flagged">(.*?)</tr>', index)
    assert row and "rank(s) 0 of 2 alone" in row[1] and ">low<" in row[1]
    page = (tmp_path / "reports" / "runs" / "some.html").read_text()
    assert "Each rank alone: 1 of the job's 2" in page and "Unknown without the other ranks" in page
    assert page.index('class="low-trust-banner"') < page.index('<div class="verdict">')
