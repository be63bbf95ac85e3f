"""Synthetic traces: the injected truth closes, matches hand arithmetic, and is what the trace files say."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from analysis.traces.kineto import BACKWARD_OP_PREFIX
from analysis.traces.run import load_run
from runners.schedules import Action, Kind, Schedule, build, lower, simulate
from runners.schedules.dependencies import matching_recv, matching_send
from synthetic import batched as batching
from synthetic import shapes
from synthetic.cli import main
from synthetic.generate import BASE_TIME_NS, ORIGIN_NS, OptionError, synthesize, write_run
from synthetic.orders import blocked_gpipe, deeper_warmup_1f1b, reverse_backward_gpipe

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)]


@pytest.mark.parametrize("name, v", SCHEDULES)
@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_parts_sum_to_the_step_on_every_rank(name, v, shape):
    result = synthesize(
        build(name, 4, 8, v), p2p_latency_us=40, launch_gap_us=7, small_gemm=1.1, slowdown=1.25, shape=shape
    )
    for truth in result.truth.values():
        assert sum(truth.parts_ns().values()) == truth.step_ns
        assert truth.bubble_ns >= 0
        rounding = len(result.cells[truth.rank])  # 1 ns per cell
        assert truth.small_gemm_ns == pytest.approx(0.1 * truth.compute_ns, abs=rounding)
        assert truth.slowdown_ns == pytest.approx(0.25 * 1.1 * truth.compute_ns, abs=rounding)


def test_gpipe_two_ranks_by_hand():
    # F0(1000) -> 50 latency -> F1(1000) B1(2000) -> 50 latency -> B0(2000): step 6100 us.
    result = synthesize(build("gpipe", 2, 1), durations_us={"F": 1000, "B": 2000}, p2p_latency_us=50)
    first, last = result.truth[0], result.truth[1]
    assert first.step_ns == 6_100_000
    assert (first.compute_ns, first.p2p_wait_ns, first.bubble_ns) == (3_000_000, 50_000, 3_050_000)
    # rank 1 waits 1000 for F0 to be produced, 50 for the hop, and idles 2050 at the tail.
    assert (last.compute_ns, last.p2p_wait_ns, last.bubble_ns) == (3_000_000, 50_000, 3_050_000)


def test_launch_gaps_small_gemm_and_slowdown_are_counted_per_compute_action():
    schedule = build("1f1b", 2, 4)
    result = synthesize(schedule, launch_gap_us=10, small_gemm={(0, "F"): 1.5}, slowdown={(0, "F"): 2.0})
    # 4 F + 4 B on rank 0, but its first (0F0) begins the device's step: no gap before it
    assert result.truth[0].launch_overhead_ns == 7 * 10_000
    assert result.truth[0].small_gemm_ns == 4 * 500_000  # F alone at its size takes 1.5 x 1000 us
    assert result.truth[0].slowdown_ns == 4 * 1_500_000  # and twice that in the pipeline
    assert result.truth[1].small_gemm_ns == result.truth[1].slowdown_ns == 0


def test_at_one_microbatch_the_isolated_time_is_the_whole_batch():
    truth = synthesize(build("gpipe", 2, 1), small_gemm=1.5, slowdown=1.2).truth[0]
    assert truth.small_gemm_ns == 0 and truth.slowdown_ns == pytest.approx(0.2 * truth.compute_ns)


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


def test_calibration_is_the_whole_batch_at_reference_speed_and_one_microbatch_alone(tmp_path):
    durations = {"F": 500, "B": 1500, (1, "F"): 800}
    write_run(tmp_path, build("gpipe", 2, 4), durations_us=durations, small_gemm=1.2, slowdown=1.5)
    config = json.loads((tmp_path / "run.json").read_text())
    assert config["calibration"]["0"] == {"F_ms": 2.0, "B_ms": 6.0}
    assert config["calibration"]["1"]["F_ms"] == pytest.approx(3.2)
    rows = config["dims"]["microbatch_rows"]
    assert len(rows) == 4 and config["dims"]["rows"] == sum(rows)
    by_rows = config["calibration_by_rows"]["1"]
    assert by_rows[str(sum(rows))] == config["calibration"]["1"]  # the whole batch
    assert by_rows[str(rows[0])]["F_ms"] == pytest.approx(0.8 * 1.2)  # one microbatch alone, not slowed


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


# Unlabelled runs: the same run as torch.profiler records a loop that labels nothing.

UNLABELLED = {
    "gpipe": build("gpipe", 4, 8),
    "1f1b": build("1f1b", 4, 8),
    "reverse-gpipe": reverse_backward_gpipe(3, 4),
}
INJECTED = dict(p2p_latency_us=40, launch_gap_us=7, slowdown=1.25, steps=2)
OUTER_OPS = ("aten::linear", "c10d::recv_", "c10d::send", f"{BACKWARD_OP_PREFIX} MmBackward0")


def _events(document, *cats):
    return [e for e in document["traceEvents"] if e.get("cat") in cats]


def _timed(events):
    return sorted((e["ts"], e["dur"], e["name"], e.get("args", {}).get("correlation")) for e in events)


def _true_ns(result, rank, ts_us):
    """A trace time (no clock offset) as (step, ns into that step on the rank's true clock)."""
    ns = round(ts_us * 1000) - ORIGIN_NS
    step_ns = result.truth[rank].step_ns
    return ns // step_ns, ns % step_ns


@pytest.mark.parametrize("name", UNLABELLED)
@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_unlabelled_run_is_the_labelled_run_without_its_labels(tmp_path, name, shape):
    schedule, offsets = UNLABELLED[name], {0: 0, 1: 3_000_000, 2: -2_000_000}
    labelled = synthesize(schedule, shape=shape, clock_offset_ns=offsets, **INJECTED)
    result = write_run(tmp_path, schedule, shape=shape, clock_offset_ns=offsets, labels=False, **INJECTED)
    assert result.truth == labelled.truth and result.cells == labelled.cells
    frame = load_run(tmp_path).frame()
    assert frame.filter(pl.col("name").str.starts_with("PP:")).height == 0
    assert frame.filter(pl.col("cat") == "gpu_user_annotation").height == 0
    for rank, document in result.traces.items():
        before = labelled.traces[rank]
        kept = [e for e in before["traceEvents"] if not e.get("name", "").startswith("PP:")]
        if shape == "cpu":  # every op where it was; only the labels and op names and numbers differ
            ops = [e for e in document["traceEvents"] if e["ph"] == "X"]
            assert sorted((e["cat"], e["ts"], e["dur"]) for e in ops) == sorted(
                (e["cat"], e["ts"], e["dur"]) for e in kept if e["ph"] == "X"
            )
            continue
        for cats in (("kernel",), ("cuda_runtime",)):  # every kernel and launch, its time and correlation
            assert _timed(_events(document, *cats)) == _timed(_events(before, *cats))
        flows = [(e["ph"], e["id"], e["ts"], e["pid"]) for e in _events(document, "ac2g")]
        assert sorted(flows) == sorted((e["ph"], e["id"], e["ts"], e["pid"]) for e in _events(before, "ac2g"))
        steps = [
            (e["ts"], e["dur"]) for e in document["traceEvents"] if e["name"].startswith("ProfilerStep#")
        ]
        assert steps == [(e["ts"], e["dur"]) for e in kept if e["name"].startswith("ProfilerStep#")]
        # each action's outermost op spans its old label
        outer = sorted((e["ts"], e["dur"]) for e in document["traceEvents"] if e["name"] in OUTER_OPS)
        labels = sorted(
            (e["ts"], e["dur"]) for e in _events(before, "user_annotation") if e["name"][:3] == "PP:"
        )
        assert outer == labels


@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_unlabelled_backward_ops_carry_their_forwards_sequence_numbers(shape):
    """Every op with a sequence number, placed in the cell it computes (CPU: by time; GPU: through the
    kernel its launch started): a forward op in an F, a backward op in a B whose numbers are among the
    forward ops' of its own step and microbatch, each (step, microbatch) with numbers of its own."""
    result = synthesize(reverse_backward_gpipe(3, 4), shape=shape, labels=False, launch_gap_us=5, steps=2)
    for rank, document in result.traces.items():
        events = document["traceEvents"]
        kernels = {e["args"]["correlation"]: e for e in _events(document, "kernel")}
        launches = _events(document, "cuda_runtime")
        numbers: dict[tuple[str, int, int], list[int]] = {}
        for op in (e for e in events if "Sequence number" in e.get("args", {})):
            when = op["ts"]
            if shape == "gpu":  # the launch inside the op, on its thread -> its kernel's start
                launch = next(
                    e
                    for e in launches
                    if e["tid"] == op["tid"]
                    and op["ts"] <= e["ts"]
                    and e["ts"] + e["dur"] <= op["ts"] + op["dur"]
                )
                when = kernels[launch["args"]["correlation"]]["ts"]
            step, ns = _true_ns(result, rank, when)
            cell = next(c for c in result.cells[rank] if c.start <= ns < c.end)
            backward = op["name"].startswith(BACKWARD_OP_PREFIX)
            assert cell.action.kind is (Kind.B if backward else Kind.F), (op["name"], cell)
            key = (cell.action.kind.value, step, cell.action.microbatch)
            numbers.setdefault(key, []).append(op["args"]["Sequence number"])
        forwards = {(step, mb): set(n) for (kind, step, mb), n in numbers.items() if kind == "F"}
        computes = [c.action for c in result.cells[rank] if c.action.kind.is_compute]
        assert len(numbers) == 2 * len(computes)  # every F and B of both steps has its ops
        assert len(set().union(*forwards.values())) == sum(len(n) for n in forwards.values())  # distinct
        for (kind, step, mb), got in numbers.items():
            if kind == "B":
                assert set(got) <= forwards[step, mb]


def test_unlabelled_gpu_backward_runs_on_the_autograd_thread(tmp_path):
    write_run(tmp_path, build("1f1b", 2, 4), shape="gpu", labels=False, steps=2)
    run = load_run(tmp_path)
    for rank, document in enumerate(
        json.loads(gzip.decompress(p.read_bytes())) for p in _rank_files(tmp_path)
    ):
        pid = 4000 + rank
        names = {e["tid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
        assert names[pid + 1].endswith("(pt_autograd_0)") and names[pid].endswith("(python)")
        host = [e for e in document["traceEvents"] if e.get("pid") == pid and e["ph"] == "X"]
        on_autograd = {e["name"] for e in host if e["tid"] == pid + 1}
        assert on_autograd == {f"{BACKWARD_OP_PREFIX} MmBackward0", "cudaLaunchKernel"}
        assert not [e for e in host if e["tid"] == pid and e["name"].startswith(BACKWARD_OP_PREFIX)]
        backward_launches = [e for e in host if e["tid"] == pid + 1 and e["cat"] == "cuda_runtime"]
        assert len(backward_launches) == 2 * 4  # one per B, 4 a step
    frame = run.frame()
    assert frame.filter(pl.col("tid") == pl.col("pid") + 1).height > 0


def _rank_files(directory):
    return sorted(directory.glob("rank*.json.gz"))


@pytest.mark.parametrize(
    "schedule, options, why",
    [
        (build("zb", 3, 6), {}, "F and B"),
        (build("interleaved", 2, 4, 2), {}, "one stage per rank"),
        (blocked_gpipe(2, 4, 2), {}, "one stage per rank"),
        (build("1f1b", 2, 4), {"batched": True, "shape": "cpu"}, "GPU-shaped and unlabelled"),
        (build("1f1b", 2, 4), {"batched": True, "shape": "gpu", "labels": True}, "GPU-shaped and unlabelled"),
    ],
    ids=["zb", "interleaved", "blocked-gpipe", "batched-cpu", "batched-labelled"],
)
def test_what_cannot_be_written_unlabelled_is_refused_saying_why(tmp_path, schedule, options, why):
    options = {"labels": False, **options}
    with pytest.raises(OptionError, match=why) as refused:
        write_run(tmp_path / "run", schedule, **options)
    assert isinstance(refused.value, ValueError) and "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_cli_writes_unlabelled_and_batched_runs_and_refuses_what_it_cannot(tmp_path, capsys):
    common = ["--p", "2", "--m", "4", "--no-labels"]
    assert main([str(tmp_path / "cpu"), *common]) == 0
    assert main([str(tmp_path / "gpu"), *common, "--shape", "gpu", "--batched", "--p2p-latency-us", "5"]) == 0
    for run in ("cpu", "gpu"):
        frame = load_run(tmp_path / run).frame()
        assert frame.height and frame.filter(pl.col("name").str.starts_with("PP:")).height == 0
    assert load_run(tmp_path / "gpu").frame().filter(pl.col("name") == "nccl:coalesced").height > 0
    assert main([str(tmp_path / "bad"), *common, "--schedule", "interleaved", "--v", "2"]) == 2
    assert main([str(tmp_path / "bad"), "--p", "2", "--m", "4", "--batched"]) == 2
    assert "one stage per rank" in capsys.readouterr().err and not (tmp_path / "bad").exists()


# Batched p2p: a SEND and the RECV after it as one coalesced NCCL kernel.


def test_batched_pairs_that_wait_on_each_other_are_refused():
    """Rank 1 runs B1 before B0 and batches SEND_B1 with RECV_B0: that kernel needs rank 0 to post
    RECV_B1, which rank 0 reaches only after B0, which needs this RECV_B0: NCCL would hang."""
    orders = [
        tuple(Action(r, kind, i) for kind, i in ((Kind.F, 0), (Kind.F, 1), *backwards))
        for r, backwards in enumerate([((Kind.B, 0), (Kind.B, 1))] + [((Kind.B, 1), (Kind.B, 0))] * 2)
    ]
    schedule = Schedule("custom", 3, 2, 1, tuple(orders))
    synthesize(schedule, shape="gpu", labels=False)  # unbatched it runs
    with pytest.raises(
        OptionError, match=r"batched p2p deadlocks \(rank 0 at 0RECV_B0, rank 1 at 1RECV_B0\)"
    ):
        synthesize(schedule, shape="gpu", labels=False, batched=True)


def test_batched_pair_by_hand():
    """1F1B, p=2, m=2, F 1000, B 2000, 50 latency (us). Rank 0 batches SEND_F1 with RECV_B0, rank 1
    SEND_B0 with RECV_F1. Rank 1 posts its pair at 4050 (after B0), RECV_F1's data is there (sent at
    2000), but SEND_B0 reaches rank 0 only at 4100, so F1 starts at 4100, not 4050: B1 ends at 7100,
    rank 0's B1 runs 7150-9150. Both partners were ready at 4050: the 50 until 4100 is p2p_wait on
    both ranks, as are the 50 of each unbatched hop. Rank 1, done at 9100, ends its window (the step
    before the last) with the next step's host getting to its first launch: 15 of launch_overhead."""
    result = synthesize(build("1f1b", 2, 2), shape="gpu", labels=False, batched=True, p2p_latency_us=50)
    unbatched = synthesize(build("1f1b", 2, 2), shape="gpu", labels=False, p2p_latency_us=50)
    assert unbatched.truth[0].step_ns == 9_100_000
    for rank, head in ((0, 0), (1, 15_000)):
        truth = result.truth[rank]
        assert truth.step_ns == 9_150_000
        assert (truth.compute_ns, truth.p2p_wait_ns) == (6_000_000, 100_000)
        assert (truth.launch_overhead_ns, truth.bubble_ns) == (head, 3_050_000 - head)
    starts = {c.action: (c.start, c.end) for cells in result.cells.values() for c in cells}
    assert starts[Action(1, Kind.F, 1)][0] == 4_100_000 and starts[Action(0, Kind.B, 1)] == (
        7_150_000,
        9_150_000,
    )
    assert starts[Action(0, Kind.RECV_B, 0)] == (4_100_000, 4_100_000)  # arrived and done at once
    assert starts[Action(1, Kind.RECV_F, 1)] == (4_050_000, 4_100_000)  # arrived, then waited for its send


@pytest.mark.parametrize(
    "schedule",
    [build("1f1b", 4, 8), build("gpipe", 3, 4), deeper_warmup_1f1b(3, 6)],
    ids=["1f1b", "gpipe", "deeper-warmup-1f1b"],
)
def test_batched_pairs_run_as_one_kernel_each(tmp_path, schedule):
    options = dict(shape="gpu", labels=False, batched=True, steps=2, p2p_latency_us=40, launch_gap_us=7)
    result = write_run(tmp_path, schedule, slowdown=1.25, **options)
    load_run(tmp_path)
    paired = batching.pairs(lower(schedule))
    for rank, document in result.traces.items():
        cells = result.cells[rank]
        mine = [c for c in cells if c.action in paired]
        sends = [c for c in cells if c.action.kind in (Kind.SEND_F, Kind.SEND_B)]
        recvs = [c for c in cells if c.action.kind in (Kind.RECV_F, Kind.RECV_B)]
        events = document["traceEvents"]

        def named(name, events=events):
            return [e for e in events if e["name"] == name]

        comm_kernels = [e for e in _events(document, "kernel") if e["args"]["stream"] == shapes.COMM_STREAM]
        assert len(comm_kernels) == 2 * (len(sends) + len(recvs) - len(mine))  # one kernel per pair
        assert len(named("nccl:coalesced")) == 2 * len(mine)
        assert (len(named("c10d::send")), len(named("c10d::recv_"))) == (2 * len(sends), 2 * len(recvs))
        assert len(named("record_param_comms")) == 2 * (len(sends) + len(recvs))
        assert len(named("nccl:send")) + len(named("nccl:recv")) == 2 * (
            len(sends) + len(recvs) - 2 * len(mine)
        )
        launches = _events(document, "cuda_runtime")
        launching = [e for e in named("c10d::send") + named("c10d::recv_") if _holds_launch(e, launches)]
        assert len(launching) == len(comm_kernels) - len(named("nccl:coalesced"))  # a pair's calls: none
        assert all(sum(_holds(c, e) for e in launches) == 1 for c in named("nccl:coalesced"))
        # each pair's kernel: from the rank reaching the pair until the later half is done
        spans = {(round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in comm_kernels}
        for step in range(2):
            shift = ORIGIN_NS + step * result.truth[rank].step_ns
            assert {(shift + c.issue, shift + c.end) for c in mine} <= spans
    _check_batched_physics(result, paired, latency=40_000)


def _holds(outer, inner):
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def _holds_launch(op, launches):
    return any(_holds(op, launch) for launch in launches)


def _check_batched_physics(result, paired, latency):
    """No data before the kernels that carry it started, nothing consumed before its kernel ended, and
    the parts close."""
    cells = {c.action: c for rank_cells in result.cells.values() for c in rank_cells}
    for recv, send in paired.items():
        cell, peer_send = cells[recv], cells[matching_send(recv)]
        assert cell.start >= max(cell.issue, peer_send.issue + latency)  # arrival: after both kernels began
        receiver = cells[matching_recv(send)]
        assert cell.end >= max(
            receiver.issue, cells[send].issue + latency, cell.start
        )  # its send arrived too
        rank_cells = result.cells[recv.stage]  # stage s on rank s
        after = rank_cells[rank_cells.index(cell) + 1]
        assert after.start >= cell.end  # the consumer waits for the whole coalesced kernel
    for truth in result.truth.values():
        assert (
            sum(truth.parts_ns().values()) == truth.step_ns
            and truth.bubble_ns >= 0
            and truth.p2p_wait_ns >= 0
        )


@pytest.mark.parametrize(
    "schedule",
    [build("gpipe", 4, 8), build("1f1b", 4, 8), build("zb", 3, 6), build("interleaved", 2, 4, 2)],
    ids=["gpipe", "1f1b", "zb", "interleaved"],
)
def test_batched_replay_without_pairs_is_simulate(schedule):
    lowered = lower(schedule)

    def duration(rank, action):
        return 1000 * (rank + 1) + 17 * action.microbatch if action.kind.is_compute else 0

    def gap(_rank, action):
        return 7 if action.kind.is_compute else 0

    timeline = simulate(lowered, duration=duration, latency=lambda *_: 13, gap=gap)
    replayed = batching.replay(lowered, duration, 13, gap, {})
    assert replayed == [(r, a, round(start), round(end)) for r, a, start, end in timeline.rows]
