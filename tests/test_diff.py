"""`diff`: pairs of synthetic runs whose steps vary as a machine's do (synthetic.noisy) decide whether it
tells a change from noise: two seeds of one configuration (A/A), and a run whose rank 0 sleeps inside
each forward (runners.inject's host stall) against its baseline."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
from conftest import DATA

import analysis.diff.compare as compare_module
from analysis.cli import main
from analysis.diff.compare import diff
from analysis.diff.figures import CALIBRATED, MS, ONE_VALUE, pipeline_ranks, whole_step
from analysis.diff.significance import TOO_FEW_STEPS, Outcome, compare
from analysis.job.run_dir import analysis_of
from runners.schedules import Action, Kind, build
from synthetic import write_run
from synthetic.data_parallel import write_job
from synthetic.executor_sim import HostTime
from synthetic.noisy import write_noisy_run

M = 4
SLEEP_MS = 2.0  # rank 0, inside each forward: M x this a step


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Directories: two A/A pairs (seeds 1, 2 and 3, 4) and rank 0 sleeping (seed 5)."""
    root = tmp_path_factory.mktemp("diff")
    schedule = build("gpipe", 4, M)
    found = {}
    for seed in range(1, 5):
        found[seed] = root / f"seed{seed}"
        write_noisy_run(found[seed], schedule, seed=seed)
    sleeps = {Action(0, Kind.F, i): round(SLEEP_MS * 1e6) for i in range(M)}
    found["sleep"] = root / "sleep"
    write_noisy_run(found["sleep"], schedule, seed=5, host=HostTime(sleeps=sleeps))
    return found


def _significant_share(changes) -> float:
    tested = [change for change in changes if change.why is None]
    return sum(change.significant for change in tested) / len(tested)


def _naive(a, b, unit, once):
    """The comparison without its test: every difference a change."""
    found = compare(a, b, unit, once)
    return Outcome(found.a, found.b, found.low, found.high, found.a != found.b, found.why)


def test_an_a_a_pair_shows_no_significant_change_in_nearly_all_figures(runs):
    for first, second in ((1, 2), (3, 4)):
        changes = diff(analysis_of(runs[first]), analysis_of(runs[second])).changes
        assert _significant_share(changes) <= 0.05, [c for c in changes if c.significant]


def test_without_the_significance_test_an_a_a_pair_regresses(runs, monkeypatch):
    """The A/A test above fails when every difference is called a change: the test is what passes it."""
    monkeypatch.setattr(compare_module, "compare", _naive)
    changes = diff(analysis_of(runs[1]), analysis_of(runs[2])).changes
    assert _significant_share(changes) > 0.05


def test_the_injected_host_time_is_the_largest_significant_change_and_compute_does_not_change(runs):
    changes = diff(analysis_of(runs[1]), analysis_of(runs["sleep"])).changes
    first = changes[0]
    assert (first.name, first.rank, first.significant) == ("launch_overhead", 0, True)
    assert first.delta == pytest.approx(M * SLEEP_MS, rel=0.15)
    assert not any(change.significant for change in changes if change.name in ("compute", "slowdown"))
    assert {change.why for change in changes if change.name == "compute"} == {CALIBRATED}
    on_path = next(change for change in changes if change.name == "critical_path.launch_overhead")
    assert on_path.significant and on_path.delta == pytest.approx(M * SLEEP_MS, rel=0.15)  # none in A
    step = next(change for change in changes if change.name == "step_time")
    assert step.significant and step.delta == pytest.approx(M * SLEEP_MS, rel=0.15)


def test_a_figure_with_one_value_per_run_or_runs_of_one_step_is_never_significant():
    assert compare((1.0,), (5.0,), MS, ONE_VALUE) == Outcome(1.0, 5.0, None, None, False, ONE_VALUE)
    assert compare((1.0,), (5.0,), MS).why == TOO_FEW_STEPS
    steady = compare((1.0, 1.0, 1.0), (1.0, 1.0, 1.0), MS)
    assert not steady.significant and (steady.low, steady.high) == (0.0, 0.0)
    three = compare((1.0, 1.1, 0.9), (3.0, 3.1, 2.9), MS)  # apart, but 1 pooled split in 10 is so by chance
    assert not three.significant and (three.low, three.high) == pytest.approx((1.8, 2.2))  # the extremes
    assert "STEPS=5" in three.why
    moved = compare((1.0, 1.1, 0.9, 1.05, 0.95), (3.0, 3.1, 2.9, 3.05, 2.95), MS)  # 1 split in 126
    assert moved.significant and moved.why is None
    assert compare((1.0, 1.1, 0.9, 1.05, 0.95), (3.0, 3.1, 2.9, 3.05, 2.95), MS) == moved  # seeded


def test_the_test_calls_a_change_in_about_one_a_a_pair_of_a_hundred():
    """Its level holds at the few steps runs profile (3 by default), where the bootstrap interval's did
    not (it flagged 11% of such pairs at 3 steps, 6% over 3-5): steps drawn from one distribution, 300
    pairs at each of 3, 4 and 5 steps, flagged at most 2% of the time (1% expected)."""
    rng = np.random.default_rng(5)
    pairs = [(tuple(rng.normal(size=n)), tuple(rng.normal(size=n))) for n in (3, 4, 5) for _ in range(300)]
    assert sum(compare(a, b, MS).significant for a, b in pairs) / len(pairs) <= 0.02


def test_fail_on_exits_1_on_the_injected_pair_naming_the_rule_and_0_on_an_a_a_pair(runs, tmp_path, capsys):
    rules = tmp_path / "rules.txt"
    rules.write_text("# the CI's gate\nlaunch_overhead:+2ms\n\nstep_time:+5%\n")
    assert main(["diff", str(runs[1]), str(runs["sleep"]), "--fail-on", f"@{rules}"]) == 1
    failed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fail:")]
    assert [line.split(":")[1].strip() for line in failed] == ["launch_overhead", "step_time"]
    assert main(["diff", str(runs[1]), str(runs[2]), "--fail-on", "launch_overhead:+2ms,step_time:+5%"]) == 0
    assert main(["diff", str(runs[1]), str(runs["sleep"]), "--fail-on", "launch_overhead:-2ms"]) == 0


def test_diff_json_holds_the_changes_significant_and_largest_first(runs, tmp_path):
    target = tmp_path / "diff.json"
    assert main(["diff", str(runs[1]), str(runs["sleep"]), "--json", str(target)]) == 0
    found = json.loads(target.read_text())
    assert (found["a"], found["b"]) == (str(runs[1]), str(runs["sleep"]))
    assert "permutation" in found["test"]
    ms_keys = {"name", "rank", "stage", "a_ms", "b_ms", "delta_ms", "low_ms", "high_ms", "significant"}
    first = found["changes"][0]
    assert ms_keys <= set(first) and (first["name"], first["rank"], first["stage"]) == (
        "launch_overhead",
        0,
        0,
    )
    bubble = next(c for c in found["changes"] if c["name"] == "bubble_measured")
    assert {"a", "b", "delta", "low", "high"} <= set(bubble) and "a_ms" not in bubble
    flags = [change["significant"] for change in found["changes"]]
    assert flags == sorted(flags, reverse=True)
    untested = next(c for c in found["changes"] if c["name"] == "host_time")
    assert untested["low_ms"] is None and untested["why"] == ONE_VALUE and not untested["significant"]


def test_the_formula_s_bubble_change_and_the_model_s_step_change_are_shown_beside_the_measured(
    runs, tmp_path, capsys
):
    more = tmp_path / "m8"
    write_noisy_run(more, build("gpipe", 4, 2 * M), seed=6)
    found = diff(analysis_of(runs[1]), analysis_of(more))
    measured = next(change for change in found.changes if change.name == "bubble_measured")
    formula = (3 / (2 * M + 3)) - (3 / (M + 3))
    assert measured.expected == pytest.approx(formula)
    assert measured.significant and measured.delta == pytest.approx(formula, abs=0.02)
    step = next(change for change in found.changes if change.name == "step_time")
    predicted = {prediction.m: prediction.step_time_ms for prediction in analysis_of(runs[1]).predictions}
    assert step.expected == pytest.approx(predicted[2 * M] - predicted[M])
    assert step.delta == pytest.approx(step.expected, rel=0.05)  # the same work per microbatch at any m
    assert main(["diff", str(runs[1]), str(more), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert f"(formula {formula:+.4f})" in out and f"(model {step.expected:+.3f} ms)" in out


def test_runs_of_another_p_are_compared_by_their_whole_step_only(runs, tmp_path):
    other = tmp_path / "p2"
    write_noisy_run(other, build("gpipe", 2, M), seed=7)
    found = diff(analysis_of(runs[1]), analysis_of(other))
    assert all(change.rank is None for change in found.changes)
    assert found.notes == ["p or v differs: no rank or stage of A is one of B's, whole-step figures only"]


@pytest.mark.parametrize(
    "arguments",
    [
        ["MISSING", "A"],
        ["A", "A", "--fail-on", "step:+5%"],
        ["A", "A", "--fail-on", "p2p_wait:+0.02"],
        ["A", "A", "--fail-on", "step_time:5%"],
        ["A", "A", "--fail-on", "@MISSING"],
    ],
    ids=["no-run", "unknown-figure", "unit", "no-sign", "no-rules-file"],
)
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys, arguments):
    places = {"A": str(runs[1]), "MISSING": str(tmp_path / "missing")}
    argv = ["diff", *(places.get(a, a.replace("MISSING", places["MISSING"])) for a in arguments)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_each_step_s_bubble_is_the_summary_s_formula_on_that_step(runs):
    """bubble_measured per step, read from ranks.parquet, is summary.json's on the median step."""
    analysis = analysis_of(runs[1])
    bubble = next(figure for figure in whole_step(analysis) if figure.name == "bubble_measured")
    steps = sorted(replayed.step for replayed in analysis.summary.replayed_steps)
    at_median = bubble.values[steps.index(analysis.summary.median_step)]
    assert at_median == pytest.approx(analysis.summary.bubble_measured, abs=1e-9)


def test_runs_of_one_step_say_that_nothing_can_be_called_significant(runs, tmp_path, capsys):
    one = tmp_path / "one"
    write_noisy_run(one, build("gpipe", 4, M), seed=8, steps=1)
    assert main(["diff", str(one), str(runs["sleep"]), "--fail-on", "launch_overhead:+2ms"]) == 0
    out = capsys.readouterr().out
    assert TOO_FEW_STEPS in out and "0 of " in out.splitlines()[-1]


def test_an_op_level_job_of_two_pipelines_against_itself_changes_nothing(tmp_path):
    """ByteDance StragglerAnalysis's job ST (PP4 x DP2, 32 steps): matched rank to rank, the straggler
    compared, nothing significant."""
    run = tmp_path / "ST"
    shutil.copytree(DATA / "stragglers", run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the job's own overlapping slices, said by analyze
        found = diff(analysis_of(run), analysis_of(run))
    assert {change.rank for change in found.changes} == {None, *range(8)}
    assert any(change.name == "straggler" for change in found.changes)
    assert not any(change.significant for change in found.changes)


def test_runs_of_one_p_and_other_layouts_are_matched_stage_to_stage(tmp_path):
    """A PP x DP job against one pipeline: each stage's rank in the job's slowest pipeline against the
    pipeline's."""
    write_job(tmp_path / "job", build("1f1b", 2, M), 2, slow_pipeline=1, slow_factor=1.2)
    write_run(tmp_path / "one", build("1f1b", 2, M))
    job, one = analysis_of(tmp_path / "job"), analysis_of(tmp_path / "one")
    found = diff(job, one)
    assert "the layouts differ: ranks matched by stage in each run's slowest pipeline" in found.notes
    staged = {(change.rank, change.stage) for change in found.changes if change.name == "bubble"}
    assert staged == {(None, 0), (None, 1)}
    slowest = pipeline_ranks(job.summary)
    assert slowest == job.summary.pipelines[1].ranks
    bubble = next(c for c in found.changes if c.name == "bubble" and c.stage == 0)
    assert bubble.a == pytest.approx(job.parts.filter(rank=slowest[0])["bubble_ms"].median())


def test_traces_without_run_json_are_compared_with_compute_measured_per_step(runs, tmp_path):
    """Anyone's traces (no run.json, no calibration): compute is the busy time of each step, tested."""
    for name in (1, "sleep"):
        (tmp_path / str(name)).mkdir()
        for trace in runs[name].glob("rank*.json.gz"):
            shutil.copy(trace, tmp_path / str(name))
    changes = diff(analysis_of(tmp_path / "1"), analysis_of(tmp_path / "sleep")).changes
    assert (changes[0].name, changes[0].rank) == ("launch_overhead", 0)
    compute = [change for change in changes if change.name == "compute"]
    assert compute and all(change.why is None and not change.significant for change in compute)
