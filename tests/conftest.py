"""Inputs the tests share: real Kineto traces nobody on this project wrote, kept in tests/data/real-traces
(each file's repository, commit, licence and trimming in its PROVENANCE.md), and the place for real GPU
pipeline runs; a summary to vary in tests of what reads one; and the `python -m runners trace` command
the real torchrun runs start from. Test modules import these names (`from conftest import REAL_TRACES`),
as they import the trace builders from test_cells.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from places import Place

from analysis.schema import CriticalShare, Noise, RankEntry, Rules, StepReplay, Summary, Waterfall

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
REAL_TRACES = DATA / "real-traces"
# Every real trace file, for the tests that hold for all of them (the loader, the merge).
REAL_FILES = sorted(REAL_TRACES.rglob("*.json.gz"))
# Run directories (run.json + one trace per rank) from scripts/gpu_check.sh on a CUDA machine.
PIPELINE_GPU = DATA / "pipeline_gpu"


def real_id(path: Path) -> str:
    """A real trace's test id: its path under tests/data/real-traces."""
    return str(path.relative_to(REAL_TRACES))


def real_traces_in(folder: str) -> list[Path]:
    """The trace files of one folder under tests/data/real-traces; a folder that is missing or empty is
    an error, not an empty list, so a test cannot pass by looping over nothing."""
    found = sorted((REAL_TRACES / folder).glob("*.json.gz"))
    if not found:
        raise FileNotFoundError(f"no *.json.gz traces in {REAL_TRACES / folder}")
    return found


def gunzipped(path: Path) -> bytes:
    """A .json.gz file's JSON text."""
    return gzip.decompress(path.read_bytes())


def trace_command(traces: Path, *options: str) -> list[str]:
    """`python -m runners trace` with `options` (e.g. `*"--sched 1f1b --p 2 --m 4".split()`), its run
    directories under `traces`; to be run in REPO. For the tests that start it themselves: the ones that
    expect a refusal, read its output or stop it mid-run."""
    return [sys.executable, "-m", "runners", "trace", *options, "--traces", str(traces)]


def trace_run(traces: Path, *options: str, timeout: float = 300) -> Path:
    """Run trace_command to the end and return the run directory it made (traces/latest resolved); a run
    that fails fails the test with its stderr's tail, not at the next missing file."""
    result = subprocess.run(
        trace_command(traces, *options), cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return (traces / "latest").resolve()


@pytest.fixture
def place(tmp_path):
    """A folder that a test can make full or read-only (tests/places.py); unmounted after it."""
    made = Place(tmp_path / "place")
    try:
        yield made
    finally:
        made.close()


# The real PP x DP job the DP tests share (test_dp_runs, test_dp_analysis_runs), gloo on the tiny preset.
DP_JOB = {"p": 2, "dp": 2, "m": 4, "steps": 3}


@pytest.fixture(scope="session")
def dp_job_run(tmp_path_factory):
    """`dp_job_run(engine, overlap)`: DP_JOB's 1f1b run directory on that engine, its gradients synced after
    the last backward or overlapped with it; each started once for the whole session (a torchrun job of
    four ranks costs ~15 s of a loaded `make test`). The tests only read it."""
    made: dict[tuple[str, bool], Path] = {}

    def run(engine: str, overlap: bool) -> Path:
        if (engine, overlap) not in made:
            options = "--sched 1f1b --p {p} --dp {dp} --m {m} --steps {steps} --timed-steps 1".format(
                **DP_JOB
            )
            made[engine, overlap] = trace_run(
                tmp_path_factory.mktemp(f"dp-{engine}"),
                *options.split(),
                *f"--engine {engine} --preset tiny --device cpu".split(),
                *(["--dp-overlap"] if overlap else []),
            )
        return made[engine, overlap]

    return run


def rank_entry_of(**fields) -> RankEntry:
    """Rank 0's entry of summary_of's step (6 ms busy, 4 ms bubble) with `fields` changed."""
    entry = RankEntry(
        rank=0,
        stage_ids=[0],
        compute_ms=6.0,
        small_gemm_ms=None,
        slowdown_ms=None,
        busy_ms=6.0,
        cpu_contention_ms=None,
        bubble_ms=4.0,
        p2p_wait_ms=0.0,
        launch_overhead_ms=0.0,
        other_ms=0.0,
        peak_activation_bytes=None,
    )
    return msgspec.structs.replace(entry, **fields)


def summary_of(peak_bytes: int | None = None, **fields) -> Summary:
    """A gpipe p=2 m=4 summary (waterfall 6 + 2 + 0.5 + 1 + 1 + 0.25 + 0.5 - 1.25 = 10 ms) with `fields` changed; with
    `peak_bytes`, one rank entry holding that peak (for what reads summaries: the index, the sweeps)."""
    waterfall = Waterfall(
        ideal=6.0,
        fill_drain=2.0,
        imbalance=0.5,
        small_batches=None,
        interference=None,
        host_time=1.0,
        transfer=1.0,
        tail=0.25,
        variability=0.5,
        residual=-1.25,
    )
    ranks = [] if peak_bytes is None else [rank_entry_of(peak_activation_bytes=peak_bytes)]
    base = Summary(
        schedule="gpipe",
        nearest_schedule=None,
        engine="native",
        device="cpu",
        p=2,
        m=4,
        v=1,
        steps_analyzed=1,
        median_step=0,
        step_time_ms=10.0,
        step_time_unprofiled_ms=9.5,
        bubble_formula=0.2,
        bubble_measured=0.3,
        bubble_seed=None,
        typical_step_ms=10.5,
        waterfall_ms=waterfall,
        waterfall_shapley_ms=waterfall,
        replayed_steps=[
            StepReplay(
                step=0,
                step_time_ms=10.0,
                replay_ms=11.25,
                residual_ms=-1.25,
                opened_late_ms=0.0,
                ran_on_ms=0.0,
            )
        ],
        critical_path=[CriticalShare(part="compute", stage=0, ms=11.25)],
        parts=(),
        ranks=ranks,
        rules=Rules(),
        clock=None,
        inferred_cells=0,
        noise=Noise(profiled_spread=0.0, unprofiled_spread=0.05, profiler_cost=10.0 / 9.5),
        flags=[],
        notes=[],
    )
    return msgspec.structs.replace(base, **fields)
