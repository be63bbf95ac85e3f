"""Delays injected on purpose into real 2-rank gloo runs (`python -m runners trace --inject`), against the
same runs without them in alternating A/B pairs: the analysis must put each delay where it belongs.

The cases and the figures read from each summary are bench/inject.py's (`python -m bench --only inject`
runs more pairs and reports every pair's delta without a verdict); the targets are here, each stated once
with the spread that bench measured, and asserted on the median over these tests' pairs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from conftest import trace_run

from analysis.job.run_dir import analyze_dir
from analysis.vocabulary import Effect, GapClass
from bench.inject import HOST, SLOW, Case, measured, recovery

pytestmark = pytest.mark.slow

# The verdict on the same runs (docs/numbers.md#verdict). host:0:20 at m=4: the largest finding is
# launch_overhead, its change rank 0's F host time, recovering the 80 ms injected within the stall's
# tolerance above. slow:1:4 at m=4 holds layers [8, 32]: layers that cost alike are evened by [20, 20],
# 12 moved to stage 0. How many move follows each stage's measured busy time per layer, which a loaded
# machine moves by tens of percent (one loaded run of this test moved 9; quiet slow:1:2 runs move the
# 4 of 4, bench and the closing figures): the test holds the direction, the count is a measurement.

# Spreads measured by `python -m bench --only inject --inject-pairs N` on 2 shared cores with the heap kept
# (no page faults in the steps): 6 pairs at load 0-3.4 and 8 at load 3-8 ("quiet" and "loaded" below).

# host:0:20 at gpipe m=4, 80 ms injected a step. The bounds are the issue's Done-means: rank 0's
# launch_overhead grows by 80 ms within 15%, its busy time by at most 12 ms. Measured single pairs:
# launch_overhead 80.1-82.4 ms quiet, 80.6-89.5 loaded (medians of 2: 1.01-1.08 of 80 ms); busy 0.6-1.3 ms.
HOST_STALL_TOLERANCE = 0.15
HOST_BUSY_GROWTH_MAX_MS = 12.0
# Rank 1 waits for each stalled forward (gpipe): its bubble grows by this share of the stall at least.
# Measured single pairs 0.97-1.15, one loaded pair 0.28 (medians of 2 of the loaded 8: 0.62-1.09).
HOST_PEER_BUBBLE_SHARE_MIN = 0.5

# slow:1:4 at gpipe m=4 on the cpu preset, 218-303 ms more work a step (3 x stage 1's calibrated F + B).
# Its imbalance delta as a share of its pair's injected, median over the pairs. Measured single pairs
# 83-87 ms of 218-236 quiet, 0.29-0.45 loaded (medians of 3: 0.33-0.42); before the heap was kept 0.24-0.60 at load
# 4-9 (medians of 3: 0.27-0.40). Work read as anything else takes it towards 0; half or twice it is wrong.
SLOW_IMBALANCE_SHARE = (0.2, 0.6)
# small_batches and interference (the waterfall's small-GEMM and slowdown effects): |median delta over the
# pairs| within their bands. small_batches's spread shrank
# with the heap kept: single pairs 7-17 ms quiet, -24..57 loaded (medians of 3: 9-49 ms), against -78..160
# before (9 pairs, load 1.3-7, which set the old 100 ms): 60 ms now. slowdown's swings with the machine:
# 5..372 ms (median 64) and -66..511 loaded (median 227; medians of 3: 82-406) on a noisy day; on a quiet one
# 1.6..25.1 (median 4.1, 5 pairs, load 1.2-1.5), and -59..26 (median 15) where one baseline waited 48.7 ms
# for a core. The bench reports the slowed rank's cpu_contention beside it; under two busy loops (load
# 1.2-3.8, 5 pairs) the slowdown delta read -44..24 (median 16) and the slowed rank's slowdown delta
# followed its cpu_contention delta pair by pair (3.9/5.7, 46.1/54.0, -25.7/-21.9, 12.6/17.8, 28.3/28.8
# ms): the swings are run-queue delay, which a loaded machine adds to the longer stage. The band is kept.
SLOW_SMALL_BATCHES_BAND_MS = 60.0
SLOW_INTERFERENCE_BAND_MS = 100.0


def paired_runs(tmp_path, case: Case, pairs: int) -> tuple[list[Path], list[Path]]:
    """`pairs` A/B pairs' run directories, baseline first (alternating, so a drift of the machine's speed
    hits both)."""
    baseline, injected = [], []
    for _ in range(pairs):
        baseline.append(trace_run(tmp_path, *case.options(injected=False)))
        injected.append(trace_run(tmp_path, *case.options(injected=True)))
    return baseline, injected


def paired_recovery(case: Case, runs: tuple[list[Path], list[Path]]) -> dict:
    baseline, injected = runs
    return recovery(case, [measured(run) for run in baseline], [measured(run) for run in injected])


@pytest.fixture(scope="module")
def host_runs(tmp_path_factory) -> tuple[list[Path], list[Path]]:
    """HOST's two pairs, shared: the critical-path test reads the first injected run (a run of its own
    cost a torchrun job, ~26 s of a loaded `make test`)."""
    return paired_runs(tmp_path_factory.mktemp("host"), HOST, pairs=2)


def missed(checks: dict[str, bool]) -> list[str]:
    """The figures whose check failed: every check is evaluated, so a failure names them all."""
    return [figure for figure, met in checks.items() if not met]


def deltas(result: dict) -> dict[str, tuple[float, float]]:
    """Per figure, the median over the pairs of its delta (ms) and of that delta's share of the injected."""
    return {f["figure"]: (f["delta_ms"]["median"], f["share"]["median"]) for f in result["figures"]}


def test_a_host_stall_is_launch_overhead_on_its_rank_and_bubble_on_the_next(host_runs):
    """host:R:X at m: rank R's launch_overhead grows by m*X (within HOST_STALL_TOLERANCE), its busy time by
    at most HOST_BUSY_GROWTH_MAX_MS (the stall is no work), and rank R+1 waits for it, as bubble."""
    result = paired_recovery(HOST, host_runs)
    assert result["injected_ms"]["median"] == HOST.m * HOST.injected.amount
    found = deltas(result)
    checks = {
        "launch_overhead": abs(found["launch_overhead"][1] - 1) <= HOST_STALL_TOLERANCE,
        "busy": found["busy"][0] <= HOST_BUSY_GROWTH_MAX_MS,
        "peer_bubble": found["peer_bubble"][1] >= HOST_PEER_BUBBLE_SHARE_MIN,
    }
    assert all(checks.values()), (missed(checks), json.dumps(result, indent=1))


@pytest.fixture(scope="module")
def slow_runs(tmp_path_factory) -> tuple[list[Path], list[Path]]:
    """SLOW's three pairs, shared by the waterfall's test and the verdict's."""
    return paired_runs(tmp_path_factory.mktemp("slow"), SLOW, pairs=3)


def test_a_slow_stage_is_imbalance_not_small_gemm_or_slowdown(slow_runs):
    """slow:S:K: the added work is real and its own calibration has it, so the waterfall's imbalance grows
    by its share of that work (SLOW_IMBALANCE_SHARE) and small_batches and interference stay within their
    band."""
    result = paired_recovery(SLOW, slow_runs)
    found = deltas(result)
    low, high = SLOW_IMBALANCE_SHARE
    checks = {
        "imbalance": low <= found["imbalance"][1] <= high,
        "small_batches": abs(found["small_batches"][0]) <= SLOW_SMALL_BATCHES_BAND_MS,
        "interference": abs(found["interference"][0]) <= SLOW_INTERFERENCE_BAND_MS,
    }
    assert all(checks.values()), (missed(checks), json.dumps(result, indent=1))


def test_the_stalled_forwards_lie_on_the_critical_path(host_runs):
    """host:0:20 on gpipe m=4: rank 0's every forward sleeps 20 ms first, and rank 1 waits for each, so
    the median step's critical path holds that host time inside rank 0's forwards: all four stalls, no
    less than 85% of the 80 ms each (the path takes what the replay took; a stall off the path, or the
    path skipping rank 0's forwards, fails)."""
    _, injected = host_runs
    analysis = analyze_dir(injected[0])
    path = analysis.critical.filter(pl.col("step") == analysis.summary.median_step)
    stalls = path.filter(
        (pl.col("rank") == 0) & (pl.col("kind") == "F") & (pl.col("part") == "launch_overhead")
    )
    assert stalls.height == HOST.m
    stalled_ms = (stalls["end_ns"] - stalls["start_ns"]).sum() / 1e6
    assert stalled_ms >= 0.85 * HOST.m * HOST.injected.amount, path


def test_the_verdict_puts_the_host_stall_first_with_its_recoverable_time(host_runs):
    """Each injected run's first finding is the host time, its change rank 0's forwards; what that change
    recovers (the typical step less its predicted step: the replay without rank 0's F host time) is the
    injected m x X within HOST_STALL_TOLERANCE, and the finding's recoverable time, all host time's
    ceiling, is no less (the stall lies on the critical path: test_the_stalled_forwards_lie_on_the_critical_path)."""
    _, injected = host_runs
    injected_ms = HOST.m * HOST.injected.amount
    for run in injected:
        summary = analyze_dir(run).summary
        first = summary.verdict.findings[0]
        assert (first.kind, first.rank) == (Effect.HOST, 0), first
        assert first.action.startswith("cut rank 0's F host time"), first
        change_ms = summary.typical_step_ms - first.predicted_step_ms
        assert abs(change_ms / injected_ms - 1) <= HOST_STALL_TOLERANCE, (change_ms, first)
        assert first.recoverable_ms >= change_ms - 1e-6, first


def test_the_verdict_names_the_baselines_largest_shapley_effect_first(host_runs):
    """Without the stall, the first finding rests on the effect whose Shapley value is largest: the
    verdict's ranking (each effect's gain ceiling) and the waterfall's agree on the top."""
    baseline, _ = host_runs
    for run in baseline:
        summary = analyze_dir(run).summary
        shapley = summary.waterfall_shapley_ms
        top = max(Effect, key=lambda effect: getattr(shapley, effect) or 0.0)
        of_effects = {*Effect, GapClass.DP_SYNC}  # a dp_sync finding is a piece of the tail effect
        kinds = [
            f.kind.replace(GapClass.DP_SYNC, Effect.TAIL)
            for f in summary.verdict.findings
            if f.kind in of_effects
        ]
        assert kinds[0] == top, (kinds, shapley)


def test_the_verdict_names_the_slow_stage_and_the_layers_to_move(slow_runs):
    """slow:1:4: the imbalance finding is stage 1's, and its change moves layers from stage 1 to stage 0,
    in every injected run."""
    _, injected = slow_runs
    for run in injected:
        imbalance = next(f for f in analyze_dir(run).summary.verdict.findings if f.kind == Effect.IMBALANCE)
        assert imbalance.stage == 1, imbalance
        moved = re.fullmatch(
            r"move (\d+) layer\(s\) from stage 1 to stage 0 \(layers \[8, 32\] -> .*\)", imbalance.action
        )
        assert moved and int(moved[1]) >= 1, imbalance
