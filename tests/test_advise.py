"""`python -m analysis advise`: other schedules, chunks and split backwards predicted from one run, the
stash carried to them, and a run whose level cannot be trusted still listing its candidates."""

from __future__ import annotations

import json
import warnings

import pytest

from analysis import results
from analysis.attribution.advice import (
    output_row_bytes,
    peak_bytes,
    spread_caveat,
    stash_bytes_per_row,
)
from analysis.cli import main
from analysis.job.run_dir import read_run
from analysis.report import advice_section, build_report, sweeps
from analysis.report.runs import load_run
from runners.schedules import build
from synthetic import write_run

# no slowdown: the generator's is one factor in every schedule, where predict carries it with the ranks' overlap
WORK = dict(p2p_latency_us=40, small_gemm=1.2, steps=3)
US = {"F": 1000, "B": 2000, "I": 1000, "W": 1000}  # B splits 1:1, the ratio advise assumes


def _advice(run, *args) -> dict:
    assert main(["advise", str(run), *args]) == 0
    found = json.loads((run / "advice.json").read_text())
    return found | {"by": {(c["schedule"], c["m"], c["v"]): c for c in found["candidates"]}}


@pytest.mark.parametrize(
    "name,m,v,durations",
    [
        ("1f1b", 4, 1, US),  # the run's own m: its executed gpipe orders must not be kept
        ("zb", 4, 1, US),  # I and W from the measured B
        ("interleaved", 4, 2, {kind: us / 2 for kind, us in US.items()}),  # a chunk holds half a stage
    ],
)
def test_another_schedule_is_the_step_of_its_run(tmp_path, name, m, v, durations):
    """A gpipe m=4 run's advice for another schedule is the step of the synthetic run of that schedule
    whose work per layer is the same."""
    write_run(tmp_path / "gpipe", build("gpipe", 2, 4), durations_us=US, **WORK)
    candidate = _advice(tmp_path / "gpipe", "--ms", str(m), "--schedules", name, "--vs", str(v))["by"][
        (name, m, v)
    ]
    truth = write_run(tmp_path / name, build(name, 2, m, v), durations_us=durations, **WORK).truth[0]
    assert candidate["step_time_ms"] == pytest.approx(truth.step_ns / 1e6, abs=1e-3)
    assert candidate["extrapolated"] == (name != "1f1b")


def test_chunks_i_and_w_the_runner_timed_replace_shares_and_the_unit_split(tmp_path):
    """With --calibrate-advice's times (run.json advice_calibration) a chunk at v=2 takes 0.7 of its stage's
    F, and I and W 0.3 and 0.15 of its B, not half and 1:1: zb v=2 is the step of the synthetic run
    with those times per chunk, assumes nothing, and its stash per row is the measured chunk's."""
    write_run(tmp_path / "gpipe", build("gpipe", 2, 4), durations_us=US, **WORK)
    config = json.loads((tmp_path / "gpipe" / "run.json").read_text())
    by_rows = config["calibration_by_rows"]
    share = {"F_ms": ("F_ms", 0.7), "B_ms": ("B_ms", 0.45), "I_ms": ("B_ms", 0.3), "W_ms": ("B_ms", 0.15)}
    chunks = {
        str(c): {
            rows: {kind: t[src] * f for kind, (src, f) in share.items()}
            for rows, t in by_rows[str(c // 2)].items()
        }
        for c in range(4)
    }
    timed = {
        "1": {
            "calibration_by_rows": by_rows,
            "calibration_by_rows_samples_ms": {},
            "stash_bytes_per_row": {},
        },
        "2": {"calibration_by_rows": chunks, "calibration_by_rows_samples_ms": {}, "stash_bytes_per_row": {}},
    }
    (tmp_path / "gpipe" / "run.json").write_text(json.dumps(config | {"advice_calibration": timed}))
    candidate = _advice(tmp_path / "gpipe", "--ms", "4", "--schedules", "zb", "--vs", "2")["by"][("zb", 4, 2)]
    chunk_us = {"F": 700, "B": 900, "I": 600, "W": 300}
    truth = write_run(tmp_path / "zb", build("zb", 2, 4, 2), durations_us=chunk_us, **WORK).truth[0]
    assert candidate["step_time_ms"] == pytest.approx(truth.step_ns / 1e6, abs=1e-3)
    assert not candidate["extrapolated"] and candidate["caveats"] == []
    per_row = {0: 100, 1: 50}  # the run's; the runner measured a chunk at 0.6 of its stage's
    measured = (
        {"stash_bytes_per_row": {"0": 10, "1": 10}},
        {"stash_bytes_per_row": {str(c): 6 for c in range(4)}},
    )
    target = build("zb", 2, 4, 2)
    rows = {"dims": {"microbatch_rows": [128] * 4}}
    assert peak_bytes(target, rows, per_row, 2, measured) == pytest.approx(
        1.2 * peak_bytes(target, rows, per_row, 2), abs=1
    )


def test_the_advice_is_best_first_and_ranked_on_a_calibrated_run(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 4), durations_us=US, **WORK)
    found = _advice(tmp_path)
    steps = [c["step_time_ms"] for c in found["candidates"]]
    assert found["ranked"] and steps == sorted(steps) and len(steps) > 10
    assert {"zbv", "dualpipev"} <= {c["schedule"] for c in found["candidates"]}
    assert all(c["engine"] == "torch" for c in found["candidates"] if c["schedule"] in ("zbv", "dualpipev"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # advice.json read as "not a trace" would be a warning
        read_run(tmp_path)


def test_without_calibration_each_candidate_names_what_it_assumes(tmp_path):
    """No calibration is no reason to distrust the run's level: the candidates are ranked, each naming the
    assumptions that stand in for it (tests/test_predict_foreign.py has the trace-alone cases)."""
    write_run(tmp_path, build("gpipe", 2, 4), durations_us=US, **WORK)
    config = json.loads((tmp_path / "run.json").read_text())
    for key in ("calibration", "calibration_by_rows", "rows_per_microbatch"):  # m splits the same batch
        del config[key]
    (tmp_path / "run.json").write_text(json.dumps(config))
    found = _advice(tmp_path, "--ms", "2,4,8")
    assert found["ranked"] and found["candidates"]
    for c in found["candidates"]:
        executed = (c["schedule"], c["m"], c["v"]) == ("gpipe", 4, 1)
        assert ("cells_as_measured" in c["assumptions"]) == (not executed)
        assert ("time_per_row_constant" in c["assumptions"]) == (c["m"] != 4)
        assert c["extrapolated"] == bool(c["assumptions"] or c["caveats"])


def test_the_stash_is_carried_by_rows_and_in_flight_count():
    """gpipe p=2 m=4 of 128 rows: rank 0 held 4 x 128 rows at 100 B a row, rank 1 at 50. 1f1b holds 2
    microbatches on rank 0; gpipe m=8 the same rows as m=4. Interleaved v=2 m=4 runs on rank 0 chunks of
    half of stage 0 (50 B a row) and half of stage 1 (25 B a row): at most 4 of the first and 1 of the
    second, after 0F0 0F1 2F0 2F1 0F2 2B0 0F3."""
    config = {"dims": {"microbatch_rows": [128] * 4}}
    source = build("gpipe", 2, 4)
    per_row = stash_bytes_per_row(source, config, [4 * 128 * 100, 4 * 128 * 50])
    assert per_row == {0: 100, 1: 50}

    def peak(name, m, v=1, kept=0.0):
        return peak_bytes(
            build(name, 2, m, v),
            config | {"dims": {"microbatch_rows": [512 // m] * m}},
            per_row,
            2,
            None,
            kept,
        )

    assert peak("1f1b", 4) == 2 * 128 * 100
    # on torch rank 1 also keeps its 4 outputs (60 B a row) to the step's end: after its last F it
    # holds that microbatch's stash and all four
    assert peak("1f1b", 4, kept=60) == 128 * 50 + 4 * 128 * 60
    assert output_row_bytes({"dims": {"sample_shape": [512]}, "dtype": "bfloat16"}) == 1024
    assert peak("gpipe", 8) == 4 * 128 * 100
    assert peak("interleaved", 4, 2) == 128 * (4 * 50 + 25)
    assert stash_bytes_per_row(source, config, [1, None]) is None


def test_the_run_page_shows_the_advice_and_the_sweep_page_its_measured_runs(tmp_path):
    """The m=2 run's advice.json (the sweep's middle run, whose prediction the sweep page draws): a table
    and a chart (step and memory against m, the memory limit as a rule) on its page; the sweep page draws
    the same curves with the sweep's runs as points."""
    traces = tmp_path / "traces"
    for m in (2, 4):
        write_run(traces / f"m{m}", build("gpipe", 2, m), run_id=f"m{m}", durations_us=US, **WORK)
    assert (
        main(["advise", str(traces / "m2"), "--ms", "2,4", "--schedules", "gpipe,zb", "--memory-mb", "1"])
        == 0
    )
    found = results.read_advice(traces / "m2")
    build_report(traces, tmp_path / "reports")
    page = (tmp_path / "reports" / "runs" / "m2.html").read_text()
    assert "Advice: schedule, m and v at this p" in page and "the memory limit, 1.0 MiB" in page
    first = found.candidates[0]
    assert f'<td title="step ms">{first.step_time_ms:.1f}</td>' in page
    figure = advice_section.sweep_figure(load_run(traces / "m2"), _runs(traces), "advice")
    spec = figure.plot.spec()
    assert {row["label"] for row in spec["datasets"]["measured"]} == {"gpipe v=1 (synthetic)"}
    assert sorted(row["m"] for row in spec["datasets"]["measured"]) == [2, 4]
    assert len(spec["datasets"]["candidates"]) == len(found.candidates)
    assert "advice-vs-m-0" in (tmp_path / "reports" / "index.html").read_text() + _scripts(
        tmp_path / "reports"
    )


def _runs(traces):
    loaded = [load_run(path) for path in sorted(traces.iterdir())]
    return sweeps.runs_frame([sweeps.run_row(r.run_id, r.summary, r.config) for r in loaded])


def _scripts(reports) -> str:
    return "".join(path.read_text() for path in reports.glob("*.js"))


def test_a_noisy_run_lists_its_candidates_unranked_with_the_note(tmp_path):
    """Unprofiled steps of 10, 20 and 30 ms spread 100% of their median: the run is flagged noisy, and its
    advice says so instead of ranking."""
    write_run(tmp_path, build("gpipe", 2, 4), durations_us=US, **WORK)
    config = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps(config | {"step_times_unprofiled_ms": [10.0, 20.0, 30.0]}))
    found = _advice(tmp_path, "--ms", "4", "--schedules", "gpipe,1f1b")
    assert not found["ranked"] and len(found["candidates"]) == 2
    assert any("unprofiled steps spread" in why for why in found["caveats"])
    # the steps' levels (0.5x to 1.5x) widen every candidate's interval past the promised error
    assert all(any("its interval" in why for why in c["caveats"]) for c in found["candidates"])


def test_a_candidate_whose_interval_reaches_beyond_the_promised_error_says_so():
    """The caveat follows the interval against PROMISED_STEP_ERROR of the point, on either side."""
    assert spread_caveat(100.0, 91.0, 109.0) == []
    assert spread_caveat(100.0, 89.0, 105.0) and spread_caveat(100.0, 95.0, 111.0)
