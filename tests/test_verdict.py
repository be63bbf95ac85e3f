"""The verdict (docs/numbers.md#verdict): findings ranked by what the replay recovers without them, each
a change with its predicted step; nothing recommended where the evidence is weak. Synthetic runs whose
every duration is chosen, so each figure is worked out by hand."""

from __future__ import annotations

import json

import msgspec
import pytest

from analysis.job.join import analyze_job
from analysis.job.run_dir import analyze_dir, read_run
from analysis.schema import Trust
from analysis.verdict import balance
from analysis.verdict.verdict import verdict_of
from runners.schedules import build
from synthetic.executor_dp import write_executor_job
from synthetic.generate import write_run

# gpipe p=2 m=4, no host time or latency: stage 0's F and B take 1 and 2 ms, stage 1's twice that.
# The step is (m + p - 1) slots of the slow stage's... worked out: rank 0 forwards 0-4 ms, rank 1
# forwards 1-9 and backwards 9-25, rank 0's last backward 25-27: 27 ms. Each stage at the mean (F 1.5,
# B 3 ms) is gpipe's (m + p - 1) x (F + B) = 22.5 ms: the imbalance recovers 4.5 ms.
SLOW_STAGE_US = {"F": 1000, "B": 2000, (1, "F"): 2000, (1, "B"): 4000}
STEP_MS, EVEN_MS = 27.0, 22.5


@pytest.fixture(scope="module")
def slow_stage(tmp_path_factory):
    run = tmp_path_factory.mktemp("verdict") / "run"
    write_run(run, build("gpipe", 2, 4), durations_us=SLOW_STAGE_US)
    return run


def _with_config(run, **changes):
    config = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(config | changes))
    return analyze_dir(run)


def test_a_slow_stage_is_the_top_finding_with_what_evening_it_recovers(slow_stage):
    summary = analyze_dir(slow_stage).summary
    assert summary.step_time_ms == pytest.approx(STEP_MS)
    top = summary.verdict.findings[0]
    assert (top.kind, top.stage, top.rank) == ("imbalance", 1, 1)
    assert top.recoverable_ms == pytest.approx(STEP_MS - EVEN_MS)
    assert top.predicted_step_ms == pytest.approx(EVEN_MS)
    assert summary.verdict.recommends and summary.trust.level == "high"
    assert "stage 1 the slowest in 3 of 3 steps" in top.evidence


def test_with_layers_per_stage_the_change_is_the_layers_to_move(tmp_path):
    """4 layers a stage: stage 0's cost 3 ms a step each, stage 1's 6 ms. Five and three even them at
    18 ms a stage: one layer moves to stage 0, and the replay of that split is the even step."""
    run = tmp_path / "run"
    write_run(run, build("gpipe", 2, 4), durations_us=SLOW_STAGE_US)
    dims = json.loads((run / "run.json").read_text())["dims"] | {"layers_per_stage": 4}
    top = _with_config(run, dims=dims).summary.verdict.findings[0]
    assert top.action == "move 1 layer(s) from stage 1 to stage 0 (layers [4, 4] -> [5, 3])"
    assert top.predicted_step_ms == pytest.approx(EVEN_MS)


def test_a_gain_inside_the_runs_own_spread_recommends_nothing(tmp_path):
    """The same 4.5 ms against unprofiled steps that spread 5 ms (not enough to flag the run noisy)."""
    run = tmp_path / "run"
    write_run(run, build("gpipe", 2, 4), durations_us=SLOW_STAGE_US)
    verdict = _with_config(run, step_times_unprofiled_ms=[25.0, 27.0, 30.0]).summary.verdict
    assert not verdict.recommends
    assert verdict.sentences[-1].startswith("Nothing recommended: its largest change (imbalance")
    assert "inside the run's own step-to-step spread (5.0 ms)" in verdict.sentences[-1]


def test_low_trust_recommends_nothing_and_says_why(slow_stage):
    analysis = analyze_dir(slow_stage)
    config = json.loads((slow_stage / "run.json").read_text())
    low = Trust(level="low", reasons=["the replay misses"])
    verdict = verdict_of(analysis, config, low)
    assert not verdict.recommends
    assert verdict.sentences[-1] == "Nothing recommended: the trust is low (the replay misses)."
    assert msgspec.json.decode(msgspec.json.encode(verdict)) == msgspec.to_builtins(verdict)


@pytest.mark.parametrize(
    ("layers", "work", "split", "said"),
    [
        ([8, 16], [10.0, 40.0], [14, 10], "move 6 layer(s) from stage 1 to stage 0"),
        ([8, 8], [10.0, 10.0], [8, 8], "keep the split"),
        # each layer of stage 2 costs 4, the others 1: only 2, 1, 1 keeps every stage at 4 or less
        (
            [1, 1, 2],
            [1.0, 1.0, 8.0],
            [2, 1, 1],
            "move 1 layer(s) from stage 1 to stage 0; 1 layer(s) from stage 2 to stage 1",
        ),
    ],
)
def test_the_even_split_minimises_the_slowest_stage(layers, work, split, said):
    assert balance.even_split(layers, work) == split
    assert balance.moves(layers, split) == said


def test_a_slower_replica_is_the_straggler_finding_naming_one_of_its_ranks(tmp_path):
    """synthetic.executor_dp: replica 1's compute 1.5x: the straggler finding recovers its measured lag
    and names a rank of that replica."""
    write_executor_job(
        tmp_path,
        build("1f1b", 2, 4),
        2,
        durations_us={"F": 1000.0, "B": 2000.0},
        slow_replica=1,
        slow_factor=1.5,
    )
    summary = analyze_job(read_run(tmp_path)).summary
    straggler = next(f for f in summary.verdict.findings if f.kind == "straggler")
    assert (
        straggler.recoverable_ms == pytest.approx(summary.straggler.slower_ms)
        and straggler.recoverable_ms > 0
    )
    assert straggler.rank in summary.pipelines[1].ranks
