"""The HTML report: pages from summary.json and tables written to the contract (DESIGN.md section 3).

`write_contract_run` makes a run directory the way `python -m analysis analyze` leaves it, from a
unit-time replay of a real schedule, so these tests need neither torchrun nor the analysis.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from analysis.report import build_report
from analysis.report.frames import coarsen, representative_step, timeline_frame, waterfall_frame
from analysis.report.ideal import ideal_timeline
from analysis.report.inflight import measured_in_flight, peaks_frame, theory_peaks, thinned
from analysis.report.runs import run_directories
from analysis.report.sweeps import formula_curve, families, measured_steps, newest_per_m, run_row, runs_frame
from runners.schedules import build, simulate

NS = 1_000_000  # ns per ms


def contract_tables(schedule: str, p: int, m: int, v: int, steps: int, forward_ms: float):
    """cells and gaps for `steps` steps of the schedule replayed with F = forward_ms, B = 2 F."""
    plan = build(schedule, p, m, v)
    timeline = simulate(plan, duration=lambda _r, a: forward_ms * (1 if a.kind.value == "F" else 2))
    span = timeline.makespan
    cells = pl.DataFrame(
        [{"rank": r, "step": s, "stage": a.stage, "kind": a.kind.value, "microbatch": a.microbatch,
          "start_ns": int((s * span * 1.1 + start) * NS), "end_ns": int((s * span * 1.1 + end) * NS),
          "blocked_ns": 0, "inferred": False} for s in range(steps) for r, a, start, end in timeline.rows])
    gaps = (cells.sort("rank", "step", "start_ns")
            .with_columns(gap_end=pl.col("start_ns").shift(-1).over("rank", "step"))
            .filter(pl.col("gap_end") > pl.col("end_ns"))
            .select("rank", "step", start_ns="end_ns", end_ns="gap_end", **{"class": pl.lit("bubble")}))
    return timeline, cells, gaps


def write_contract_run(traces: Path, name: str, schedule: str = "gpipe", p: int = 2, m: int = 4, v: int = 1,
                       engine: str = "native", forward_ms: float = 1.0, steps: int = 2, peak_bytes=None) -> Path:
    """A run directory as the runners and the analysis leave it; the waterfall closes on the step time."""
    run = traces / name
    (run / "analysis").mkdir(parents=True)
    for rank in range(p):
        with gzip.open(run / f"rank{rank}.json.gz", "wt") as trace:
            json.dump({"traceEvents": [], "distributedInfo": {"rank": rank}}, trace)
    timeline, cells, gaps = contract_tables(schedule, p, m, v, steps, forward_ms)
    cells.write_parquet(run / "analysis" / "cells.parquet")
    gaps.write_parquet(run / "analysis" / "gaps.parquet")
    step = timeline.makespan
    busy = [timeline.busy(r) for r in range(p)]
    ideal = 3 * forward_ms * m * v
    formula_step = ideal / (1 - (p - 1) / (v * m + p - 1))
    summary = {
        "schedule": schedule, "engine": engine, "device": "cpu", "p": p, "m": m, "v": v, "steps_analyzed": steps,
        "step_time_ms": step, "bubble_formula": (p - 1) / (v * m + p - 1),
        "bubble_measured": 1 - sum(busy) / (p * step), "simulated_step_time_ms": step,
        "waterfall_ms": {"ideal": ideal, "formula_bubble": formula_step - ideal, "imbalance": 0.0,
                         "small_gemm": None, "launch_overhead": 0.0, "p2p_wait": 0.0,
                         "residual": step - formula_step},
        "ranks": [{"rank": r, "stage_ids": [r + p * c for c in range(v)], "compute_ms": busy[r],
                   "bubble_ms": step - busy[r], "p2p_wait_ms": 0.0, "launch_overhead_ms": 0.0,
                   "small_gemm_ms": None, "other_ms": 0.0, "peak_activation_bytes": peak_bytes}
                  for r in range(p)],
        "rules": {"launch_gap_max_ms": 0.05},
    }
    (run / "analysis" / "summary.json").write_text(json.dumps(summary))
    calibration = {str(s): {"F_ms": forward_ms * m, "B_ms": 2 * forward_ms * m} for s in range(p * v)}
    config = {"schedule": schedule, "p": p, "m": m, "v": v, "engine": engine, "device": "cpu",
              "calibration": calibration, "complete": True}
    (run / "run.json").write_text(json.dumps(config))
    return run


def _report(tmp_path: Path, **runs) -> tuple[Path, Path]:
    traces = tmp_path / "traces"
    for name, options in runs.items():
        write_contract_run(traces, name, **options)
    return traces, build_report(traces, tmp_path / "reports")


def test_formula_curve_is_the_bubble_formula_at_every_m():
    rows = [run_row(f"r{m}", {"schedule": "interleaved", "engine": "native", "device": "cpu", "p": 4, "m": m, "v": 2,
                              "step_time_ms": 10.0 + m}) for m in (2, 6)]
    curve = formula_curve(families(runs_frame(rows)))
    assert curve["m"].to_list() == [1, 2, 3, 4, 5, 6]
    assert curve.filter(pl.col("m") == 3)["bubble"].item() == pytest.approx(3 / 9)  # (p-1)/(v*m+p-1)


def test_best_m_is_the_fastest_and_newest_run_stands_for_a_repeated_m():
    summary = {"schedule": "gpipe", "engine": "native", "device": "cpu", "p": 2, "v": 1}
    rows = [run_row("new-m4", summary | {"m": 4, "step_time_ms": 7.0}),
            run_row("old-m4", summary | {"m": 4, "step_time_ms": 3.0}),
            run_row("m2", summary | {"m": 2, "step_time_ms": 8.0}),
            run_row("m8", summary | {"m": 8, "step_time_ms": 9.0})]
    steps = measured_steps(newest_per_m(families(runs_frame(rows))))
    assert steps.filter(pl.col("best"))["m"].to_list() == [4]
    assert steps.filter(pl.col("m") == 4)["step_time_ms"].item() == 7.0


def test_waterfall_bars_chain_from_formula_to_measured():
    summary = {"step_time_ms": 10.0, "waterfall_ms": {"ideal": 6.0, "formula_bubble": 2.0, "imbalance": 0.5,
                                                       "small_gemm": None, "launch_overhead": 1.0,
                                                       "p2p_wait": 1.0, "residual": -0.5}}
    bars = waterfall_frame(summary)
    terms = bars.filter(pl.col("term") != "measured")
    assert terms["start"][1:].to_list() == terms["end"][:-1].to_list()
    assert terms["end"][-1] == pytest.approx(10.0)
    assert bars.filter(pl.col("term") == "measured").select("start", "end").row(0) == (0.0, 10.0)
    assert bars.filter(pl.col("term") == "residual")["bar"].item() == "decrease"


def test_timeline_shows_one_step_from_zero_with_every_cell_and_gap():
    _, cells, gaps = contract_tables("gpipe", 2, 4, 1, steps=3, forward_ms=1.0)
    step = representative_step(cells)
    frame = timeline_frame(cells, gaps, step)
    assert frame.filter(pl.col("track") == "compute").height == 2 * 2 * 4  # p ranks x m microbatches x F, B
    assert frame.filter(pl.col("track") == "idle").height == gaps.filter(pl.col("step") == step).height
    assert frame["start_ms"].min() == 0.0
    assert set(frame.filter(pl.col("track") == "compute")["action"]) >= {"0F0", "1B3"}


def test_a_huge_step_is_drawn_from_time_bins_that_keep_its_time():
    _, cells, gaps = contract_tables("1f1b", 4, 400, 1, steps=1, forward_ms=0.01)
    frame = timeline_frame(cells, gaps, 0)
    bars = coarsen(frame, bins=50, rows_max=1000)
    assert frame.height > 1000 and bars.height <= 4 * 3 * 50
    assert bars["cells"].sum() == frame.height
    assert bars["duration_ms"].sum() == pytest.approx(frame["duration_ms"].sum(), rel=1e-6)
    # In 1F1B's steady state B (2 units) outweighs F (1 unit) in every bin of rank 0's compute track.
    assert bars.filter((pl.col("rank") == 0) & (pl.col("track") == "compute"))["what"].mode().to_list() == ["B"]
    assert coarsen(frame, rows_max=frame.height) is frame


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_measured_in_flight_peaks_follow_the_schedule(schedule):
    _, cells, _ = contract_tables(schedule, 4, 8, 1, steps=1, forward_ms=1.0)
    peaks = peaks_frame(measured_in_flight(cells, 0), theory_peaks({"schedule": schedule, "p": 4, "m": 8}))
    expected = [8, 8, 8, 8] if schedule == "gpipe" else [4, 3, 2, 1]  # m on every stage; p - s on stage s
    assert peaks["measured"].to_list() == expected
    assert peaks["theory"].to_list() == expected
    thin = thinned(measured_in_flight(cells, 0), bins=4, rows_max=10)
    assert thin.height <= 4 * 4 and thin.group_by("rank").agg(pl.col("live").max()).sort("rank")["live"].to_list() \
        == expected


def test_ideal_timeline_replays_calibrated_durations():
    config = {"schedule": "gpipe", "p": 2, "m": 4, "v": 1,
              "calibration": {"0": {"F_ms": 4.0, "B_ms": 8.0}, "1": {"F_ms": 4.0, "B_ms": 8.0}}}
    frame, caption = ideal_timeline(config, None)
    # GPipe with equal stages: (m + p - 1) slots of F then of B, F = 4/4 ms and B = 8/4 ms per microbatch.
    assert frame["end_ms"].max() == pytest.approx((4 + 2 - 1) * (1.0 + 2.0))
    assert "calibration" in caption
    missing, why = ideal_timeline({"schedule": "no-such", "p": 2, "m": 4}, None)
    assert missing is None and "cannot be rebuilt" in why


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
    for page in pages:
        text = page.read_text()
        assert "<img" not in text and "<script>alert" not in text, page
    for script in (tmp_path / "reports").rglob("*.charts.js"):
        assert "<" not in script.read_text(), script


def test_rebuild_is_idempotent_and_drops_pages_of_removed_runs(tmp_path):
    traces, index = _report(tmp_path, a={"m": 2}, b={"m": 4})
    written = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "reports").rglob("*") if p.is_file()}
    build_report(traces, tmp_path / "reports")
    again = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "reports").rglob("*") if p.is_file()}
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
    _, index = _report(tmp_path, native={"m": 4, "forward_ms": 1.0}, torch={"m": 4, "engine": "torch",
                                                                            "forward_ms": 1.5})
    ratio = re.search(r'title="torch / native">([0-9.]+)<', index.read_text())
    assert ratio and float(ratio.group(1)) == pytest.approx(1.5, abs=1e-3)


@pytest.mark.parametrize("config, said", [
    ({"device": "cpu", "p": 4, "threads_per_rank": 1, "host": {"cpu_count": 2}}, "4 ranks x 1 thread(s) on 2 cores"),
    ({"device": "cpu", "p": 4, "threads_per_rank": 1, "host": {"cpu_count": 2}, "nodes": 2}, None),
    ({"device": "cpu", "p": 2, "threads_per_rank": 1, "host": {"cpu_count": 2}}, None),
    ({"device": "cuda", "p": 4, "threads_per_rank": 1, "host": {"cpu_count": 2}}, None),
    ({"device": "cpu", "p": 4}, None),  # someone else's run.json: no facts, no claim
    (None, None),
])
def test_oversubscribed_cpu_runs_are_called_out(config, said):
    from analysis.cli.analyze import oversubscription

    caveat = oversubscription(config)
    assert caveat is None if said is None else caveat.startswith(said)


def test_the_run_page_says_when_ranks_shared_cores(tmp_path):
    traces = tmp_path / "traces"
    run = write_contract_run(traces, "crowded", p=2)
    config = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(config | {"threads_per_rank": 1, "host": {"cpu_count": 1}}))
    build_report(traces, tmp_path / "reports")
    page = (tmp_path / "reports" / "runs" / "crowded.html").read_text()
    assert "Note: 2 ranks x 1 thread(s) on 1 cores: ranks take turns" in page
