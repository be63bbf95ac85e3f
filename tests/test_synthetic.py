"""Synthetic traces: the injected truth closes, matches hand arithmetic, and is what the trace files say."""

from __future__ import annotations

import json

import polars as pl
import pytest

from analysis.traces.load import load_run
from runners.schedules import build
from synthetic.generate import BASE_TIME_NS, ORIGIN_NS, main, synthesize, write_run

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)]


@pytest.mark.parametrize("name, v", SCHEDULES)
@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_parts_sum_to_the_step_on_every_rank(name, v, shape):
    result = synthesize(build(name, 4, 8, v), p2p_latency_us=40, launch_gap_us=7, slowdown=1.25, shape=shape)
    for truth in result.truth.values():
        parts = (
            truth.compute_ns
            + truth.small_gemm_ns
            + truth.launch_overhead_ns
            + truth.p2p_wait_ns
            + truth.bubble_ns
        )
        assert parts == truth.step_ns
        assert truth.bubble_ns >= 0
        assert truth.small_gemm_ns == pytest.approx(
            0.25 * truth.compute_ns, abs=len(result.cells[truth.rank])
        )


def test_gpipe_two_ranks_by_hand():
    # F0(1000) -> 50 latency -> F1(1000) B1(2000) -> 50 latency -> B0(2000): step 6100 us.
    result = synthesize(build("gpipe", 2, 1), durations_us={"F": 1000, "B": 2000}, p2p_latency_us=50)
    first, last = result.truth[0], result.truth[1]
    assert first.step_ns == 6_100_000
    assert (first.compute_ns, first.p2p_wait_ns, first.bubble_ns) == (3_000_000, 50_000, 3_050_000)
    # rank 1 waits 1000 for F0 to be produced, 50 for the hop, and idles 2050 at the tail.
    assert (last.compute_ns, last.p2p_wait_ns, last.bubble_ns) == (3_000_000, 50_000, 3_050_000)


def test_launch_gaps_and_slowdown_are_counted_per_compute_action():
    schedule = build("1f1b", 2, 4)
    result = synthesize(schedule, launch_gap_us=10, slowdown={(0, "F"): 2.0})
    # 4 F + 4 B on rank 0, but its first (0F0) begins the device's step: no gap before it
    assert result.truth[0].launch_overhead_ns == 7 * 10_000
    assert result.truth[0].small_gemm_ns == 4 * 1_000_000  # F at twice the reference 1000 us
    assert result.truth[1].small_gemm_ns == 0


@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_written_run_loads_and_its_labels_sit_where_the_cells_are(tmp_path, shape):
    offsets = {0: 0, 1: 3_000_000}
    result = write_run(
        tmp_path, build("1f1b", 2, 4), shape=shape, steps=2, clock_offset_ns=offsets, p2p_latency_us=5
    )
    run = load_run(tmp_path)
    assert run.world_size == 2 and run.config["complete"] is True
    assert list(run.config)[-1] == "complete"
    cat = "gpu_user_annotation" if shape == "gpu" else "user_annotation"
    labels = run.frame().filter((pl.col("cat") == cat) & pl.col("name").str.starts_with("PP:"))
    step = result.truth[0].step_ns
    for rank, cells in result.cells.items():
        mine = labels.filter(pl.col("rank") == rank).sort("start_ns")
        assert mine.height == 2 * len(cells)
        compute = [c for c in cells if c.action.kind.is_compute]
        expected = [
            BASE_TIME_NS + ORIGIN_NS + offsets[rank] + s * step + c.start for s in range(2) for c in compute
        ]
        got = mine.filter(pl.col("name").str.contains(r"PP:\d+[FBIW]\d+$"))["start_ns"].to_list()
        assert got == expected
    steps = run.frame().filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert steps.height == 4
    if shape == "cpu":
        assert ((steps["end_ns"] - steps["start_ns"]) == step).all()


def test_gpu_host_labels_follow_one_another_inside_their_step():
    """As in real GPU traces: one host thread issues in order, so no two PP labels share a span (comm
    actions the device starts at one instant included), and every step's launches lie inside its own
    host ProfilerStep span, which begins before them while the device still runs the previous step."""
    result = synthesize(build("1f1b", 4, 8), shape="gpu", steps=3, launch_gap_us=5, p2p_latency_us=10)
    for rank, document in result.traces.items():
        events = document["traceEvents"]
        host = [e for e in events if e.get("cat") == "user_annotation"]
        labels = [e for e in host if e["name"].startswith("PP:")]
        steps = sorted((e for e in host if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        assert len(labels) == 3 * len(result.cells[rank])
        ordered = sorted(labels, key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(ordered, ordered[1:]))
        per_step = len(result.cells[rank])
        for number, step in enumerate(steps):
            mine = ordered[number * per_step : (number + 1) * per_step]
            assert step["ts"] < mine[0]["ts"] and mine[-1]["ts"] + mine[-1]["dur"] <= step["ts"] + step["dur"]
        kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel")
        step0_end = max(end for _, end in kernels[:per_step])
        if rank == 0:  # 1F1B's first rank computes to the step's end: the host is ahead of it
            assert steps[1]["ts"] < step0_end


def test_gpu_kernels_pair_with_launches_by_correlation(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 2), shape="gpu", launch_gap_us=3)
    frame = load_run(tmp_path).frame()
    kernels = frame.filter(pl.col("cat") == "kernel")
    launches = frame.filter(pl.col("cat") == "cuda_runtime")
    joined = kernels.join(launches, on=["rank", "correlation"], suffix="_launch")
    assert joined.height == kernels.height > 0
    assert (joined["end_ns_launch"] <= joined["start_ns"]).all()
    flows = frame.filter(pl.col("cat") == "ac2g")
    assert (
        flows.filter(pl.col("ph") == "s").height == flows.filter(pl.col("ph") == "f").height == kernels.height
    )
    streams = set(kernels["stream"].to_list())
    assert streams == {7, 20}


def test_calibration_is_the_whole_batch_at_reference_speed(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 4), durations_us={"F": 500, "B": 1500, (1, "F"): 800}, slowdown=1.5)
    calibration = json.loads((tmp_path / "run.json").read_text())["calibration"]
    assert calibration["0"] == {"F_ms": 2.0, "B_ms": 6.0}
    assert calibration["1"]["F_ms"] == pytest.approx(3.2)


def test_cli_writes_a_run_and_refuses_bad_requests(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                str(out),
                "--schedule",
                "1f1b",
                "--p",
                "2",
                "--m",
                "4",
                "--shape",
                "gpu",
                "--p2p-latency-us",
                "20",
                "--clock-offset-ms",
                "0",
                "1.5",
            ]
        )
        == 0
    )
    assert load_run(out).world_size == 2
    truth = json.loads((out / "truth.json").read_text())
    assert [t["p2p_wait_ns"] > 0 for t in truth] == [True, True]
    assert main([str(tmp_path / "bad"), "--p", "2", "--clock-offset-ms", "1"]) == 2
    assert main([str(tmp_path / "bad"), "--schedule", "gpipe", "--p", "0"]) == 2
    assert "error:" in capsys.readouterr().err
