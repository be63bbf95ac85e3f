"""Any valid executed order is analysed, named by what it is; an order or timing that contradicts the data
flow is refused naming the action. Ground truth from the independent generator's runs of orders no
schedule builds (synthetic.orders); the naming and refusal tests use the old one (synthetic.generate) for a
valid trace only."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from analysis.cells.executed import check_causality
from analysis.cli import main
from analysis.errors import InputError
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from runners.schedules import bubble_formula, build
from synthetic import write_run
from synthetic.executor_gpu import parts_as_analysed
from synthetic.executor_sim import EAGER, RENDEZVOUS, HostTime, Transport
from synthetic.executor_trace import write_executor_run
from synthetic.orders import blocked_gpipe, deeper_warmup_1f1b, reverse_backward_gpipe

ORDERS = {
    "reverse-backward gpipe": (reverse_backward_gpipe(3, 4), "gpipe"),
    "1f1b with a deeper warm-up": (deeper_warmup_1f1b(3, 6), "1f1b"),
    "gpipe placed in blocks": (blocked_gpipe(2, 4, 2), None),  # no generator places stages in blocks
}


def drop_run_json(run: Path) -> None:
    (run / "run.json").unlink()


US = 1_000
TRANSPORTS = {"cpu": Transport(RENDEZVOUS, 50 * US), "gpu": Transport(EAGER, 50 * US)}  # gloo's, NCCL's
HOST = HostTime(before_ns=20 * US, inside_ns=2 * US, tail_ns=300 * US)


@pytest.mark.parametrize("case", ORDERS)
@pytest.mark.parametrize("shape", ["cpu", "gpu"])
@pytest.mark.parametrize("with_run_json", [True, False])
def test_a_custom_order_is_analysed_as_it_ran_with_its_parts_recovered(tmp_path, case, shape, with_run_json):
    """Ground truth from the independent generator (synthetic.executor_sim, executor_gpu): every part of
    every rank to 1 ns. On GPU the departure that tests/test_independent_gpu.py pins: a compute stream
    queued behind its rank's own SEND is bubble in the analysis, p2p_wait in the truth (p2p_queued_ns)."""
    schedule, nearest = ORDERS[case]
    write_executor_run(
        tmp_path,
        schedule,
        durations_us={"F": 1000, "B": 2000},
        transport=TRANSPORTS[shape],
        host=HOST,
        shape=shape,
        small_gemm=1.1,
        slowdown=1.25,
    )
    truth = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    if not with_run_json:
        drop_run_json(tmp_path)
    result = analyze_pipeline(read_run(tmp_path))
    summary = result.summary
    assert (summary.schedule, summary.nearest_schedule) == ("custom", nearest)
    assert (summary.p, summary.m, summary.v) == (schedule.p, schedule.m, schedule.v)
    assert result.schedule.orders == schedule.orders and result.schedule.stage_ranks == schedule.stage_ranks
    assert summary.bubble_formula == pytest.approx(bubble_formula(schedule))
    assert summary.step_time_ms * 1e6 == pytest.approx(truth["step_ns"], abs=1)
    found = result.cells.filter(pl.col("kind").is_in(["F", "B"]) & (pl.col("step") == summary.median_step))
    assert found.height == 2 * schedule.n_stages * schedule.m  # every F and B of every stage and microbatch
    for entry in summary.ranks:
        told = truth["ranks"][str(entry.rank)]
        want = parts_as_analysed(told)
        if not with_run_json:  # no calibration: small-GEMM time and slowdown are unknown, counted as compute
            want["compute"] += want.pop("small_gemm") + want.pop("slowdown")
            assert entry.small_gemm_ms is None and entry.slowdown_ms is None
        misses = {
            part: (entry.part_ms(part) * 1e6, ns)
            for part, ns in want.items()
            if entry.part_ms(part) * 1e6 != pytest.approx(ns, abs=1)
        }
        assert not misses, (entry.rank, misses)
        assert list(entry.stage_ids) == list(schedule.stages_of(entry.rank))
    if shape == "gpu":  # the departure is there to pin
        assert sum(truth["ranks"][str(entry.rank)]["p2p_queued_ns"] for entry in summary.ranks) > 0


def test_the_reverse_backward_gpipe_keeps_gpipes_geometry():
    # The backwards in reverse wait on the same chain as GPipe's: the same bubble.
    assert bubble_formula(reverse_backward_gpipe(4, 8)) == pytest.approx(bubble_formula(build("gpipe", 4, 8)))


def test_a_deeper_warm_up_is_not_called_interleaved(tmp_path):
    # 1F1B warming up with 2(p-1-s) forwards is exactly interleaved's order at v = 1; that names nothing a
    # user means by interleaved, so the run is custom, nearest 1f1b.
    write_run(tmp_path, deeper_warmup_1f1b(3, 6, extra=2), steps=1)
    drop_run_json(tmp_path)
    summary = analyze_pipeline(read_run(tmp_path)).summary
    assert (summary.schedule, summary.nearest_schedule, summary.v) == ("custom", "1f1b", 1)


def test_a_named_order_is_named_and_has_no_nearest(tmp_path):
    write_run(tmp_path, build("1f1b", 3, 6), steps=1)
    drop_run_json(tmp_path)
    summary = analyze_pipeline(read_run(tmp_path)).summary
    assert (summary.schedule, summary.nearest_schedule) == ("1f1b", None)


def test_a_schedule_hint_against_a_custom_order_says_what_it_is(tmp_path, capsys):
    write_run(tmp_path, reverse_backward_gpipe(2, 3), steps=1)
    drop_run_json(tmp_path)
    assert main(["analyze", str(tmp_path), "--schedule", "gpipe"]) == 2
    error = capsys.readouterr().err
    assert "--schedule gpipe disagrees" in error and "a custom order, nearest gpipe" in error


def rewrite(path: Path, edit) -> None:
    document = json.loads(gzip.decompress(path.read_bytes()))
    edit(document["traceEvents"])
    path.write_bytes(gzip.compress(json.dumps(document).encode()))


def test_a_backward_before_its_forward_is_refused_naming_it(tmp_path, capsys):
    write_run(tmp_path, build("gpipe", 2, 2), steps=1)
    drop_run_json(tmp_path)

    def swap(events):  # rank 1 labels its first backward as microbatch 1 and its second as 0 ...
        labels = {e["name"]: e for e in events if e.get("name", "").startswith("PP:1")}
        labels["PP:1F1"]["name"], labels["PP:1B1"]["name"] = "PP:1B1", "PP:1F1"  # ... B1 now runs before F1

    rewrite(tmp_path / "rank1.json.gz", swap)
    assert main(["analyze", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "the traces' order cannot run" in error and "1B1" in error


def test_a_consumer_that_ended_before_its_producer_began_is_refused():
    schedule = build("gpipe", 2, 1)
    rows = [  # rank 1's forward of microbatch 0 ends (at 5) before rank 0's, its input, begins (at 10)
        (0, 0, 0, "F", 0, 10, 20),
        (0, 0, 0, "B", 0, 60, 80),
        (1, 0, 1, "F", 0, 1, 5),
        (1, 0, 1, "B", 0, 30, 50),
    ]
    cells = pl.DataFrame(
        rows, schema=["rank", "step", "stage", "kind", "microbatch", "start_ns", "end_ns"], orient="row"
    )
    with pytest.raises(InputError, match=r"step 0: PP:1F0 ended 0.000 ms before its input PP:0F0 \(rank 0\)"):
        check_causality(schedule, cells, {1: Path("rank1.json.gz")})
    later = pl.when(pl.col("rank") == 1).then(25).otherwise(0)
    consistent = cells.with_columns((pl.col(c) + later).alias(c) for c in ("start_ns", "end_ns"))
    check_causality(schedule, consistent, {})
