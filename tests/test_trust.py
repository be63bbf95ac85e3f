"""The trust gate (docs/numbers.md#trust): a job that is not a pipeline is refused in one line that says
what it is instead; an analysed pipeline's trust is low, with its reasons, wherever one measured rule
holds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import REAL_TRACES, REPO, summary_of

from analysis.cells.inferred import cells_of
from analysis.errors import NotAPipeline
from analysis.schema import ClockEstimate, RankClock, RankIntegrity, Rules, StepReplay
from analysis.traces.integrity import PROBLEMS
from analysis.traces.load import read_trace
from analysis.trust.evidence import census_of
from analysis.trust.gate import pipeline_evidence, trust_of

DLRM = REAL_TRACES / "param_dlrm_8rank"
ALEXNET = REAL_TRACES / "hta" / "critical_path" / "alexnet"


def _command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analysis", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _copy(source: Path, tmp_path: Path) -> Path:
    run = tmp_path / source.name
    shutil.copytree(source, run)
    return run


def test_the_dlrm_job_is_not_a_pipeline_in_one_line_and_still_merges(tmp_path):
    """8 ranks of data parallelism with all_to_all: refused in one line that names what they do, with
    no analysis written; the merge still works."""
    run = _copy(DLRM, tmp_path)
    refused = _command("analyze", str(run))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        f"error: {run}: not a pipeline-parallel job: no send/recv between its 8 ranks and no pipeline "
        "labels; found all_to_all x 5, all_reduce x 3 per step (a rank's median)"
    ]
    assert not (run / "analysis").exists()
    merged = _command("merge", str(run))
    assert merged.returncode == 0, merged.stderr
    assert (run / "merged.json.gz").is_file()


def test_a_single_gpu_model_is_one_rank_and_no_pipeline(tmp_path):
    run = _copy(ALEXNET, tmp_path)
    refused = _command("analyze", str(run))
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"error: {run}: not a pipeline-parallel job: one rank, no send/recv and no pipeline labels; "
        "found no collectives either"
    ]


def _dlrm_census(keep: pl.Expr | None = None):
    trace = read_trace(sorted(DLRM.glob("*.json.gz"))[0])
    frame = trace.frame if keep is None else trace.frame.filter(keep)
    return census_of(frame, cells_of(frame, trace.path))


def test_sendrecv_kernels_are_hops_only_on_a_rank_without_all_to_all():
    """NCCL carries all_to_all on SendRecv kernels: DLRM's 5 a step are no hops while its all_to_all ops
    are in the trace, and are hops once they are not."""
    census = _dlrm_census()
    assert census.collectives == {"all_reduce": 3, "all_to_all": 5} and census.steps == 1
    assert (census.p2p_calls, census.p2p_kernels, census.hops) == (0, 0, False)
    without = _dlrm_census(~pl.col("name").str.contains("all_to_all|alltoall"))
    assert without.p2p_kernels == 5 and without.hops


def test_a_kind_recorded_at_the_backend_level_only_is_counted_there():
    """HTA's trace_diff rank: c10d::allreduce_ beside nccl:all_to_all (no c10d op of it): its SendRecv
    kernels carry the all_to_all, so they are no hops."""
    trace = read_trace(REAL_TRACES / "hta" / "trace_diff" / "test" / "test.json.gz")
    census = census_of(trace.frame, cells_of(trace.frame, trace.path))
    assert census.collectives == {"all_reduce": 3, "all_to_all": 7} and not census.hops


def test_send_and_recv_calls_make_a_pipeline_and_none_make_none():
    census = _dlrm_census()
    with pytest.raises(NotAPipeline):
        pipeline_evidence(DLRM, {0: census, 1: census})
    hopping = type(census)(steps=1, p2p_calls=2, p2p_kernels=0, labelled_cells=0, collectives={})
    pipeline_evidence(DLRM, {0: census, 1: hopping})  # one rank that sends is a pipeline's


def _steps(*residual_shares: float) -> list[StepReplay]:
    return [
        StepReplay(
            step=i,
            step_time_ms=100.0,
            replay_ms=100.0 * (1 - share),
            residual_ms=100.0 * share,
            opened_late_ms=0.0,
            ran_on_ms=0.0,
        )
        for i, share in enumerate(residual_shares)
    ]


def test_a_replay_that_misses_by_more_than_the_bound_makes_the_trust_low():
    bound = Rules().trust_residual_max
    assert trust_of(summary_of(replayed_steps=_steps(0.01, bound * 0.9)), cells=10).level == "high"
    low = trust_of(summary_of(replayed_steps=_steps(0.01, -bound * 1.1)), cells=10)
    assert low.level == "low" and len(low.reasons) == 1
    assert "misses 1 of 2 steps" in low.reasons[0] and "-11%" in low.reasons[0]


def test_mostly_inferred_cells_make_the_trust_low():
    steady = _steps(0.0)
    assert trust_of(summary_of(replayed_steps=steady, inferred_cells=5), cells=10).level == "high"
    low = trust_of(summary_of(replayed_steps=steady, inferred_cells=6), cells=10)
    assert low.level == "low" and low.reasons == [
        "6 of 10 cells inferred from the op stream (no pipeline labels): their kind and microbatch are guesses"
    ]


def test_a_clock_causality_could_not_pin_makes_the_trust_low():
    ranks = (RankClock(0, 0, 0, "reference"), RankClock(1, 0, None, "unlinked"))
    unpinned = ClockEstimate(0, ranks, transfers=0, collectives=0, inconsistent_pairs=())
    low = trust_of(summary_of(replayed_steps=_steps(0.0), clock=unpinned), cells=10)
    assert low.level == "low" and "rank(s) 1: no transfer or collective pins" in low.reasons[0]
    contradicted = ClockEstimate(0, ranks[:1], transfers=4, collectives=0, inconsistent_pairs=((0, 1),))
    low = trust_of(summary_of(replayed_steps=_steps(0.0), clock=contradicted), cells=10)
    assert low.level == "low" and "0-1 contradict one clock offset" in low.reasons[0]


def _counted(**counts) -> RankIntegrity:
    zero = dict.fromkeys(PROBLEMS, 0)
    return RankIntegrity(rank=0, events=100, **(zero | counts))


def test_a_rank_whose_trace_is_not_as_written_beyond_the_bound_makes_the_trust_low():
    """The integrity counts of a rank past `trust_integrity_max` of its events, string times aside."""
    steady = _steps(0.0)
    for counts, level in (
        ({"overrunning_slices": 1}, "high"),
        ({"overrunning_slices": 1, "missing_kernels": 1}, "low"),
        ({"string_timestamps": 50}, "high"),
        ({"outside_steps": 2}, "low"),
    ):
        trust = trust_of(summary_of(replayed_steps=steady, integrity=[_counted(**counts)]), cells=10)
        assert trust.level == level, (counts, trust)
    low = trust_of(summary_of(replayed_steps=steady, integrity=[_counted(overlapping_slices=3)]), cells=10)
    assert low.reasons == ["rank 0: overlapping slices 3 of its 100 events (trace integrity)"]
