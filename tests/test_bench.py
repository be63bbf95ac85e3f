"""The benchmark's parts on small inputs: replicated trace sets, repeat statistics, timed child processes,
and a smoke run of `python -m analysis bench` (structure and sanity only; nothing here checks timings)."""

from __future__ import annotations

import gc
import gzip
import json
from collections import Counter
from pathlib import Path

import msgspec
import polars as pl
import pytest

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.traces import source as trace_source
from analysis.traces.load import load_trace
from bench import child
from bench.process import run_child
from bench.runs import COLD_PAIRS
from bench.stats import stats, verdict
from bench.suite import TIMED_STEPS, main
from bench.throughput import GROWTH_TARGET, TASKS, growth
from bench.traceset import replicate_run
from runners.schedules import build
from synthetic.generate import write_run

REPO = Path(__file__).resolve().parent.parent


LAUNCH_GAP_US = 5  # the source's host time before each launch, the next step's first one's included


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A 2-rank GPU-shaped synthetic 1f1b run (correlations, flows, two streams), 2 steps."""
    directory = tmp_path_factory.mktemp("source")
    write_run(
        directory,
        build("1f1b", 2, 4),
        p2p_latency_us=30,
        launch_gap_us=LAUNCH_GAP_US,
        slowdown=1.2,
        steps=2,
        shape="gpu",
    )
    return directory


def _per_copy_bytes(source: Path, tmp_path: Path) -> int:
    return replicate_run(source, tmp_path / "one", 1).bytes


def test_replicated_set_has_the_copies_with_fresh_steps_and_ids(source, tmp_path):
    one = _per_copy_bytes(source, tmp_path)
    trace_set = replicate_run(source, tmp_path / "set", 3 * one)
    assert trace_set.copies >= 2 and trace_set.steps_per_rank == 2 * trace_set.copies
    assert trace_set.bytes == sum(p.stat().st_size for p in (tmp_path / "set").glob("rank*.json"))
    original, copied = load_trace(source / "rank0.json.gz"), load_trace(tmp_path / "set" / "rank0.json")
    steps = copied.filter(copied["name"].str.starts_with("ProfilerStep#"))["name"]
    assert steps.n_unique() == steps.len() == trace_set.steps_per_rank

    # each correlation id joins one launch and its kernel, in every copy as in the original
    def pairs(frame):
        return Counter(Counter(frame["correlation"].drop_nulls().to_list()).values())

    assert {k: v * trace_set.copies for k, v in pairs(original).items()} == pairs(copied)
    assert copied["start_ns"].min() == original["start_ns"].min()
    assert copied["end_ns"].max() > original["end_ns"].max()


def test_a_gzipped_set_is_the_same_text_and_its_floor_inflates_as_the_analysis_does(
    source, tmp_path, monkeypatch
):
    plain = replicate_run(source, tmp_path / "plain", 1)
    packed = replicate_run(source, tmp_path / "packed", 1, gzipped=True)
    texts = {path.name: path.read_bytes() for path in plain.path.glob("rank*.json")}
    assert {path.name: gzip.decompress(path.read_bytes()) for path in packed.path.glob("rank*")} == {
        f"{name}.gz": text for name, text in texts.items()
    }
    assert packed.bytes == plain.bytes == sum(map(len, texts.values()))
    assert packed.largest == plain.largest == max(map(len, texts.values()))
    inflaters = []
    codec = trace_source.gzip_codec

    class Counted:
        error = codec.error

        @staticmethod
        def decompressobj(wbits):
            inflaters.append(wbits)
            return codec.decompressobj(wbits)

    monkeypatch.setattr(trace_source, "gzip_codec", Counted)
    try:
        for name in texts:
            assert child._floor_file(packed.path / f"{name}.gz") == child._floor_file(plain.path / name) > 0
    finally:
        gc.enable()  # (the floor turns it off, as the loader does)
    assert len(inflaters) == len(texts)


def test_replicated_set_analyses_like_its_source(source, tmp_path):
    """Copies of identical steps: every step of the set has the source's step time and parts."""
    trace_set = replicate_run(source, tmp_path / "set", 3 * _per_copy_bytes(source, tmp_path))
    (tmp_path / "set" / "run.json").write_text((source / "run.json").read_text())
    copied, original = analyze_pipeline(read_run(tmp_path / "set")), analyze_pipeline(read_run(source))
    ours, theirs = copied.summary, original.summary
    # every step of every copy lasts as a source step does; at a copy's end, the next copy starts where
    # the last step's span ends, so that step may last its whole span
    spans = load_trace(source / "rank0.json.gz").filter(pl.col("name").str.starts_with("ProfilerStep#"))
    last_span_ms = round((spans["end_ns"] - spans["start_ns"]).max() / 1e6, 6)
    assert set(copied.parts["step_ms"].round(6)) <= set(original.parts["step_ms"].round(6)) | {last_span_ms}
    assert ours.steps_analyzed == trace_set.steps_per_rank
    assert ours.step_time_ms == pytest.approx(theirs.step_time_ms, abs=1e-6)
    # a GPU step's window holds the next step's head (the host getting to its first launch): the source's
    # last step has none, but in the set every copy's last step is followed, so its head moves the typical
    # model's tail and the variability by at most that head; every other rung is the source's
    ours_ms, theirs_ms = (
        msgspec.structs.asdict(ours.waterfall_ms),
        msgspec.structs.asdict(theirs.waterfall_ms),
    )
    headed = ("tail", "variability")
    assert {k: ours_ms[k] for k in ours_ms if k not in headed} == pytest.approx(
        {k: theirs_ms[k] for k in theirs_ms if k not in headed}, abs=1e-6
    )
    for rung in headed:
        assert ours_ms[rung] == pytest.approx(theirs_ms[rung], abs=LAUNCH_GAP_US / 1e3 + 1e-6), rung


def test_a_copy_starts_after_a_last_step_longer_than_every_interval(tmp_path):
    """Steps of 10, 10 and 30 us, 2 us apart: the next copy must not open inside the long last one."""
    source = tmp_path / "source"
    source.mkdir()
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{n}",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": dur,
        }
        for n, (ts, dur) in enumerate([(0, 10), (12, 10), (24, 30)], start=1)
    ]
    trace = {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    (source / "rank0.json").write_text(json.dumps(trace))
    replicate_run(source, tmp_path / "set", 3 * _per_copy_bytes(source, tmp_path))
    steps = load_trace(tmp_path / "set" / "rank0.json").filter(
        pl.col("name").str.starts_with("ProfilerStep#")
    )
    spans = steps.sort("start_ns").select("start_ns", "end_ns").rows()
    assert len(spans) >= 6
    assert all(later[0] - earlier[1] == 2_000 for earlier, later in zip(spans, spans[1:]))


def test_stats_and_verdicts():
    figure = stats([1.3, 0.9, 1.0])
    assert (figure.median, figure.min, figure.max, figure.n) == (1.0, 0.9, 1.3, 3)
    assert figure.too_wide  # 0.4 / 1.0
    assert not stats([1.0, 1.1, 1.05]).too_wide
    assert verdict(stats([0.8, 0.9]), 1.0) == "meets"
    assert verdict(stats([1.1, 1.2]), 1.0) == "misses"
    assert verdict(stats([0.9, 1.1]), 1.0).startswith("inconclusive")
    assert verdict(stats([25.0, 30.0]), 20.0, lower_is_better=False) == "meets"
    assert verdict(stats([15.0]), 20.0, lower_is_better=False) == "misses (one sample)"
    with pytest.raises(ValueError):
        stats([])


def test_growth_judges_time_per_mb_from_the_smallest_set_to_the_largest():
    def size(mb: float, seconds: tuple[float, float, float]) -> dict:
        low, median, high = seconds
        work = {"median": median, "min": low, "max": high, "n": 3}
        unmeasured = dict.fromkeys(TASKS, {"status": "skipped"})
        return {"mb": mb, "tasks": unmeasured | {"analyze": {"work_s": work, "tree_rss_mb": {"median": mb}}}}

    small = size(100, (0.9, 1.0, 1.1))
    linear = growth(small, size(1000, (9.5, 10.0, 10.5)), "mb")["analyze"]["time_per_mb"]
    assert linear["median"] == pytest.approx(1.0) and linear["verdict"] == "meets"
    # time per MB up 1.48-1.97x: slower than linear by more than the target allows, over the whole range
    over = 1.3 * GROWTH_TARGET
    worse = growth(small, size(1000, (10 * over, 11 * over, 12 * over)), "mb")["analyze"]["time_per_mb"]
    assert worse["min"] > GROWTH_TARGET and worse["verdict"] == "misses"
    assert (
        "time_per_mb"
        not in growth(small | {"ranks": 4}, size(100, (1, 1, 1)) | {"ranks": 8}, "ranks")["analyze"]
    )


def test_child_decodes_every_event_and_is_stopped_at_its_timeout(source, tmp_path):
    replicate_run(source, tmp_path / "set", 1)
    events = sum(len(json.loads(p.read_text())["traceEvents"]) for p in (tmp_path / "set").glob("rank*.json"))
    done = run_child("decode", [str(tmp_path / "set")], 120, REPO)
    assert done.status == "ok" and done.rows == events
    assert 0 < done.work_s < done.wall_s and done.peak_rss_mb > 0
    # (decoding this tiny set may end within the first sample; analyze's polars import takes longer)
    stopped = run_child("analyze", [str(tmp_path / "set")], 0.05, REPO)
    assert stopped.status == "timeout" and stopped.work_s is None


def test_bench_throughput_smoke(source, tmp_path):
    out = tmp_path / "out"
    out.mkdir()  # an earlier run's bubble section, which this throughput-only run keeps
    kept = "<!-- bench: bubble -->\n## 6. GPipe p=2 m=1\n<!-- /bench: bubble -->\n"
    (out / "RESULTS.md").write_text("# Benchmarks\n\n" + kept)
    earlier = {"results": {"bubble": {"runs": 6}}, "measured_by": {"bubble": {"keys": ["bubble"]}}}
    (out / "results.json").write_text(json.dumps(earlier))
    code = main(
        [
            "--only",
            "throughput",
            "--sizes-mb",
            "0.05",
            "--repeats",
            "1",
            "--gzip",  # (as our runner writes traces; the plain set's files are tested above)
            "--hta-timeout",
            "120",
            "--sources",
            str(source),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    document = json.loads((out / "results.json").read_text())
    assert document["complete"] is True and document["parts"] == ["throughput"]
    assert document["results"]["bubble"] == {"runs": 6} and document["measured_by"]["throughput"]["keys"] == [
        "throughput"
    ]
    (size,) = document["results"]["throughput"]["sizes"]  # one size, one rank count: one set
    assert size["gzipped"] is True and document["command"].endswith(f"--gzip --sources {source.name}")
    assert document["results"]["throughput"]["growth"] is None
    assert document["results"]["throughput"]["growth_ranks"] is None
    tasks = size["tasks"]
    assert tasks["analyze"]["status"] == tasks["decode"]["status"] == tasks["merge"]["status"] == "ok"
    assert tasks["analyze_jobs1"]["processes"] == 1 and tasks["merge"]["rows"] > 0
    assert size["tasks"]["hta"]["status"] in ("ok", "timeout", "failed")
    assert size["ratios"]["ours_over_decode"]["median"] > 0
    assert 0 < size["ratios"]["replay_share"]["median"] < 1  # timed inside analyze's work
    text = (out / "RESULTS.md").read_text()
    assert "## 1. Analysis throughput" in text and "ours / typed decoding" in text
    assert " MB gzipped, 2 ranks" in text and "Typed decoding (decode) is the floor" in text
    assert "own replay and critical path" in text
    assert kept in text and text.index("## 1.") < text.index("## 6.")


def test_bench_refuses_unknown_parts(tmp_path, capsys):
    assert main(["--only", "throughput,speed", "--out", str(tmp_path)]) == 2
    assert "speed" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_executor_part_says_when_the_torch_engine_is_missing(monkeypatch, tmp_path):
    from bench import runs as bench_runs
    from runners import engines

    monkeypatch.delitem(engines.ENGINES, "torch")
    plan = bench_runs.RunPlan(tmp_path, "tiny", 1, 1)
    result = bench_runs.executor_overhead(plan, (("gpipe", 2),), 1, print)
    assert result["available"] is False and result["reason"].startswith("torch engine not available")
    assert not any(tmp_path.iterdir())  # refused before any run started


def test_seed_optimum_is_the_fastest_m_per_schedule_and_p():
    rows = [
        {"schedule": "gpipe", "p": 2, "m": m, "step_ms": ms} for m, ms in ((1, 90.0), (4, 60.0), (8, 70.0))
    ]
    rows.append({"schedule": "gpipe", "p": 4, "m": 1, "step_ms": 10.0})
    from bench.runs import seed_optimum

    assert seed_optimum(rows) == {"gpipe p=2": 4, "gpipe p=4": 1}


def test_sweep_skips_what_a_schedule_refuses_and_refuses_bad_presets(tmp_path):
    from analysis.errors import InputError
    from bench.runs import RunPlan, _requests

    requests, skipped = _requests(RunPlan(tmp_path, "tiny", 1, 1), ("gpipe", "1f1b"), 2, (1, 2))
    assert [(r.request.schedule, r.request.m) for r in requests] == [("gpipe", 1), ("gpipe", 2), ("1f1b", 2)]
    assert len(skipped) == 1 and skipped[0].startswith("1f1b p=2 m=1: ")
    with pytest.raises(InputError, match="preset"):
        _requests(RunPlan(tmp_path, "huge", 1, 1), ("gpipe",), 2, (2,))


@pytest.mark.slow
def test_bench_sweep_smoke(tmp_path):
    """Two tiny p=2 runs through the launcher and our analysis: the sweep's columns, profiler and simulator figures."""
    out = tmp_path / "out"
    assert main(["--only", "sim,profiler", "--ms", "2", "--preset", "tiny", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())["results"]
    rows = results["sweep"]
    assert sorted(row["schedule"] for row in rows) == ["1f1b", "gpipe"]
    for row in rows:
        assert row["p"] == 2 and row["m"] == 2 and row["bubble_theory"] == pytest.approx(1 / 3)
        assert row["slot_ms"] > 0 and row["step_ms_min"] <= row["step_ms"] <= row["step_ms_max"]
        assert row["profiler_ratio"] == pytest.approx(row["profiled_step_ms"] / row["step_ms"])
        assert abs(row["typical_error"]) < 1  # a replay of the measured step, not something unrelated
    assert results["sim"]["runs"] == 2 and results["profiler"]["n"] == 2
    assert "## 3-4. Profiler overhead and the typical step's accuracy" in (out / "RESULTS.md").read_text()


@pytest.mark.slow
def test_bench_bubble_smoke(tmp_path):
    """One tiny gpipe p=2 m=1 run: the bubble against 1/2, each rank's slowdown share, and the cold and
    warm passes beside them."""
    out = tmp_path / "out"
    assert main(["--only", "bubble", "--bubble-runs", "1", "--preset", "tiny", "--out", str(out)]) == 0
    part = json.loads((out / "results.json").read_text())["results"]["bubble"]
    assert part["failed"] == [] and len(part["bubbles"]) == 1
    assert part["deviation"]["median"] == pytest.approx(abs(part["bubbles"][0] - 0.5))
    assert len(part["slowdown_shares"]) == 2 and part["slowdown"]["n"] == 2  # one per rank
    assert len(part["beyond_contention_shares"]) == 2 and part["beyond_contention"]["n"] == 2
    assert part["pass_noise"]["n"] == 2 * TIMED_STEPS  # a share per rank and calibration round
    cold = part["cold"]
    assert cold["pairs"] == COLD_PAIRS
    assert all(by_kind[kind]["n"] == COLD_PAIRS for by_kind in cold["ms"].values() for kind in ("F", "B"))
    # the sleep or recv before a pass is outside its time: a tiny pass takes well under the idle
    assert all(
        by_kind[kind]["max"] < cold["idle_ms"] for by_kind in cold["ms"].values() for kind in ("F", "B")
    )
    assert all(cold["op_excess_ms"][condition]["B"] for condition in cold["conditions"][1:])
    report = (out / "RESULTS.md").read_text()
    assert "abs(bubble - 0.5), gpipe p=2 m=1 (1 runs)" in report and "## 6. GPipe p=2 m=1" in report
    assert (
        "| recv, peer works |" in report
        and "| abs((slowdown - cpu_contention) / busy), the same ranks |" in report
        and "the same ranks' rounds (the machine's own noise) |" in report
    )


def test_cold_passes_compare_each_round_with_its_own_back_to_back_pass_and_leave_the_first_out():
    from bench.cold import BACK_TO_BACK, CONDITIONS, KINDS, PEER_WORKS, SPAN, _summary

    # (op union ms, ms by operator name, CPU ms) per pass; round 0 allocates (100x), rounds 1-3 drift
    # (back to back 10, 20, 40 ms) and "recv, peer works" is 1.1, 1.5, 1.2 times its round's
    scale = {0: 100.0, 1: 10.0, 2: 20.0, 3: 40.0}
    factor = {0: 9.0, 1: 1.1, 2: 1.5, 3: 1.2}
    passes = {}
    for index, base in scale.items():
        for condition in CONDITIONS:
            for kind in KINDS:
                ms = base * (factor[index] if condition == PEER_WORKS else 1.0)
                passes[f"{SPAN}{index}|{condition}|{kind}"] = [ms, {"aten::mm": ms - base / 2}, ms / 2]
    summary = _summary(passes, rounds=4)
    works = summary["over_back_to_back"][PEER_WORKS]["B"]
    assert (works["median"], works["min"], works["max"], works["n"]) == pytest.approx((1.2, 1.1, 1.5, 3))
    assert summary["cpu_over_back_to_back"][PEER_WORKS]["F"]["median"] == pytest.approx(1.2)
    assert summary["over_back_to_back"][BACK_TO_BACK]["B"]["median"] == 1.0
    # the operator's excess over the same round's back-to-back pass: 1, 10, 8 ms
    assert summary["op_excess_ms"][PEER_WORKS]["B"] == {"aten::mm": pytest.approx(8.0)}
    assert summary["ms"][BACK_TO_BACK]["B"]["max"] == 40.0  # round 0 is not among the samples


def test_pass_noise_holds_each_round_against_the_median_of_the_others():
    from bench.runs import pass_noise

    # stage 0 at 8 rows: F 10, 10, 12; B 20, 20, 20 (the third round's F 2 ms slow); stage 1's last F and B
    # 10% slow; the whole batch (16 rows) is not the run's size and stays out
    stage = {"8": {"F_ms": [10.0, 10.0, 12.0], "B_ms": [20.0, 20.0, 20.0]}, "16": {"F_ms": [99.0] * 3}}
    slow = {"8": {"F_ms": [10.0, 10.0, 11.0], "B_ms": [20.0, 20.0, 22.0]}}
    config = {"dims": {"microbatch_rows": [8, 8]}, "calibration_by_rows_samples_ms": {"0": stage, "1": slow}}
    # a round's own sample stays out of its reference: round 0 against F median(10, 12) = 11, B 20
    assert pass_noise(config, [[0], [1]]) == pytest.approx(
        [30 / 31 - 1, 30 / 31 - 1, 32 / 30 - 1, 30 / 31.5 - 1, 30 / 31.5 - 1, 33 / 30 - 1]
    )
    # one rank holding both stages: its rounds sum them
    assert pass_noise(config, [[0, 1]]) == pytest.approx([60 / 62.5 - 1, 60 / 62.5 - 1, 65 / 60 - 1])


def test_bubble_section_says_which_runs_failed():
    from bench.report import _bubble

    assert "Failed: rank 1 exited 1" in "\n".join(_bubble({"runs": 1, "failed": ["rank 1 exited 1"]}))


def _rank(rank: int, launch_overhead: float, busy: float, bubble: float):
    from analysis.schema import RankEntry

    return RankEntry(
        rank=rank,
        stage_ids=[rank],
        compute_ms=busy / 2,
        small_gemm_ms=busy / 4,
        slowdown_ms=busy / 4,
        busy_ms=busy,
        cpu_contention_ms=None,
        bubble_ms=bubble,
        p2p_wait_ms=0.0,
        launch_overhead_ms=launch_overhead,
        other_ms=0.0,
        peak_activation_bytes=None,
    )


def test_host_recovery_reports_each_pairs_delta_and_its_share_of_the_stall():
    """Pairs of (baseline, injected) summaries: deltas per pair, each as a share of m x X = 80 ms; the
    report lists them without a verdict (the targets are the injection tests')."""
    from conftest import summary_of

    from bench.inject import HOST, recovery
    from bench.report import _inject

    def run(launch_overhead, busy, peer_bubble):
        ranks = [_rank(0, launch_overhead, busy, 1.0), _rank(1, 1.0, 1.0, peer_bubble)]
        return summary_of(ranks=ranks), {}

    baseline = [run(2.0, 4.0, 1.0), run(3.0, 4.0, 2.0)]
    injected = [run(82.0, 6.0, 81.0), run(95.0, 4.0, 30.0)]  # the second pair: 12 ms too much, peer 28 ms
    result = recovery(HOST, baseline, injected)
    assert result["injected_ms"]["median"] == 80.0 and result["pairs"] == 2
    figures = {f["figure"]: f for f in result["figures"]}
    assert figures["launch_overhead"]["per_pair_ms"] == [80.0, 92.0]
    assert figures["launch_overhead"]["share"]["max"] == pytest.approx(92 / 80)
    assert figures["busy"]["per_pair_ms"] == [2.0, 0.0]  # rank 0's compute + small_gemm + slowdown
    assert figures["peer_bubble"]["per_pair_ms"] == [80.0, 28.0]  # rank 1's bubble
    text = "\n".join(_inject({"host": result}))
    assert (
        "| launch_overhead | 2.5 (2.0-3.0 wide) | 86.0 (80.0-92.0) | 1.075 (1.000-1.150) | 80.0, 92.0 |"
        in text
    )
    assert "verdict" not in text.lower().replace("no verdict here", "")


def test_slow_recovery_reads_the_waterfall_and_the_baseline_calibration():
    from conftest import rank_entry_of, summary_of

    from analysis.schema import Waterfall
    from bench.inject import SLOW, recovery

    def run(imbalance, small_batches, interference, rank_slowdown, rank_contention):
        slowed = rank_entry_of(
            rank=1, stage_ids=[1], slowdown_ms=rank_slowdown, cpu_contention_ms=rank_contention
        )
        terms = dict(
            ideal=80.0,
            fill_drain=20.0,
            host_time=5.0,
            transfer=1.0,
            tail=2.0,
            variability=0.0,
            residual=0.0,
        )
        waterfall = Waterfall(
            imbalance=imbalance, small_batches=small_batches, interference=interference, **terms
        )
        summary = summary_of(waterfall_ms=waterfall, ranks=[slowed])
        return summary, {"calibration": {"1": {"F_ms": 30.0, "B_ms": 50.0}}}

    result = recovery(SLOW, [run(1.0, 10.0, 5.0, 4.0, 1.0)], [run(91.0, 111.0, 5.0, 30.0, 26.0)])
    assert result["injected_ms"]["median"] == 3 * 80.0  # slow:1:4: three more times stage 1's F + B
    deltas = {f["figure"]: f["per_pair_ms"] for f in result["figures"]}
    assert deltas == {
        "imbalance": [90.0],
        "small_batches": [101.0],
        "interference": [0.0],
        "slowed_rank_slowdown": [26.0],  # rank 1 holds stage 1
        "slowed_rank_cpu_contention": [25.0],
    }


def test_predict_accuracy_pairs_each_prediction_with_its_repeat():
    from bench.predict import PREDICT_TARGET, accuracy

    intervals = [(95.0, 101.0), (99.0, 99.5), (110.0, 130.0)]
    figure = accuracy("gpipe", 8, [105.0, 99.0, 120.0], [100.0, 110.0, 100.0], intervals)
    assert figure["error"]["median"] == pytest.approx(0.1)  # 0.05, 0.1, 0.2: repeat by repeat
    assert figure["median_error"] == pytest.approx(
        0.05
    )  # the median prediction 105 against the median run 100
    assert figure["intervals_holding_the_median"] == 1  # only 95-101 holds 100
    assert figure["error"]["min"] == pytest.approx(0.05) and figure["error"]["max"] == pytest.approx(0.2)
    assert figure["error"]["target"] == PREDICT_TARGET and figure["error"]["verdict"].startswith(
        "inconclusive"
    )
    assert accuracy("1f1b", 2, [101.0], [100.0], [(99.0, 102.0)])["error"]["verdict"] == "meets (one sample)"


def test_the_machine_level_is_the_target_run_s_calibration_over_its_source_s():
    """Every size both runs calibrated, target over source; a size only one of them has is left out."""
    from bench.predict import machine_level

    source = {
        "calibration_by_rows": {"0": {"64": {"F_ms": 1.0, "B_ms": 2.0}, "32": {"F_ms": 0.5, "B_ms": 1.0}}}
    }
    target = {
        "calibration_by_rows": {"0": {"64": {"F_ms": 1.2, "B_ms": 2.4}, "16": {"F_ms": 9.0, "B_ms": 9.0}}}
    }
    assert machine_level(source, target) == pytest.approx(1.2)


def test_a_partial_run_replaces_its_sections_and_keeps_the_others():
    """results.json: the sections this run finished replace their earlier keys (a sweep without rows
    drops the earlier profiler and sim figures too); RESULTS.md: other sections' blocks stay verbatim."""
    from bench.report import render
    from bench.suite import Record, merged

    earlier = {
        "results": {"sweep": [1], "skipped": [], "profiler": {"n": 1}, "sim": {"n": 1}, "bubble": {"b": 1}},
        "measured_by": {
            "sweep": {"keys": ["profiler", "sim", "skipped", "sweep"]},
            "bubble": {"keys": ["bubble"]},
        },
    }
    record = Record("python -m bench --only sim", lambda _: None)
    record.results = {"sweep": [], "skipped": ["gpipe p=2 m=1: failed"], "predict": {"half done": True}}
    entry = {"command": "now", "started": "today", "seconds": 1, "git_revision": "abc"}
    record.sections = {"sweep": entry | {"keys": ["skipped", "sweep"]}}
    results, measured_by = merged(earlier, record)
    assert results == {"sweep": [], "skipped": ["gpipe p=2 m=1: failed"], "bubble": {"b": 1}}
    assert (
        measured_by["bubble"] == earlier["measured_by"]["bubble"] and measured_by["sweep"]["command"] == "now"
    )

    kept = "<!-- bench: bubble -->\n## 6. GPipe\n\nMeasured by `old`.\n<!-- /bench: bubble -->\n"
    previous = "# Benchmarks\n\nold header\n\n" + kept + "<!-- bench: gone -->\nx\n<!-- /bench: gone -->\n"
    document = {
        "results": results,
        "machine": {"cpu": "cpu", "cores_usable": 2, "memory_gib": 1, "platform": "linux", "python": "3"},
        "versions": {},
        "command": "now",
        "started": "today",
        "git_revision": "abc",
    }
    fresh = {"sweep": entry | {"load_average_at_start": (1.0,), "load_average_at_end": (2.0,)}}
    text = render(document, fresh, previous)
    assert kept in text and "old header" not in text and "bench: gone" not in text
    assert (
        "Skipped: gpipe p=2 m=1: failed" in text
        and "Measured by `now`, started today, 1 s, at git abc" in text
    )
    assert text.index("## 3-4.") < text.index("## 6.")  # sections in their order, kept or fresh
    assert render(document, {}, text) == text  # blocks carried again come out as they went in


@pytest.mark.slow
def test_bench_predict_smoke(tmp_path):
    """Tiny gpipe and 1f1b p=2 runs: m=4's prediction at m=2 against a run there, in its own section."""
    out = tmp_path / "out"
    argv = [
        "--only",
        "predict",
        "--predict-ms",
        "2",
        "--predict-repeats",
        "1",
        "--preset",
        "tiny",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    part = json.loads((out / "results.json").read_text())["results"]["predict"]
    assert part["failed"] == [] and [(c["schedule"], c["m"]) for c in part["configs"]] == [
        ("gpipe", 2),
        ("1f1b", 2),
    ]
    for config in part["configs"]:
        predicted, measured = config["predicted_ms"]["median"], config["measured_ms"]["median"]
        assert config["error"]["median"] == pytest.approx(abs(predicted / measured - 1))
        assert config["machine_level"]["n"] == 1
    assert set(part["source_typical_error"]) == set(part["source_step_ms"]) == {"gpipe", "1f1b"}
    assert len(part["load_average"]) == 1
    text = (out / "RESULTS.md").read_text()
    assert "## 8. predict" in text and "abs(median predicted / median measured - 1), 1f1b m=2" in text
    assert part["coverage"]["of"] == 2 and "intervals holding the measured median" in text
    assert "Drift between repeats of one configuration" in text and "| machine level |" in text


def test_advice_section_judges_each_checked_candidate_by_its_error():
    """A step 5% over its run meets 10%, one 20% under misses; a memory never measured is said so."""
    from bench.report import _advice

    def config(rank, step_error, peak_error):
        return {
            "engine": "native", "schedule": "zb", "m": rank, "v": 1, "rank": rank, "predicted_ms": 10.0,
            "interval_ms": [9.0, 11.0], "measured_ms": stats([9.5]).to_json(), "step_error": step_error,
            "predicted_peak_bytes": 2**20, "measured_peak_bytes": None, "peak_error": peak_error,
            "extrapolated": True, "caveats": ["assumed this"], "assumptions": ["layers_split_evenly"],
        }  # fmt: skip

    part = {
        "source": {"engine": "native", "schedule": "gpipe", "p": 2, "m": 4, "v": 1, "step_time_ms": 9.0},
        "ranked": False, "run_caveats": ["noisy"], "repeats": 1, "failed": [],
        "configs": [config(1, 0.05, None), config(2, -0.2, 0.01)], "top_pick_over_best": 0.0,
        "targets": {"step": 0.1, "pick": 0.05, "memory": 0.1},
    }  # fmt: skip
    text = "\n".join(_advice(part))
    assert "#1 zb m=1 v=1 (native) | 0.050 | 0.1 | meets |" in text
    assert "#2 zb m=2 v=1 (native) | 0.200 | 0.1 | misses |" in text
    assert "#1 zb m=1 v=1 | - | 0.1 | unmeasured |" in text and "ranked: False; noisy" in text
    assert "Assumed: assumed this" in text
    assert "Assumed layers_split_evenly: stage times at another v taken as shares" in text


def test_foreign_section_counts_each_target_and_names_the_assumptions():
    """Trace-alone at the run's own m 5% off meets 10%; at another m a measured step outside its interval
    misses the coverage; a top pick unlike the calibrated one misses; every row names its assumptions."""
    from bench.report import _foreign

    def row(target, own_m, alone, interval):
        return {
            "source": "gpipe m=4", "target": target, "own_m": own_m, "same": False, "measured_ms": 100.0,
            "calibrated_ms": 101.0, "alone_ms": alone, "interval_ms": interval,
            "assumptions": ["cells_as_measured"] + ([] if own_m else ["time_per_row_constant"]),
        }  # fmt: skip

    part = {
        "synthetic": [
            {"shape": "gpu", "p": 2, "source": "gpipe m=4", "target": "1f1b m=4", "truth_ms": 20.0,
             "calibrated_ms": 21.0, "alone_ms": 20.0, "interval_ms": [19.0, 20.0], "assumptions": ["cells_as_measured"]}
        ],
        "runs": [row("1f1b m=4", True, 105.0, [95.0, 110.0]), row("1f1b m=8", False, 80.0, [70.0, 90.0])],
        "picks": [{"source": "gpipe m=4", "calibrated": ["1f1b", 4, False], "alone": ["1f1b", 8, True]}],
        "targets": {"own_m": 0.1, "coverage": 0.8}, "repeats": 1, "load_average": [1.0], "failed": [],
    }  # fmt: skip
    text = "\n".join(_foreign(part))
    assert "trace-alone within 10% of the measured median | 1 of 1 | all | meets |" in text
    assert "inside the trace-alone interval | 0 of 1 | 80% | misses |" in text
    assert "the same as the calibrated advice's | 0 of 1 | all | misses |" in text
    assert "| 80.0 (-20.0%) | 70.0-90.0 | cells_as_measured, time_per_row_constant |" in text
    assert "| 20.0 (+0.0%) | 19.0-20.0 | cells_as_measured |" in text


@pytest.mark.slow
def test_bench_advice_smoke(tmp_path):
    """A tiny gpipe p=2 m=4 run advised; its top 3 and the start run once each, in their own section."""
    out = tmp_path / "out"
    assert main(["--only", "advice", "--advice-repeats", "1", "--preset", "tiny", "--out", str(out)]) == 0
    part = json.loads((out / "results.json").read_text())["results"]["advice"]
    configs = part["configs"]
    assert part["failed"] == [] and [c["rank"] for c in configs][:3] == [1, 2, 3]
    assert ("native", "gpipe", 4, 1) in [(c["engine"], c["schedule"], c["m"], c["v"]) for c in configs]
    for config in configs:
        measured = config["measured_ms"]["median"]
        assert config["step_error"] == pytest.approx(config["predicted_ms"] / measured - 1)
    assert "## 9. advise" in (out / "RESULTS.md").read_text()
