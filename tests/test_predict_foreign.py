"""`predict` and `advise` from the trace alone (no run.json, or one stripped to what a foreign trace has):
they work, each figure names the assumptions it rests on, and at the run's own m the other schedules'
steps are the calibrated ones' (and the generator's)."""

from __future__ import annotations

import html
import json
import re
import shutil

import pytest
from test_memory import memory_run

from analysis.attribution.from_trace import SIZE_BAND_PER_HALVING, size_band
from analysis.cli import main
from analysis.report import advice_section
from analysis.report.runs import load_run
from analysis.vocabulary import ASSUMED, Assumption
from runners.schedules import build
from synthetic import write_run

WORK = dict(
    durations_us={"F": 1000, "B": 2000, "I": 1000, "W": 1000}, p2p_latency_us=40, small_gemm=1.2, steps=3
)
OWN_M_ONLY = {str(Assumption.CELLS_AS_MEASURED)}  # at the run's own m: the same cells reordered
OTHER_M = [str(a) for a in (Assumption.ROWS_EVEN, Assumption.TIME_PER_ROW, Assumption.CELLS_AS_MEASURED)]


def _foreign(directory, shape="cpu", slowdown=1.0, keep=()):
    """A calibrated synthetic gpipe p=2 m=4 run at `directory`/cal and its copy at `directory`/bare whose
    run.json is gone, or holds only the schedule, p, m, v and the keys in `keep` (what a foreign trace
    could say)."""
    truth = write_run(directory / "cal", build("gpipe", 2, 4), shape=shape, slowdown=slowdown, **WORK)
    shutil.copytree(directory / "cal", directory / "bare")
    config = json.loads((directory / "cal" / "run.json").read_text())
    (directory / "bare" / "run.json").unlink()
    (directory / "bare" / "truth.json").unlink()
    if keep:
        stripped = {key: config[key] for key in ("schedule", "p", "m", "v", *keep)} | {"complete": True}
        (directory / "bare" / "run.json").write_text(json.dumps(stripped))
    return truth


def _predicted(run, *ms) -> dict[int, dict]:
    assert main(["predict", str(run), "--ms", ",".join(map(str, ms))]) == 0
    return {row["m"]: row for row in json.loads((run / "predict.json").read_text())}


def _advised(run, *args) -> dict:
    assert main(["advise", str(run), *args]) == 0
    found = json.loads((run / "advice.json").read_text())
    found["by"] = {(c["schedule"], c["m"], c["v"]): c for c in found["candidates"]}
    return found


def test_without_run_json_predict_names_its_assumptions_and_widens_other_m_by_the_band(tmp_path):
    _foreign(tmp_path)
    own = _predicted(tmp_path / "cal", 4)[4]
    found = _predicted(tmp_path / "bare", 2, 4, 8)
    assert found[4]["assumptions"] == [] and found[4]["step_time_ms"] == pytest.approx(own["step_time_ms"])
    for m in (2, 8):
        assert found[m]["assumptions"] == OTHER_M
        # the same batch split m ways: each cell's rows change by 4/m, its time per row by up to the band
        band = size_band(4 / m)
        assert band == pytest.approx(SIZE_BAND_PER_HALVING)
        low, point, high = (found[m][k] for k in ("step_time_low_ms", "step_time_ms", "step_time_high_ms"))
        assert low < point / band * 1.01 and high > point * band * 0.99


def test_at_the_run_s_own_m_other_schedules_need_no_size_assumption(tmp_path):
    """The trace alone at m=4: 1f1b and zb are the generator's own steps (the synthetic cells take the same
    time in any order), and the calibrated prediction's, which carries the slowdown with concurrency."""
    _foreign(tmp_path)
    calibrated = _advised(tmp_path / "cal", "--ms", "4", "--vs", "1", "--schedules", "1f1b,zb")
    bare = _advised(tmp_path / "bare", "--ms", "4", "--vs", "1", "--schedules", "1f1b,zb")
    assert bare["ranked"]
    for key in (("1f1b", 4, 1), ("zb", 4, 1)):
        c = bare["by"][key]
        assert set(c["assumptions"]) - {str(Assumption.BACKWARD_SPLIT)} == OWN_M_ONLY
        truth = write_run(tmp_path / key[0], build(key[0], 2, 4), **WORK).truth[0].step_ns / 1e6
        assert c["step_time_ms"] == pytest.approx(truth, abs=1e-3)
        assert c["step_time_ms"] == pytest.approx(calibrated["by"][key]["step_time_ms"], rel=0.10)


def test_a_gpu_shaped_run_with_run_json_stripped_predicts_the_generator_s_steps(tmp_path):
    """GPU-shaped traces whose run.json keeps only the microbatch's rows: at other m the generator's step
    (the same rows a microbatch, the same work per row) lies in the interval, at the point when exact."""
    _foreign(tmp_path, shape="gpu", keep=("rows_per_microbatch",))
    found = _predicted(tmp_path / "bare", 2, 4, 8)
    for m in (2, 8):
        assert found[m]["assumptions"] == [str(Assumption.CELLS_AS_MEASURED)]  # rows known, unchanged
        truth = (
            write_run(tmp_path / f"m{m}", build("gpipe", 2, m), shape="gpu", **WORK).truth[0].step_ns / 1e6
        )
        assert found[m]["step_time_low_ms"] <= truth <= found[m]["step_time_high_ms"]
        assert found[m]["step_time_ms"] == pytest.approx(truth, rel=0.02)


def _rows(out: str) -> list[str]:
    """The table rows of predict's or advise's output: lines starting with a number."""
    return [line for line in out.splitlines() if re.match(r"\s+\d+\s", line)]


def test_every_figure_that_rests_on_an_assumption_is_shown_beside_its_name(tmp_path, capsys):
    """The CLI's rows, predict.json, advice.json and the report's advice table: wherever a figure rests on
    an assumption its name is beside it, and the legend says what each name means."""
    _foreign(tmp_path)
    capsys.readouterr()
    predicted = _predicted(tmp_path / "bare", 2, 4, 8)
    out = capsys.readouterr().out
    for line, row in zip(_rows(out), sorted(predicted.values(), key=lambda r: r["m"]), strict=True):
        assert all(name in line for name in row["assumptions"]), line
    advice = _advised(tmp_path / "bare", "--ms", "4,8", "--vs", "1,2")
    out = capsys.readouterr().out
    assert "None" not in out  # a run no run.json names the engine of
    for line, c in zip(_rows(out), advice["candidates"], strict=True):
        assert all(name in line for name in c["assumptions"]), line
    named = {n for c in advice["candidates"] for n in c["assumptions"]} | set(advice["assumptions"])
    assert named and all(f"assumed {name}: {ASSUMED[Assumption(name)]}" in out for name in named)
    page, _ = advice_section.section(load_run(tmp_path / "bare"))
    shown = advice["candidates"][: advice_section.SHOWN]
    named = {n for c in shown for n in c["assumptions"]} | set(advice["assumptions"])
    assert all(f"<code>{name}</code>: {html.escape(ASSUMED[Assumption(name)])}" in page for name in named)


def test_without_memory_events_the_ranking_says_it_ignores_memory(tmp_path):
    _foreign(tmp_path)
    found = _advised(tmp_path / "bare", "--ms", "4", "--vs", "1")
    assert found["assumptions"] == [str(Assumption.MEMORY_UNKNOWN)]
    assert all(c["peak_activation_bytes"] is None and c["fits"] for c in found["candidates"])


def test_memory_events_give_the_peak_without_run_json(tmp_path):
    """A foreign trace with allocator events and a stash counter: each candidate's peak is carried from
    them (the rows split evenly, the bytes per row the measured peak's), and the ranking uses it."""
    run = memory_run(tmp_path / "run")
    found = _advised(run, "--ms", "1,2", "--vs", "1", "--schedules", "gpipe")
    assert found["assumptions"] == []
    own = found["by"][("gpipe", 1, 1)]
    assert own["peak_activation_bytes"] == 2500 and own["assumptions"] == []  # the larger rank's, as measured
    assert found["by"][("gpipe", 2, 1)]["peak_activation_bytes"] == 2500  # two halves of the rows in flight
    assert str(Assumption.ROWS_EVEN) in found["by"][("gpipe", 2, 1)]["assumptions"]


def test_a_noisy_run_without_calibration_stays_unranked(tmp_path):
    """The trust gate is kept: the run.json stripped to its unprofiled steps, spread 100% of their median."""
    _foreign(tmp_path, keep=("step_times_unprofiled_ms",))
    config = json.loads((tmp_path / "bare" / "run.json").read_text())
    config["step_times_unprofiled_ms"] = [10.0, 20.0, 30.0]
    (tmp_path / "bare" / "run.json").write_text(json.dumps(config))
    found = _advised(tmp_path / "bare", "--ms", "4", "--vs", "1", "--schedules", "gpipe,1f1b")
    assert not found["ranked"] and any("unprofiled steps spread" in why for why in found["caveats"])
