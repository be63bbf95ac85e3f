"""One process's trace of P ranks on one GPU (mode single_gpu) read as P ranks (analysis.cells.virtual_ranks):
runs of the independent generator (synthetic.executor_single_gpu: one file, a compute and a copy stream
per rank, one host thread) recover each virtual rank's true parts, and the split keeps every other run
as it is. The layout, split and refusal tests use the old generator (synthetic.generate) for a valid
trace only."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from analysis.cells.virtual_ranks import RECEIVE, split, virtual_ranks
from analysis.errors import InputError
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.traces.run import load_run
from runners.schedules import build
from runners.schedules.single_gpu import SINGLE_GPU
from runners.schedules.trace_names import CUDA_PEAK_COUNTER, STASH_COUNTER
from synthetic import OptionError, write_run
from synthetic.executor_sim import EAGER, HostTime, Transport
from synthetic.executor_trace import stalls_before, write_executor_run
from synthetic.single_gpu import PID

INJECTED = dict(
    durations_us={"F": 1000, "B": 2000, "I": 1000, "W": 1000},
    p2p_latency_us=50,
    small_gemm=1.1,
    slowdown=1.25,
    steps=3,
)  # the old generator's (synthetic.generate), for the layout and refusal tests
US = 1_000
CASES = {  # schedule, host stalls (the one host thread falls behind every rank's device)
    "gpipe": (build("gpipe", 4, 8), {}),
    "gpipe m=1": (build("gpipe", 4, 1), {}),
    "1f1b": (build("1f1b", 4, 8), {}),
    "interleaved": (build("interleaved", 2, 4, 2), {}),
    "zb": (build("zb", 3, 6), {}),
    "zbv": (build("zbv", 3, 6, 2), {}),
    # issued 12 ms late, rank 1's RECV_F2 comes after its copy: the stream idles for the host
    "1f1b, a receive issued after its copy": (build("1f1b", 2, 4), {"1RECV_F2": 12_000 * US}),
    # every rank's later work issued late: both ranks' devices idle for the host
    "1f1b, a stall before rank 0's receive": (build("1f1b", 2, 4), {"0RECV_B1": 14_000 * US}),
}
PARTS = ("compute", "small_gemm", "slowdown", "bubble", "p2p_wait", "launch_overhead", "other")


@pytest.mark.parametrize("case", CASES)
def test_one_process_of_p_streams_is_analysed_as_p_ranks_with_their_parts(tmp_path, case):
    """Ground truth from the independent generator (synthetic.executor_single_gpu): every part of every
    virtual rank to 1 ns, and the step."""
    schedule, stalls = CASES[case]
    host = HostTime(before_ns=1 * US, inside_ns=2 * US, stalls=stalls_before(stalls))
    write_executor_run(
        tmp_path,
        schedule,
        durations_us=INJECTED["durations_us"],
        transport=Transport(EAGER, 50 * US),
        host=host,
        shape=SINGLE_GPU,
        small_gemm=1.1,
        slowdown=1.25,
    )
    assert sorted(path.name for path in tmp_path.glob("rank*")) == ["rank0.json.gz"]
    truth = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    summary = analyze_pipeline(read_run(tmp_path)).summary
    assert (summary.p, summary.schedule, summary.device) == (schedule.p, schedule.name, "cuda")
    assert summary.step_time_ms * 1e6 == pytest.approx(truth["step_ns"], abs=1)
    assert [rank.rank for rank in summary.ranks] == list(range(schedule.p))
    for rank in summary.ranks:
        true = truth["ranks"][str(rank.rank)]["parts_ns"]
        misses = {
            part: (rank.part_ms(part) * 1e6, true[part])
            for part in PARTS
            if rank.part_ms(part) * 1e6 != pytest.approx(true[part], abs=1)
        }
        assert not misses, (rank.rank, misses)
    assert sum(rank.p2p_wait_ms for rank in summary.ranks) > 0  # the hops were seen, once each
    assert summary.waterfall_ms.residual == pytest.approx(0, abs=1e-6)


def test_the_backward_is_launched_from_autograd_s_thread_and_still_is_its_labels(tmp_path):
    """On CUDA autograd's engine thread launches a B's kernels while its label waits on the main thread;
    the synthetic trace does so, and the B cells span their kernels (else the order could not run)."""
    write_run(tmp_path, build("gpipe", 2, 2), shape=SINGLE_GPU, **INJECTED)
    events = json.loads(gzip.decompress((tmp_path / "rank0.json.gz").read_bytes()))["traceEvents"]
    launch_threads = {e["tid"] for e in events if e.get("name") == "cudaLaunchKernel"}
    assert launch_threads == {PID, PID + 1}
    cells = analyze_pipeline(read_run(tmp_path)).cells
    backward = cells.filter(pl.col("kind") == "B")
    assert (
        backward.height == 2 * 2 * 3
        and (backward["end_ns"] - backward["start_ns"]).min() == 2_000_000 * 1.1 * 1.25
    )


def test_the_split_gives_each_rank_its_own_work_and_every_rank_the_shared_events(tmp_path):
    write_run(tmp_path, build("1f1b", 2, 4), shape=SINGLE_GPU, **INJECTED)
    run = load_run(tmp_path)
    (trace,) = run.traces
    frames = split(trace.frame, trace.path)
    assert sorted(frames) == [0, 1]
    kernels = [frame.filter(pl.col("cat") == "kernel") for frame in frames.values()]
    assert sum(k.height for k in kernels) == trace.frame.filter(pl.col("cat") == "kernel").height
    assert (
        all(k["stream"].n_unique() == 1 for k in kernels)
        and kernels[0]["stream"][0] != kernels[1]["stream"][0]
    )
    for rank, frame in frames.items():
        assert frame["rank"].unique().to_list() == [rank]
        labels = frame.filter(pl.col("name").str.starts_with("PP:") & (pl.col("cat") == "user_annotation"))
        assert labels["name"].str.slice(3, 1).unique().to_list() == [str(rank)]  # its stage only
        assert frame.filter(pl.col("name").str.starts_with("ProfilerStep")).height == 3  # every rank's
        derived = frame.filter(pl.col("index").is_null())
        # one receive and its runtime row per RECV: 4 microbatches x 3 steps, forward or backward
        assert derived.height == 2 * 4 * 3 and (derived["correlation"] < 0).all()
        assert derived.filter(pl.col("cat") == "gpu_memcpy")["name"].unique().to_list() == [RECEIVE]


@pytest.mark.parametrize("shape", ["gpu", "cpu"])
def test_runs_of_one_process_per_rank_are_left_as_they_are(tmp_path, shape):
    write_run(tmp_path, build("gpipe", 2, 2), shape=shape, **INJECTED)
    run = load_run(tmp_path)
    assert virtual_ranks(run) is run


def test_one_stage_per_process_is_not_split(tmp_path):
    """A P=1 run (or anyone's single-process trace) computes on one stream: one rank, as it is."""
    write_run(tmp_path, build("interleaved", 1, 2, 2), shape="gpu", **INJECTED)
    run = load_run(tmp_path)
    assert virtual_ranks(run) is run


def test_the_only_trace_of_a_bigger_job_is_that_rank_not_virtual_ranks(tmp_path):
    """One process's trace of two streams, but its distributedInfo says rank 0 of 4 (one rank of a job
    whose other traces are not here): its own rank, not two virtual ranks 0 and 1."""
    write_run(tmp_path, build("1f1b", 2, 4), shape=SINGLE_GPU, **INJECTED)
    (tmp_path / "run.json").unlink()
    path = tmp_path / "rank0.json.gz"
    document = json.loads(gzip.decompress(path.read_bytes()))
    document["distributedInfo"] = {"rank": 0, "world_size": 4}
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    run = load_run(tmp_path)
    assert virtual_ranks(run) is run and run.missing == [(1, 3)]


def test_run_json_saying_single_gpu_without_the_layout_is_refused(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 2), shape="gpu", **INJECTED)
    config = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps(config | {"mode": SINGLE_GPU}))
    with pytest.raises(InputError, match="says mode single_gpu"):
        read_run(tmp_path)


def test_run_json_p_must_match_the_ranks_the_trace_holds(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 2), shape=SINGLE_GPU, **INJECTED)
    config = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps(config | {"p": 3}))
    with pytest.raises(InputError, match="p=3 but its trace holds 2 ranks"):
        read_run(tmp_path)


@pytest.mark.parametrize(
    "options,words",
    [
        ({"launch_gap_us": 20}, "launch gaps"),
        ({"clock_offset_ns": {1: 5_000}}, "clock offsets"),
        ({"labels": False}, "labelled"),
        ({"durations_us": {"F": 1, "B": 2}}, "before the host issued it"),
    ],
)
def test_what_one_process_cannot_show_is_refused_by_the_generator(tmp_path, options, words):
    with pytest.raises(OptionError, match=words):
        write_run(tmp_path, build("gpipe", 2, 4), shape=SINGLE_GPU, **{**INJECTED, **options})


def test_each_virtual_rank_keeps_the_stash_samples_taken_in_its_labels(tmp_path):
    """The engine samples what a rank holds for backward inside that rank's actions; the allocator's step
    peak (outside every action) is the whole GPU's, every rank's, and the stash is preferred."""
    write_run(tmp_path, build("gpipe", 2, 2), shape=SINGLE_GPU, **INJECTED)
    path = tmp_path / "rank0.json.gz"
    document = json.loads(gzip.decompress(path.read_bytes()))
    events = document["traceEvents"]
    steps = {e["name"]: e for e in events if e.get("name", "").startswith("ProfilerStep")}
    step_1 = steps["ProfilerStep#1"]
    counters = []
    for rank in (0, 1):
        forward = next(
            e
            for e in events
            if e.get("name") == f"PP:{rank}F0" and e["cat"] == "user_annotation" and e["ts"] > step_1["ts"]
        )
        counters.append(
            {"ph": "C", "name": STASH_COUNTER, "pid": PID, "tid": PID, "ts": forward["ts"] + 0.5}
            | {"args": {"microbatches": 1, "activation_bytes": 1000 * (rank + 1)}}
        )
    counters.append(
        {"ph": "C", "name": CUDA_PEAK_COUNTER, "pid": PID, "tid": PID, "ts": step_1["ts"] + 1}
        | {"args": {"peak_bytes_above_step_start": 10**9}}
    )
    path.write_bytes(gzip.compress(json.dumps(document | {"traceEvents": events + counters}).encode()))
    memory = read_run(tmp_path).memory
    assert memory.peak_bytes(1) == {0: 1000, 1: 2000}
    cuda = memory.peaks.filter(pl.col("source") == "cuda_peak")
    assert sorted(cuda["rank"].to_list()) == [0, 1] and set(cuda["peak_bytes"].to_list()) == {10**9}
