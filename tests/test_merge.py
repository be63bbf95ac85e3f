"""The merged trace: valid for Perfetto, one process per rank, aligned clocks, arrows per transfer, limits."""

from __future__ import annotations

import gzip
import json
import shutil

import polars as pl
import pytest
from conftest import trace_run

from analysis.cells.labelled import CELL_KEY, rank_cells
from analysis.cli import main
from analysis.errors import InputError
from analysis.job.run_dir import analyze_dir
from analysis.merge.merged import merge
from analysis.merge.perfetto_check import problems
from analysis.merge.sources import read_ranks
from analysis.schema import ClockEstimate
from analysis.traces.load import read_trace
from analysis.traces.run import load_run
from runners.schedules import build
from synthetic import generate as synthetic
from synthetic.data_parallel import write_job
from synthetic.executor_sim import EAGER, RENDEZVOUS, Transport
from synthetic.executor_trace import write_executor_run

MS = 1_000_000
US = 1_000
OFFSETS = {0: 0, 1: 4_700 * US, 2: -5 * MS, 3: 1_234_567}


def merged_run(directory, shape: str) -> tuple[dict, ClockEstimate]:
    """A skewed 1f1b run from the independent generator (gloo's rendezvous or NCCL's eager 50 us hops),
    analysed and merged; the trace and the clock it was aligned with."""
    transport = Transport(EAGER if shape == "gpu" else RENDEZVOUS, 50 * US)
    write_executor_run(
        directory, build("1f1b", 4, 8), transport=transport, clock_offset_ns=OFFSETS, shape=shape
    )
    analysis = analyze_dir(directory)
    return merge(read_ranks(directory, None), None, analysis), analysis.summary.clock


def flows(trace: dict, cat: str) -> dict[int, dict[str, dict]]:
    found: dict[int, dict[str, dict]] = {}
    for event in trace["traceEvents"]:
        if event["ph"] in ("s", "f") and event["cat"] == cat:
            found.setdefault(event["id"], {})[event["ph"]] = event
    return found


def thread_names(trace: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("name") == "thread_name"
    }


@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_synthetic_skew_recovered_and_trace_valid(tmp_path, shape):
    trace, estimate = merged_run(tmp_path, shape)
    assert problems(trace) == []
    for rank, offset in OFFSETS.items():
        assert abs(estimate.offset_ns(rank) + offset) <= 50 * US, (rank, estimate.offset_ns(rank))
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert names == [f"rank {r} · stage {r}" for r in range(4)]
    arrows = flows(trace, "p2p")
    assert len(arrows) == estimate.transfers  # one arrow per transfer the cells show
    for arrow in arrows.values():
        assert abs(arrow["s"]["pid"] - arrow["f"]["pid"]) == 1
        assert arrow["f"]["ts"] >= arrow["s"]["ts"]  # causal once aligned (unaligned, 5 ms skews break this)
    assert estimate.transfers == 3 * 2 * 3 * 8  # steps x directions x stage boundaries x microbatches


def test_every_gpu_transfer_cell_is_its_one_nccl_kernel(tmp_path):
    synthetic.write_run(
        tmp_path, build("1f1b", 4, 8), p2p_latency_us=50, clock_offset_ns=OFFSETS, shape="gpu"
    )
    for trace in load_run(tmp_path).traces:
        found = rank_cells(trace.frame, trace.path)
        transfers = found.cells.filter(pl.col("kind").str.contains("SEND|RECV"))
        nccl = (
            found.kernels.filter("is_p2p")
            .group_by(CELL_KEY)
            .agg(pl.len(), pl.col("start_ns").min().alias("k_start"))
        )
        matched = transfers.join(nccl, on=CELL_KEY)
        assert matched.height == transfers.height == 3 * 8 * (1 if trace.rank in (0, 3) else 2) * 2
        assert (matched["len"] == 1).all() and (matched["start_ns"] == matched["k_start"]).all()


def test_gpu_arrows_start_on_nccl_kernels_and_launch_flows_stay_in_their_rank(tmp_path):
    trace, _ = merged_run(tmp_path, "gpu")
    threads = thread_names(trace)
    for arrow in flows(trace, "p2p").values():
        assert threads[(arrow["s"]["pid"], arrow["s"]["tid"])].startswith("GPU")
        assert threads[(arrow["f"]["pid"], arrow["f"]["tid"])].startswith("GPU")
    launches = flows(trace, "ac2g")
    assert launches, "the synthetic GPU trace has launch -> kernel flows"
    # every rank numbers its correlations from 1; renumbered, no flow may link two ranks
    assert all(ends["s"]["pid"] == ends["f"]["pid"] for ends in launches.values())


def test_cli_limits_steps_and_ranks_and_says_so(tmp_path, capsys):
    synthetic.write_run(tmp_path / "run", build("gpipe", 4, 4), clock_offset_ns=OFFSETS, steps=3)
    out = tmp_path / "limited.json.gz"
    assert main(["merge", str(tmp_path / "run"), "--steps", "1", "--ranks", "1-2", "--out", str(out)]) == 0
    assert "steps [1] of ranks [1, 2] (limited by --steps/--ranks)" in capsys.readouterr().out
    trace = json.loads(gzip.decompress(out.read_bytes()))
    assert problems(trace) == []
    kept = {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    steps = {
        e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith("ProfilerStep")
    }
    assert kept == {1, 2} and steps == {"ProfilerStep#1"}
    assert trace["pipelineMerge"]["limited"].endswith("(limited by --steps/--ranks)")
    clock = trace["pipelineMerge"]["clock"]  # the analysis's, over every rank: rank 0 is the reference
    assert set(clock) == {"reference_rank", "ranks", "transfers", "collectives", "inconsistent_pairs"}
    offsets = {entry["rank"]: entry["offset_ns"] for entry in clock["ranks"]}
    assert clock["reference_rank"] == 0 and abs(offsets[2] + OFFSETS[2]) <= 50 * US


def test_overlapping_slices_move_to_a_named_overlap_thread(tmp_path):
    events = [
        {"ph": "X", "name": "outer", "cat": "cpu_op", "pid": 7, "tid": 7, "ts": 0, "dur": 10},
        {"ph": "X", "name": "straddles", "cat": "cpu_op", "pid": 7, "tid": 7, "ts": 5, "dur": 10},
        {"ph": "X", "name": "inside", "cat": "cpu_op", "pid": 7, "tid": 7, "ts": 6, "dur": 2},
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    trace = merge(read_ranks(path, None), None, None)
    assert problems(trace) == []
    threads = thread_names(trace)
    placed = {e["name"]: threads[(e["pid"], e["tid"])] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert placed["straddles"].endswith("overlap 1") and placed["outer"] == "thread 7"
    assert placed["inside"] == placed["outer"]  # 'inside' nests in 'outer' (first layer that fits)


def test_two_files_claiming_one_rank_is_one_line_error(tmp_path, capsys):
    synthetic.write_run(tmp_path, build("gpipe", 2, 2))
    shutil.copy(tmp_path / "rank0.json.gz", tmp_path / "copy.json.gz")
    with pytest.raises(InputError, match="two files claim rank 0"):
        read_ranks(tmp_path, None)
    assert main(["merge", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def test_empty_folder_and_unwritable_output_are_input_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["merge", str(tmp_path / "empty")]) == 2
    synthetic.write_run(tmp_path / "run", build("gpipe", 2, 2))
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["merge", str(tmp_path / "run"), "--out", str(blocker / "merged.json.gz")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert (
        len(lines) == 2 and "no trace files" in lines[0] and "cannot write here (Not a directory)" in lines[1]
    )
    assert read_trace(tmp_path / "run" / "rank0.json.gz").rank == 0  # the run itself untouched


@pytest.mark.slow
def test_real_two_rank_cpu_run_analyses_and_merges_valid(tmp_path, capsys):
    """A real gloo 1F1B run (torchrun, tiny preset): analyse, merge, and the merged trace is valid, with
    one arrow per transfer and the analysis gap track on both ranks."""
    options = "--sched 1f1b --p 2 --m 4 --preset tiny --device cpu --steps 2 --timed-steps 1"
    run = trace_run(tmp_path, *options.split())
    assert main(["analyze", str(run)]) == 0 and main(["merge", str(run)]) == 0
    trace = json.loads(gzip.decompress((run / "merged.json.gz").read_bytes()))
    assert problems(trace) == []
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert names == ["rank 0 · stage 0", "rank 1 · stage 1"]
    arrows = flows(trace, "p2p")
    assert len(arrows) == 2 * 2 * 4  # profiled steps x directions x microbatches
    assert all(a["s"]["pid"] != a["f"]["pid"] and a["f"]["ts"] >= a["s"]["ts"] for a in arrows.values())
    gap_threads = [name for name in thread_names(trace).values() if name.startswith("analysis · gaps")]
    assert len(gap_threads) == 2
    assert any(e.get("cat") == "analysis" and e["ph"] == "X" for e in trace["traceEvents"])


def test_cli_keeps_the_pipelines_asked_for(tmp_path, capsys):
    run = tmp_path / "run"
    write_job(run, build("1f1b", 2, 2), 3, slow_pipeline=1, slow_factor=1.2, sync_us=500.0)
    out = tmp_path / "one.json.gz"
    assert main(["merge", str(run), "--pipelines", "1", "--out", str(out)]) == 0
    wanted = json.loads((run / "analysis" / "summary.json").read_text())["pipelines"][1]["ranks"]
    trace = json.loads(gzip.decompress(out.read_bytes()))
    assert sorted({e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"}) == sorted(wanted) == [1, 4]
    # File names that disagree with the traces' own ranks: the whole run is read, each trace its own rank.
    names = [run / "rank1.json.gz", run / "rank4.json.gz", tmp_path / "moved"]
    for first, second in ((0, 2), (1, 0), (2, 1)):
        names[first].rename(names[second])
    swapped = tmp_path / "swapped.json.gz"
    assert main(["merge", str(run), "--pipelines", "1", "--out", str(swapped)]) == 0
    swapped_trace = json.loads(gzip.decompress(swapped.read_bytes()))
    assert swapped_trace["traceEvents"] == trace["traceEvents"]
    assert swapped_trace["pipelineMerge"]["sources"] == {"1": "rank4.json.gz", "4": "rank1.json.gz"}
    for first, second in ((0, 2), (1, 0), (2, 1)):
        names[first].rename(names[second])
    # With the analysis on disk the other ranks' files are not read: a corrupt one changes nothing.
    (run / "rank0.json.gz").write_bytes(b"not gzip")
    again = tmp_path / "again.json.gz"
    assert main(["merge", str(run), "--ranks", "4", "--out", str(again)]) == 0
    assert main(["merge", str(run), "--pipelines", "1", "--out", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()
    capsys.readouterr()
    assert main(["merge", str(run), "--pipelines", "1-3"]) == 2
    assert capsys.readouterr().err == f"error: {run}: has no pipeline 3 (its analysis found 3, from 0)\n"
