"""`predict`: one run's step model replayed at other m, against synthetic runs made at those m and a
hand-computed single-rank step."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import polars as pl
import pytest

from analysis.attribution.model import StepModel
from analysis.attribution.own_step import OwnSteps
from analysis.attribution.predict import Unpredictable, calibration_drift, concurrency, predict, step_levels
from analysis.attribution.reference import REFERENCE_SCHEMA, Reference, reference
from analysis.attribution.replay import Inputs, Replayed, Tail
from analysis.cli import main
from analysis.errors import InputError
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import analysis_of, read_run
from analysis.report import build_report
from analysis.report.sweeps import predicted_steps
from runners.presets import CALIBRATED_MS
from runners.schedules import Action, Kind, bubble_formula, build, lower
from synthetic import write_run
from synthetic.executor_sim import RENDEZVOUS, Transport
from synthetic.executor_trace import write_executor_run

# no launch gaps: a synthetic rank's first action spares its gap, which a model of medians charges; no
# slowdown: the generator's is one factor at every m, where predict carries it with the ranks' overlap
WORK = dict(durations_us={"F": 1000, "B": 2000}, p2p_latency_us=40, small_gemm=1.2, steps=3)


def _independent(directory, schedule, slowdown=1.0):
    """WORK's run from the independent generator (gloo's rendezvous, no host time): its step is the
    truth, not the analysis's own replay."""
    return write_executor_run(
        directory,
        schedule,
        durations_us=WORK["durations_us"],
        transport=Transport(RENDEZVOUS, WORK["p2p_latency_us"] * 1000),
        small_gemm=WORK["small_gemm"],
        slowdown=slowdown,
    )


@pytest.mark.parametrize("name,p,v", [("gpipe", 2, 1), ("1f1b", 4, 1), ("interleaved", 2, 2)])
def test_a_prediction_at_another_m_is_that_m_s_step(tmp_path, name, p, v):
    """The synthetic microbatch does the same work at every m: the m=4 run's model, replayed at m=8 and
    m=2, gives the steps of the runs made at those m."""
    _independent(tmp_path / "m4", build(name, p, 4, v))
    assert main(["predict", str(tmp_path / "m4"), "--ms", "2,4,8"]) == 0
    predicted = {row["m"]: row for row in json.loads((tmp_path / "m4" / "predict.json").read_text())}
    assert set(predicted) == ({4, 8} if name == "1f1b" else {2, 4, 8})  # 1f1b p=4 cannot run m=2
    for m in set(predicted) - {4}:
        truth_ms = _independent(tmp_path / f"m{m}", build(name, p, m, v)).step_ns / 1e6
        assert predicted[m]["step_time_ms"] == pytest.approx(truth_ms, abs=1e-3), m
        assert predicted[m]["bubble_formula"] == bubble_formula(build(name, p, m, v))
        measured = analyze_pipeline(read_run(tmp_path / f"m{m}")).summary.bubble_measured
        assert predicted[m]["bubble_predicted"] == pytest.approx(measured, abs=1e-4), m


def test_a_slowdown_is_carried_as_far_as_ranks_compute_together(tmp_path):
    """Busy time 1.3x the isolated work at m=4, where the ranks overlap. gpipe at m=1 never overlaps them:
    its prediction is the isolated work (1.2 ms F, 2.4 ms B at the run's fixed 64 rows) and the two
    hops, none of the slowdown. m=2 overlaps them less than m=4: its prediction lies between the steps
    of runs made at m=2 with none and with all of it."""
    _independent(tmp_path / "m4", build("gpipe", 2, 4), slowdown=1.3)
    assert main(["predict", str(tmp_path / "m4"), "--ms", "1,2"]) == 0
    rows = json.loads((tmp_path / "m4" / "predict.json").read_text())
    predicted = {row["m"]: row["step_time_ms"] for row in rows}
    assert predicted[1] == pytest.approx(2 * (1.2 + 2.4) + 2 * 0.04)
    steps = {f: _independent(tmp_path / f"m2-{f}", build("gpipe", 2, 2), f).step_ns / 1e6 for f in (1.0, 1.3)}
    assert steps[1.0] + 0.1 < predicted[2] < steps[1.3] - 0.1


def test_concurrency_is_the_share_of_compute_time_with_another_rank_computing():
    """Rank 0 computes over [0, 10] and [20, 30], rank 1 over [5, 15], a hop between them: 10 of the
    30 compute-rank units overlap (5 on each rank); touching cells do not overlap."""
    f0, b0, f1 = Action(0, Kind.F, 0), Action(0, Kind.B, 0), Action(1, Kind.F, 0)
    send = Action(0, Kind.SEND_F, 0)
    spans = {f0: (0.0, 10.0), send: (10.0, 12.0), b0: (20.0, 30.0), f1: (5.0, 15.0)}
    replayed = Replayed(30.0, spans, (), {})
    assert concurrency(replayed, ((f0, send, b0), (f1,))) == pytest.approx(10 / 30)
    spans[f1] = (10.0, 20.0)
    assert concurrency(replayed, ((f0, send, b0), (f1,))) == 0.0


def _one_rank_run():
    """One rank, gpipe m=2: every measured cell of a (stage, kind) alike; busy F 1.5x its isolated 2 ms,
    busy B 2x its isolated 4 ms; 1 ms F and 2.5 ms B at 16 rows (m=4)."""
    schedule = build("gpipe", 1, 2)
    kinds = {(0, "F"): Inputs(lead=1e5, work=3e6), (0, "B"): Inputs(lead=2e5, work=8e6)}
    model = StepModel(
        kinds, (Tail(other=5e5),), lower(schedule).orders, blocking_sends=False, eager_receives=False
    )
    cells = pl.DataFrame(
        [
            (0, 0, position, 0, kind, mb, *kinds[(0, kind)].__dict__.values())
            for position, (kind, mb) in enumerate([("F", 0), ("F", 1), ("B", 0), ("B", 1)])
        ],
        schema=[
            "step",
            "rank",
            "position",
            "stage",
            "kind",
            "microbatch",
            "lead",
            "pre",
            "work",
            "transfer",
            "post",
        ],
        orient="row",
    )
    tails = pl.DataFrame(
        {
            "step": [0],
            "rank": [0],
            "dp_sync": [0.0],
            "other": [5e5],
            "launch_overhead": [0.0],
            "barrier": [0.0],
            "opened": [0.0],
        }
    )
    own = OwnSteps(cells, tails, blocking_sends=False, eager_receives=False)
    isolated = [(0, kind, mb, 0.0, ns) for kind, ns in (("F", 2e6), ("B", 4e6)) for mb in range(2)]
    ref = Reference(pl.DataFrame(isolated, schema=REFERENCE_SCHEMA, orient="row"), calibrated=True)
    config = {
        "dims": {"rows": 64, "microbatch_rows": [32, 32]},
        "calibration": {"0": {"F_ms": 3.0, "B_ms": 6.0}},
        "calibration_by_rows": {"0": {"32": {"F_ms": 2.0, "B_ms": 4.0}, "16": {"F_ms": 1.0, "B_ms": 2.5}}},
    }
    return schedule, model, own, ref, config


def test_busy_time_scales_with_the_isolated_calibration_and_the_rest_is_kept():
    """The step is every action's busy time, host time and the tail in a row: at m=4 each F takes
    3/2 x 1 ms, each B 8/4 x 2.5 ms. Every measured cell alike, no levels: the interval is the point."""
    schedule, model, own, ref, config = _one_rank_run()
    found = predict(schedule, model, own, ref, config, 4, "run.json")
    busy_ms = 4 * (1.5 + 2.5 * 2)  # F: 3/2 x 1 ms, B: 8/4 x 2.5 ms
    assert found.step_time_ms == pytest.approx(busy_ms + 4 * (0.1 + 0.2) + 0.5)
    assert (found.step_time_low_ms, found.step_time_high_ms) == pytest.approx((found.step_time_ms,) * 2)
    assert found.bubble_predicted == pytest.approx(1 - busy_ms / found.step_time_ms)
    with pytest.raises(Unpredictable, match=r"no entry for m=8's microbatch rows \[8\]"):
        predict(schedule, model, own, ref, config, 8, "run.json")


def test_the_slowdown_leaves_out_the_machine_s_drift_since_the_calibration():
    """Profiled steps at 1.25x the median of the unprofiled ones, which ran between the calibration's
    rounds: the machine ran the cells 1.25x slower than the calibration, so each busy time is divided
    by 1.25 before it is scaled (one rank: no concurrency moves it); host time and the tail stay."""
    schedule, model, own, ref, config = _one_rank_run()
    drift = calibration_drift([12.5, 10.0, 12.5], {"step_times_unprofiled_ms": [9.0, 10.0, 11.0]})
    assert drift == pytest.approx(1.25)
    assert calibration_drift([12.5], {}) == 1.0
    found = predict(schedule, model, own, ref, config, 4, "run.json", drift=drift)
    busy_ms = 4 * (1.5 + 2.5 * 2) / 1.25
    assert found.step_time_ms == pytest.approx(busy_ms + 4 * (0.1 + 0.2) + 0.5)


def test_a_run_s_drift_moves_its_overlapping_cells_but_not_gpipe_at_m_1(tmp_path):
    """The m=4 run's unprofiled steps at 0.8x its profiled ones: m=2 is predicted lower than with none, m=1
    (whose ranks never overlap) stays the isolated work and the two hops."""
    write_run(tmp_path / "m4", build("gpipe", 2, 4), **WORK, slowdown=1.3)
    assert main(["predict", str(tmp_path / "m4"), "--ms", "1,2"]) == 0
    steady = {
        row["m"]: row["step_time_ms"] for row in json.loads((tmp_path / "m4" / "predict.json").read_text())
    }
    config = json.loads((tmp_path / "m4" / "run.json").read_text())
    config["step_times_unprofiled_ms"] = [0.8 * ms for ms in config["step_times_unprofiled_ms"]]
    (tmp_path / "m4" / "run.json").write_text(json.dumps(config))
    assert main(["predict", str(tmp_path / "m4"), "--ms", "1,2"]) == 0
    drifted = {
        row["m"]: row["step_time_ms"] for row in json.loads((tmp_path / "m4" / "predict.json").read_text())
    }
    assert drifted[1] == pytest.approx(steady[1]) == pytest.approx(2 * (1.2 + 2.4) + 2 * 0.04)
    assert drifted[2] < steady[2] - 1.0
    # advise takes the drift out as predict does: its gpipe m=2 is predict's
    assert main(["advise", str(tmp_path / "m4"), "--schedules", "gpipe", "--ms", "2", "--vs", "1"]) == 0
    (advised,) = json.loads((tmp_path / "m4" / "advice.json").read_text())["candidates"]
    assert advised["step_time_ms"] == pytest.approx(drifted[2])


def test_the_interval_carries_the_run_s_step_levels():
    """Steps timed at 0.8x and 1.25x their median (the machine's speed moving them whole): the interval
    runs from 0.8x to 1.25x the point; the point itself does not move."""
    schedule, model, own, ref, config = _one_rank_run()
    point = predict(schedule, model, own, ref, config, 4, "run.json")
    levels = step_levels([80.0, 100.0, 125.0], {"step_times_unprofiled_ms": [8.0, 10.0, 12.5]})
    assert sorted(levels) == pytest.approx([0.8, 0.8, 1.0, 1.0, 1.25, 1.25])
    found = predict(schedule, model, own, ref, config, 4, "run.json", levels)
    assert found.step_time_ms == point.step_time_ms
    assert found.step_time_low_ms == pytest.approx(0.8 * point.step_time_ms)
    assert found.step_time_high_ms == pytest.approx(1.25 * point.step_time_ms)


def test_the_interval_carries_the_calibration_s_spread():
    """The 16-row F timed alone at 0.5, 1 and 1.5 ms (median 1): resampled medians move each F's work
    both ways, so the interval holds the point strictly inside; with the samples all at 1 ms it is the
    point."""
    schedule, model, own, ref, config = _one_rank_run()
    samples = {"32": {"F_ms": [2.0] * 3, "B_ms": [4.0] * 3}, "16": {"F_ms": [1.0] * 3, "B_ms": [2.5] * 3}}
    steady = predict(
        schedule, model, own, ref, config | {"calibration_by_rows_samples_ms": {"0": samples}}, 4, ""
    )
    assert (steady.step_time_low_ms, steady.step_time_high_ms) == pytest.approx((steady.step_time_ms,) * 2)
    samples["16"]["F_ms"] = [0.5, 1.0, 1.5]
    spread = predict(
        schedule, model, own, ref, config | {"calibration_by_rows_samples_ms": {"0": samples}}, 4, ""
    )
    assert spread.step_time_ms == steady.step_time_ms
    assert spread.step_time_low_ms < spread.step_time_ms < spread.step_time_high_ms


def test_without_the_isolated_calibration_predict_names_what_it_assumes(tmp_path, capsys):
    write_run(tmp_path, build("gpipe", 2, 4), **WORK)
    config = json.loads((tmp_path / "run.json").read_text())
    del config["calibration_by_rows"], config["rows_per_microbatch"]  # m=8 splits the same batch
    (tmp_path / "run.json").write_text(json.dumps(config))
    assert main(["predict", str(tmp_path), "--ms", "4,8"]) == 0
    found = {row["m"]: row for row in json.loads((tmp_path / "predict.json").read_text())}
    assert found[4]["assumptions"] == []
    assert found[8]["assumptions"] == ["time_per_row_constant", "cells_as_measured"]
    assert "assumed time_per_row_constant: " in capsys.readouterr().out


def test_a_direct_call_without_the_isolated_calibration_says_so():
    """The API's predict takes a run.json as from_trace leaves it: handed none, it names what is missing."""
    schedule, model, own, _, config = _one_rank_run()
    unknown = Reference(pl.DataFrame([], schema=REFERENCE_SCHEMA), calibrated=False)
    with pytest.raises(InputError, match="predict needs the isolated calibration"):
        predict(schedule, model, own, unknown, config, 4, "run.json")


def test_the_sweep_page_draws_the_prediction_from_its_middle_run(tmp_path):
    traces = tmp_path / "traces"
    truth = {m: write_run(traces / f"m{m}", build("gpipe", 2, m), run_id=f"m{m}", **WORK) for m in (2, 4, 8)}
    index = build_report(traces, tmp_path / "reports").read_text()
    assert "predicted from the m=4 run alone" in index
    source = analysis_of(traces / "m4")  # analyze stored its predictions: the report only reads them
    predicted = predicted_steps(source, [2, 4, 8])
    for m, step_ms, best in predicted.iter_rows():
        assert step_ms == pytest.approx(truth[m].truth[0].step_ns / 1e6, abs=1e-3)
        assert best == (m == 2)  # fixed microbatch work: fewer microbatches, a shorter step


def test_predict_json_beside_the_traces_is_no_trace_to_the_loader(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 4), **WORK)
    assert main(["predict", str(tmp_path), "--ms", "2"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "not a trace" would be a warning
        read_run(tmp_path)


def test_predict_without_ms_predicts_every_calibrated_count(tmp_path, capsys):
    """`predict RUN` as `make predict` and docs/guide.md give it: every m the runner calibrates, each row
    printed and written."""
    write_run(tmp_path, build("gpipe", 2, 4), **WORK)
    assert main(["predict", str(tmp_path)]) == 0
    written = [row["m"] for row in json.loads((tmp_path / "predict.json").read_text())]
    printed = [
        int(line.split()[0]) for line in capsys.readouterr().out.splitlines() if line[:6].strip().isdigit()
    ]
    assert written == printed == list(CALIBRATED_MS)


def test_an_order_that_deadlocks_with_the_run_s_blocking_sends_is_unpredictable_not_a_crash(tmp_path):
    """A run whose sends block (as a c10d::send that waits for its receiver does) cannot run 1f1b's lowered
    order, whose two ranks each send before they receive: that candidate is skipped with its reason."""
    write_run(tmp_path, build("gpipe", 2, 4), **WORK)
    analysis = analyze_pipeline(read_run(tmp_path))
    config = json.loads((tmp_path / "run.json").read_text())
    ref = reference(analysis.cells, config, 4)
    blocking = replace(analysis.model, blocking_sends=True)
    with pytest.raises(Unpredictable, match="deadlocks with the run's blocking sends"):
        predict(analysis.schedule, blocking, analysis.own, ref, config, 4, "run.json", name="1f1b")
    assert predict(analysis.schedule, analysis.model, analysis.own, ref, config, 4, "run.json", name="1f1b")
