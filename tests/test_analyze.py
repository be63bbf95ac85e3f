"""The `analyze` command: files written atomically, summary keys as docs/ARCHITECTURE.md section 3 lists
them, bad input = exit 2."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from test_cells import cpu_action, gpipe_m1_run, trace, write_trace

from analysis.cli import main
from analysis.cli.analyze import STEPS_LISTED, residual_by_step
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.report import build_report
from analysis.schema import StepReplay
from runners.schedules import build
from synthetic.generate import write_run

SUMMARY_KEYS = {
    "schedule",
    "engine",
    "device",
    "p",
    "m",
    "v",
    "steps_analyzed",
    "step_time_ms",
    "bubble_formula",
    "bubble_measured",
    "bubble_seed",
    "typical_step_ms",
    "waterfall_ms",
    "waterfall_shapley_ms",
    "replayed_steps",
    "critical_path",
    "ranks",
    "rules",
    "dp",
    "pipelines",
}
PART_KEYS = (  # the rank-entry keys that sum to the step time, in order
    "compute_ms",
    "small_gemm_ms",
    "slowdown_ms",
    "bubble_ms",
    "p2p_wait_ms",
    "dp_sync_ms",
    "launch_overhead_ms",
    "other_ms",
)
RANK_KEYS = {
    *PART_KEYS,
    "rank",
    "pipeline",
    "stage_ids",
    "busy_ms",
    "cpu_contention_ms",
    "dp_skew_ms",
    "peak_activation_bytes",
}


def test_analyze_writes_its_files_and_prints_the_table(tmp_path, capsys):
    run = gpipe_m1_run(tmp_path / "run")
    assert main(["analyze", str(run)]) == 0
    written = sorted(p.name for p in (run / "analysis").iterdir())
    assert written == [
        "cells.parquet",
        "critical.parquet",
        "format.json",
        "gaps.parquet",
        "ideal.parquet",
        "model.json",
        "ranks.parquet",
        "replay_inputs.parquet",
        "replay_tails.parquet",
        "schedule.json",
        "summary.json",
    ]
    assert not [p for p in run.iterdir() if p.name.startswith(".analysis")]  # no staging left behind
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary) and set(summary) - SUMMARY_KEYS == {
        "median_step",
        "clock",
        "inferred_cells",
        "parts",
        "notes",
        "nearest_schedule",
        "step_time_unprofiled_ms",
        "noise",
        "flags",
        "straggler",
        "whatif",
        "scope",
        "integrity",
        "trust",
        "verdict",
    }
    assert summary["parts"] == list(PART_KEYS)
    assert all(set(rank) == RANK_KEYS for rank in summary["ranks"])
    cells = pl.read_parquet(run / "analysis" / "cells.parquet")
    assert cells.columns == [
        "rank",
        "step",
        "stage",
        "kind",
        "microbatch",
        "start_ns",
        "end_ns",
        "blocked_ns",
        "inferred",
        "busy_ns",
        "compute_ns",
        "small_gemm_ns",
        "slowdown_ns",
        "cpu_contention_ns",
        "slack_ns",
    ]
    # no run.json here, so no calibration: the split of busy time is unknown
    assert cells["small_gemm_ns"].null_count() == cells["slowdown_ns"].null_count() == cells.height
    assert pl.read_parquet(run / "analysis" / "gaps.parquet").columns == [
        "rank",
        "step",
        "start_ns",
        "end_ns",
        "class",
    ]
    printed = capsys.readouterr().out
    assert (
        "formula 0.500" in printed
        and "busy-time 0.600" in printed
        and "seed unknown" in printed
        and "residual" in printed
    )


def test_a_long_run_s_residual_line_names_its_median_and_the_steps_furthest_from_zero():
    """One entry a step buried the summary on a long run (28,908 on one); past a few steps the line keeps
    the median and the steps furthest from zero, worst first."""
    shares = [0.001 * (i % 5) for i in range(100)]
    shares[37], shares[80] = -0.09, 0.05
    steps = [
        StepReplay(
            step=i,
            step_time_ms=100.0,
            replay_ms=100.0 * (1 - share),
            residual_ms=100.0 * share,
            opened_late_ms=0.0,
            ran_on_ms=0.0,
        )
        for i, share in enumerate(shares)
    ]
    line = residual_by_step(steps)
    assert line.startswith(
        "  completeness residual over 100 steps: median +0.2%, furthest from zero: 37 -9.0%, 80"
    )
    assert line.count("%") == 1 + STEPS_LISTED  # the median and each step named
    assert residual_by_step(steps[:3]).count("%") == 3  # a short run lists every step


def test_the_residual_line_names_the_unreplayed_waits_only_where_the_step_had_no_labelled_barrier():
    """Opening late and running on are named beside a positive residual they may explain; where the step
    ended in the labelled step-end barrier the replay took both, so naming them would mislead."""
    step = {
        "step_time_ms": 100.0,
        "replay_ms": 99.0,
        "residual_ms": 1.0,
        "opened_late_ms": 2.0,
        "ran_on_ms": 0.5,
    }
    foreign, ours = StepReplay(step=1, **step), StepReplay(step=2, step_end_barrier=True, **step)
    assert residual_by_step([foreign, ours]) == (
        "  completeness residual by step: 1 +1.0% (opened late 2.0, ran on 0.5 ms), 2 +1.0%"
    )


def test_rerun_replaces_the_previous_analysis(tmp_path):
    run = gpipe_m1_run(tmp_path / "run")
    assert main(["analyze", str(run)]) == 0
    (run / "analysis" / "stale.txt").write_text("from an older analysis")
    assert main(["analyze", str(run)]) == 0
    assert not (run / "analysis" / "stale.txt").exists()


def test_hint_that_disagrees_with_the_traces_is_an_input_error(tmp_path, capsys):
    run = gpipe_m1_run(tmp_path / "run")
    assert main(["analyze", str(run), "--m", "4"]) == 2
    assert "--m 4 disagrees" in capsys.readouterr().err
    assert main(["analyze", str(run), "--schedule", "gpipe", "--m", "1"]) == 0


def test_unlabelled_trace_is_an_input_error_naming_it(tmp_path, capsys):
    run = gpipe_m1_run(tmp_path / "run")
    write_trace(run, trace(1, [(0, 100)], cpu_action("1F0", 110, 120)))  # its only label is outside the step
    assert main(["analyze", str(run)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "rank1.json.gz" in error
    assert not (run / "analysis").exists()


@pytest.mark.parametrize(
    "name,p,m,v", [("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2), ("zb", 3, 6, 1), ("gpipe", 3, 4, 1)]
)
def test_without_run_json_the_schedule_is_inferred_from_the_labels(tmp_path, name, p, m, v):
    write_run(tmp_path, build(name, p, m, v), steps=1)
    (tmp_path / "run.json").unlink()
    summary = analyze_pipeline(read_run(tmp_path)).summary
    assert (summary.schedule, summary.p, summary.m, summary.v) == (name, p, m, v)
    assert summary.waterfall_ms.small_batches is None and summary.engine is None


def test_schedule_hint_that_disagrees_with_the_order_is_an_input_error(tmp_path, capsys):
    write_run(tmp_path, build("1f1b", 4, 8), steps=1)
    (tmp_path / "run.json").unlink()
    assert main(["analyze", str(tmp_path), "--schedule", "gpipe"]) == 2
    assert "--schedule gpipe disagrees with the traces' order (it matches 1f1b)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "hint, name, p, v",
    [("Interleaved1F1B", "interleaved", 2, 2), ("ScheduleGPipe", "gpipe", 2, 1), ("1F1B", "1f1b", 2, 1)],
)
def test_torchtitans_schedule_names_are_hints_too(tmp_path, hint, name, p, v):
    write_run(tmp_path, build(name, p, 4, v), steps=1)
    (tmp_path / "run.json").unlink()
    assert analyze_pipeline(read_run(tmp_path), schedule=hint).summary.schedule == name


def test_a_torch_order_no_generator_builds_is_a_hint_for_custom_and_a_typo_names_the_known(tmp_path, capsys):
    write_run(tmp_path, build("gpipe", 2, 4), steps=1)
    (tmp_path / "run.json").unlink()
    assert analyze_pipeline(read_run(tmp_path), schedule="LoopedBFS").summary.schedule == "gpipe"
    assert main(["analyze", str(tmp_path), "--schedule", "Interleaved1F1", "--m", "4"]) == 2
    error = capsys.readouterr().err
    assert "is no schedule name; known: gpipe, 1f1b" in error and "ZBVZeroBubble" in error


def test_a_crash_while_writing_leaves_the_previous_analysis_untouched(tmp_path, monkeypatch, capsys):
    """A write that fails (here: injected) is one line naming the place, never a traceback."""
    run = gpipe_m1_run(tmp_path / "run")
    assert main(["analyze", str(run)]) == 0
    before = (run / "analysis" / "summary.json").read_text()
    capsys.readouterr()

    def crash(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", crash)
    assert main(["analyze", str(run)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {run / 'analysis'}: cannot write here (disk full); the previous output, if any, is as it was\n"
    )
    assert (run / "analysis" / "summary.json").read_text() == before
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # staging removed


def test_torchtitans_profile_trace_folder_is_a_folder_of_runs_whose_latest_is_the_default(tmp_path, capsys):
    """profile_trace/iteration_N/rank{r}_trace.json, no run.json: each iteration is a run; `analyze` and
    `merge` on the folder take the highest iteration and say so; `report` lists every iteration."""
    folder = tmp_path / "profile_trace"
    for iteration, m in ((10, 2), (20, 4)):
        source = tmp_path / f"made{iteration}"
        write_run(source, build("1f1b", 2, m), steps=1)
        (folder / f"iteration_{iteration}").mkdir(parents=True)
        for rank in (0, 1):
            plain = gzip.decompress((source / f"rank{rank}.json.gz").read_bytes())
            (folder / f"iteration_{iteration}" / f"rank{rank}_trace.json").write_bytes(plain)
    assert main(["analyze", str(folder)]) == 0
    captured = capsys.readouterr()
    assert "1f1b p=2 m=4" in captured.out and "analysing the latest, iteration_20" in captured.err
    assert (folder / "iteration_20" / "analysis" / "summary.json").is_file()
    assert main(["merge", str(folder)]) == 0 and (folder / "iteration_20" / "merged.json.gz").is_file()
    index = build_report(folder, tmp_path / "reports").read_text()
    assert "iteration_10.html" in index and "iteration_20.html" in index
