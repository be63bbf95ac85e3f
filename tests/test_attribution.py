"""Per-rank closure and the waterfall ladder, against hand-derived numbers and unit-time geometry."""

from __future__ import annotations

import msgspec
import polars as pl
import pytest
from test_cells import gpipe_m1_run, span

from analysis.attribution.model import StepModel, fit
from analysis.attribution.reference import REFERENCE_SCHEMA, Reference
from analysis.attribution.replay import Measured, measure, replay
from analysis.attribution.waterfall import ladder
from analysis.cells.labelled import CELL_KEY, CELL_SCHEMA
from analysis.pipeline import analyze_run, read_run
from analysis.schema import RANK_PARTS, WATERFALL_TERMS
from runners.schedules import build, simulate
from runners.schedules.trace_names import RUN_QUEUE_COUNTER

CALIBRATION = {"0": {"F_ms": 0.008, "B_ms": 0.016}, "1": {"F_ms": 0.016, "B_ms": 0.024}}
# m = 1: the one microbatch is the whole batch, so its isolated time is the whole batch's
RUN_JSON = {
    "schedule": "gpipe",
    "p": 2,
    "m": 1,
    "v": 1,
    "dims": {"rows": 64, "microbatch_rows": [64]},
    "calibration": CALIBRATION,
    "calibration_by_rows": {stage: {"64": times} for stage, times in CALIBRATION.items()},
    "complete": True,
}


def test_uncalibrated_waterfall_matches_the_hand_replay(tmp_path):
    summary = analyze_run(read_run(gpipe_m1_run(tmp_path))).summary
    # ideal (10+20 + 20+30)/2 = 40 us; equal slots F=15, B=25 in a serial m=1 chain = 80; the measured
    # chain is also 80 (no imbalance at m=1); gaps 2,2,1,2 push it to 87, latencies 3 and 1 to 91
    expected = {
        "ideal": 0.040,
        "formula_bubble": 0.040,
        "imbalance": 0.0,
        "small_gemm": None,
        "slowdown": None,
        "launch_overhead": 0.007,
        "p2p_wait": 0.004,
        "other": 0.009,  # the step goes on 9 us after the last backward
        "residual": 0.0,
    }
    assert list(expected) == list(WATERFALL_TERMS)
    assert msgspec.structs.asdict(summary.waterfall_ms) == {
        term: pytest.approx(ms, abs=1e-9) if ms is not None else None for term, ms in expected.items()
    }
    assert summary.simulated_step_time_ms == pytest.approx(0.091 + 0.009)  # the replay, then the tail
    assert summary.bubble_measured == pytest.approx(1 - 80 / 200)
    assert summary.bubble_seed is None  # no isolated calibration


def test_calibration_splits_busy_time_into_compute_small_gemm_and_slowdown(tmp_path):
    summary = analyze_run(read_run(gpipe_m1_run(tmp_path, RUN_JSON))).summary
    ranks = {entry.rank: entry for entry in summary.ranks}
    # busy 30 and 50 us against the isolated (here whole-batch) 24 and 40 us: at m = 1 no small-GEMM loss
    assert (ranks[0].compute_ms, ranks[0].small_gemm_ms, ranks[0].slowdown_ms) == pytest.approx(
        (0.024, 0, 0.006)
    )
    assert (ranks[1].compute_ms, ranks[1].small_gemm_ms, ranks[1].slowdown_ms) == pytest.approx(
        (0.040, 0, 0.010)
    )
    assert (ranks[0].busy_ms, ranks[1].busy_ms) == pytest.approx((0.030, 0.050))
    # the two bubbles of a 100 us step on 2 ranks: busy 80 us, work timed alone 64 us
    assert summary.bubble_measured == pytest.approx(1 - 80 / 200)
    assert summary.bubble_seed == pytest.approx(1 - 64 / 200)
    terms = msgspec.structs.asdict(summary.waterfall_ms)
    assert terms["ideal"] == pytest.approx(0.032) and terms["formula_bubble"] == pytest.approx(0.032)
    assert terms["small_gemm"] == pytest.approx(0) and terms["slowdown"] == pytest.approx(0.016)
    assert sum(terms.values()) == pytest.approx(summary.step_time_ms, abs=1e-12)


def test_each_compute_cell_carries_its_split(tmp_path):
    # measured F/B: 10/20 us on stage 0, 20/30 us on stage 1; calibrated (m=1): 8/16 and 16/24 us
    cells = analyze_run(read_run(gpipe_m1_run(tmp_path, RUN_JSON))).cells
    split = {
        f"{s}{k}": (c, g, d)
        for s, k, c, g, d in cells.select(
            "stage", "kind", "compute_ns", "small_gemm_ns", "slowdown_ns"
        ).iter_rows()
    }
    assert {a: split[a] for a in ("0F", "0B", "1F", "1B")} == {
        "0F": pytest.approx((8000, 0, 2000)),
        "0B": pytest.approx((16000, 0, 4000)),
        "1F": pytest.approx((16000, 0, 4000)),
        "1B": pytest.approx((24000, 0, 6000)),
    }
    assert all(parts == (None, None, None) for a, parts in split.items() if a[1:] not in ("F", "B"))


@pytest.mark.parametrize("with_run_json", [False, True])
def test_each_ranks_parts_sum_to_the_step_time(tmp_path, with_run_json):
    result = analyze_run(read_run(gpipe_m1_run(tmp_path, RUN_JSON if with_run_json else None)))
    assert result.summary.parts == tuple(f"{part}_ms" for part in RANK_PARTS)
    for entry in result.summary.ranks:
        total = sum(getattr(entry, key) or 0.0 for key in result.summary.parts)
        assert total == pytest.approx(result.summary.step_time_ms, abs=1e-12)
    assert result.summary.step_time_ms == pytest.approx(0.1)


@pytest.mark.parametrize(
    "name,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2), ("zb", 3, 6, 1)]
)
def test_unit_replay_reproduces_the_schedule_simulator(name, p, m, v):
    schedule = build(name, p, m, v)
    unit = Measured({a: 1.0 for order in schedule.orders for a in order})
    expected = max(end for *_, end in simulate(schedule).rows)
    assert replay(schedule, unit).makespan == expected


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 4, 1), ("interleaved", 2, 4, 2)])
def test_equal_slots_give_the_formula_bubble(name, p, m, v):
    schedule = build(name, p, m, v)
    actions = [a for order in schedule.orders for a in order]
    unit = {a: 1.0 if a.kind.value == "F" else 2.0 for a in actions}
    rows = [(a.stage, a.kind.value, a.microbatch, ns, ns) for a, ns in unit.items()]
    ref = Reference(pl.DataFrame(rows, schema=REFERENCE_SCHEMA, orient="row"), calibrated=True)
    model = StepModel({(a.stage, a.kind.value): ns for a, ns in unit.items()}, gap={}, latency={}, tail=0.0)
    terms = ladder(schedule, model, ref, step_ns=1e6).waterfall
    step = terms.ideal + terms.formula_bubble
    assert terms.formula_bubble / step == pytest.approx((p - 1) / (v * m + p - 1))
    assert terms.imbalance == 0 and terms.small_gemm == 0 and terms.slowdown == 0
    assert sum(msgspec.structs.asdict(terms).values()) == pytest.approx(1.0)  # ms


def run_queue(t_us: float, delay_ns: int) -> dict:
    return {
        "ph": "C",
        "cat": "pp_sched",
        "name": RUN_QUEUE_COUNTER,
        "pid": 1,
        "tid": 1,
        "ts": t_us,
        "args": {"run_delay_ns": delay_ns},
    }


def test_cpu_contention_is_the_run_queue_delay_across_compute_cells_on_their_busy_share(tmp_path):
    # rank 1: 5 us runnable-but-waiting inside 1F0 [17,37], 0.5 us inside 1B0 [38,68] (bare labels: all
    # busy), 3 us after its last action that no compute cell holds; rank 0: an operator covers 15 of
    # 0B0's 20 us and 4 us of delay fall across it: 3 us on the operator
    extra = {
        1: [run_queue(t, ns) for t, ns in ((17, 1000), (37, 6000), (38, 6000), (68, 6500), (90, 9500))],
        0: [span("aten::mm", 76, 91, cat="cpu_op"), run_queue(71, 0), run_queue(91, 4000)],
    }
    ranks = analyze_run(read_run(gpipe_m1_run(tmp_path, extra=extra))).summary.ranks
    assert ranks[1].cpu_contention_ms == pytest.approx(0.0055, abs=1e-12)
    assert ranks[0].cpu_contention_ms == pytest.approx(0.003, abs=1e-12)
    bare = analyze_run(read_run(gpipe_m1_run(tmp_path / "bare"))).summary.ranks
    assert [r.cpu_contention_ms for r in bare] == [None, None]  # no counter: unknown, not zero


def test_the_measured_gaps_are_exact_nanoseconds_at_epoch_times():
    """Cells carry nanoseconds since the epoch (~1.8e18, where a double resolves only 256 ns): gaps of
    3 and 37 ns must come out as 3 and 37."""
    schedule = build("gpipe", 2, 1)
    t0 = 1_764_000_000_123_456_789
    rows = [  # rank, stage, kind, start, end: F0, 3 ns later F1, B1, 37 ns later B0 (no RECV cells: no hops)
        (0, 0, "F", t0, t0 + 1000),
        (1, 1, "F", t0 + 1003, t0 + 2003),
        (1, 1, "B", t0 + 2003, t0 + 3003),
        (0, 0, "B", t0 + 3040, t0 + 4040),
    ]
    cells = pl.DataFrame(
        [(rank, 0, stage, kind, 0, start, end, 0, False) for rank, stage, kind, start, end in rows],
        schema=CELL_SCHEMA,
        orient="row",
    )
    waits = pl.DataFrame(schema={name: CELL_SCHEMA[name] for name in (*CELL_KEY, "start_ns", "end_ns")})
    measured = measure(schedule, cells, waits, pl.DataFrame({"step": [0], "origin_ns": [t0]}))
    assert sorted(measured.actions["gap"]) == [0.0, 0.0, 3.0, 37.0]


def test_a_hop_latency_is_seen_where_the_receiver_waited_first_and_else_a_bound():
    """gpipe p=2 m=1 in ns from 0: rank 1 waits in 1RECV_F0 from 600, before 0F0 ends at 1000, and its
    wait ends at 1300: latency 300, seen. Rank 0's 0RECV_B0 starts at 4500 without a wait, after 1B0
    ended at 4300: the gradient was there by 4500, a bound of 200. 0B0 starts 100 after that arrival."""
    schedule = build("gpipe", 2, 1)
    rows = [  # rank, stage, kind, start, end
        (0, 0, "F", 0, 1000),
        (0, 0, "SEND_F", 1000, 1100),
        (1, 1, "RECV_F", 500, 1300),
        (1, 1, "F", 1300, 2300),
        (1, 1, "B", 2300, 4300),
        (1, 1, "SEND_B", 4300, 4400),
        (0, 0, "RECV_B", 4500, 4600),
        (0, 0, "B", 4600, 6600),
    ]
    cells = pl.DataFrame(
        [(rank, 0, stage, kind, 0, start, end, 0, False) for rank, stage, kind, start, end in rows],
        schema=CELL_SCHEMA,
        orient="row",
    )
    waits = pl.DataFrame(
        [(1, 0, 1, "RECV_F", 0, 600, 1300)], schema=cells.drop("blocked_ns", "inferred").schema, orient="row"
    )
    measured = measure(schedule, cells, waits, pl.DataFrame({"step": [0], "origin_ns": [0]}))
    assert sorted(measured.hops.select("direction", "latency", "seen").rows()) == [
        ("B", 200.0, False),
        ("F", 300.0, True),
    ]
    assert sorted(measured.actions["gap"]) == [0.0, 0.0, 0.0, 100.0]
    assert fit(measured, [0.0]).latency == {"F": 300.0, "B": 200.0}
