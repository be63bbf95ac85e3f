"""Issue 8 through the CLI: a broken file or run directory ends as exit 2 with one line naming the file and
the problem (both `analyze` and `merge`), usable input with one `warning:` line, never a traceback.

Each case mutates a good synthetic run (synthetic.generate.write_run). The loader's own cases are also
tested one level down in test_load_errors.py and test_load_run.py; here they go through the commands.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from analysis.cli import main
from analysis.merge.perfetto_check import problems
from runners.schedules import build
from synthetic.generate import write_run

Mutation = Callable[[Path], object]


def good_run(directory: Path) -> Path:
    write_run(directory, build("1f1b", 2, 4), steps=2, run_id=directory.name)
    (directory / "truth.json").unlink()
    return directory


def document(run: Path, rank: int = 0) -> dict:
    return json.loads(gzip.decompress((run / f"rank{rank}.json.gz").read_bytes()))


def rewrite(run: Path, change: Callable[[dict], object], rank: int = 0) -> None:
    trace = document(run, rank)
    change(trace)
    (run / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))


def event(trace: dict, name: str) -> dict:
    return next(e for e in trace["traceEvents"] if e.get("name") == name)


def raw(run: Path, data: bytes, name: str = "rank0.json.gz") -> None:
    (run / "rank0.json.gz").unlink()
    (run / name).write_bytes(data)


def edit_run_json(run: Path, **fields) -> None:
    config = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({k: v for k, v in (config | fields).items() if v is not ...}))


def cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def truncated_json(run: Path) -> None:
    text = json.dumps(document(run)).encode()
    raw(run, gzip.compress(text[: len(text) // 2]))


def truncated_gzip(run: Path) -> None:
    data = (run / "rank0.json.gz").read_bytes()
    raw(run, data[:-30])


def corrupted_gzip(run: Path) -> None:
    data = bytearray((run / "rank0.json.gz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    raw(run, bytes(data))


# case -> (mutation, the file the line names, words of the problem)
REFUSED: dict[str, tuple[Mutation, str, str]] = {
    "empty file": (lambda run: raw(run, b"", "rank0.json"), "rank0.json", "empty file"),
    "not JSON": (lambda run: raw(run, gzip.compress(b"<html>")), "rank0.json.gz", "not valid JSON"),
    "truncated mid-array": (truncated_json, "rank0.json.gz", "truncated JSON"),
    "gzip truncated": (truncated_gzip, "rank0.json.gz", "gzip stream truncated"),
    "gzip corrupted": (corrupted_gzip, "rank0.json.gz", "gzip data corrupted"),
    "no traceEvents": (
        lambda run: rewrite(run, lambda t: t.pop("traceEvents")),
        "rank0.json.gz",
        "no traceEvents",
    ),
    "missing ts": (
        lambda run: rewrite(run, lambda t: event(t, "PP:0F1").pop("ts")),
        "rank0.json.gz",
        "missing ts",
    ),
    "missing dur": (
        lambda run: rewrite(run, lambda t: event(t, "PP:0F1").pop("dur")),
        "rank0.json.gz",
        "without dur",
    ),
    "missing ph": (
        lambda run: rewrite(run, lambda t: event(t, "PP:0F1").pop("ph")),
        "rank0.json.gz",
        "field `ph`",
    ),
    "ts a string": (
        lambda run: rewrite(run, lambda t: event(t, "PP:0F1").update(ts="ten")),
        "rank0.json.gz",
        "ts is not a number",
    ),
    "ph a number": (
        lambda run: rewrite(run, lambda t: event(t, "PP:0F1").update(ph=1)),
        "rank0.json.gz",
        "Expected `str`",
    ),
    "NaN duration": (
        lambda run: raw(
            run, gzip.compress(json.dumps(document(run)).replace('"dur": 1000.0', '"dur": NaN').encode())
        ),
        "rank0.json.gz",
        "not valid JSON",
    ),
    "two files claim a rank": (
        lambda run: rewrite(run, lambda t: t["distributedInfo"].update(rank=0), rank=1),
        "",
        "two files claim rank 0",
    ),
    "different world size": (
        lambda run: rewrite(run, lambda t: t["distributedInfo"].update(world_size=4), rank=1),
        "",
        "world sizes differ",
    ),
    "different run id": (
        lambda run: rewrite(run, lambda t: t.update(run_id="another"), rank=1),
        "",
        "run ids differ",
    ),
    "run.json says another p": (lambda run: edit_run_json(run, p=4), "run.json", "says p=4"),
    "run.json not complete": (lambda run: edit_run_json(run, complete=...), "run.json", "incomplete run"),
    "calibration not an object": (
        lambda run: edit_run_json(run, calibration=[1, 2]),
        "run.json",
        "bad calibration",
    ),
    "calibration time not a number": (
        lambda run: edit_run_json(run, calibration={"0": {"F_ms": "x", "B_ms": 1}}),
        "run.json",
        "'F_ms' = 'x' is not a time > 0",
    ),
    "calibration by rows not per row count": (
        lambda run: edit_run_json(run, calibration_by_rows={"0": {"many": {"F_ms": 1, "B_ms": 1}}}),
        "run.json",
        "row count 'many' is not an integer",
    ),
    "calibration by rows time negative": (
        lambda run: edit_run_json(run, calibration_by_rows={"0": {"32": {"F_ms": -1, "B_ms": 1}}}),
        "run.json",
        "calibration_by_rows: stage 0 rows 32: 'F_ms' = -1 is not a time > 0",
    ),
    "calibration without B_ms": (
        lambda run: edit_run_json(run, calibration={"0": {"F_ms": 1}}),
        "run.json",
        "bad calibration: stage 0: needs F_ms, B_ms",
    ),
    "run.json missing beside the runner's log": (
        lambda run: ((run / "run.json").unlink(), (run / "torchrun.log").write_text("killed\n")),
        "",
        "incomplete run",
    ),
}


@pytest.mark.parametrize("command", ["analyze", "merge"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, command):
    mutate, named, problem = REFUSED[case]
    run = good_run(tmp_path / "run")
    mutate(run)
    code, err = cli(capsys, command, str(run))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: {run / named if named else run}:"), err
    assert problem in err, err
    assert not (run / "analysis").exists() and not (run / "merged.json.gz").exists()  # nothing half-written


def last_label(trace: dict, name: str) -> dict:
    return [e for e in trace["traceEvents"] if e.get("name") == name][-1]


def without_steps(trace: dict) -> None:
    trace["traceEvents"] = [
        e for e in trace["traceEvents"] if not e.get("name", "").startswith("ProfilerStep#")
    ]


# Traces that load but do not show the run.json's schedule in every step: the analysis refuses them (a
# merge, which draws what is there, still works). case -> (mutation, words of the problem)
NOT_THE_SCHEDULE: dict[str, tuple[Mutation, str]] = {
    "duplicate events": (
        lambda run: rewrite(run, lambda t: t.update(traceEvents=t["traceEvents"] * 2)),
        "step 0 rank 0 ran PP:0B0 2x, the schedule 1x",
    ),
    "a label repeated in the last step": (
        lambda run: rewrite(run, lambda t: t["traceEvents"].append(dict(last_label(t, "PP:0F1")))),
        "step 1 rank 0 ran PP:0F1 2x",
    ),
    "a label dropped (negative duration)": (
        lambda run: rewrite(run, lambda t: last_label(t, "PP:0F1").update(dur=-1)),
        "step 1 rank 0 ran PP:0F1 0x",
    ),
    "a label outside its step": (
        lambda run: rewrite(run, lambda t: last_label(t, "PP:0F1").update(ts=1)),
        "ran PP:0F1 0x",
    ),
    "no ProfilerStep# spans": (
        lambda run: (rewrite(run, without_steps, 0), rewrite(run, without_steps, 1)),
        "ran PP:0B0 2x",
    ),  # both steps fall into one
}


@pytest.mark.parametrize("case", list(NOT_THE_SCHEDULE))
def test_traces_that_are_not_the_schedule_are_refused_naming_the_action(tmp_path, capsys, case):
    mutate, problem = NOT_THE_SCHEDULE[case]
    run = good_run(tmp_path / "run")
    mutate(run)
    code, err = cli(capsys, "analyze", str(run))
    assert code == 2, err
    assert err.splitlines()[-1].startswith(f"error: {run}: the traces' actions are not those of 1f1b p=2")
    assert problem in err, err
    assert not (run / "analysis").exists()


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"m": 8}, "says m=8, v=1 (p=2) but the traces show 4 microbatches and 2 stages"),
        ({"m": 10**9}, "says m=1000000000"),  # once built before it was checked: a schedule filling memory
        ({"v": 2}, "says m=4, v=2 (p=2)"),
        ({"schedule": "wavefront"}, "no usable schedule/p/m/v: unknown schedule 'wavefront'"),
        ({"m": "four"}, "no usable schedule/p/m/v"),
    ],
)
def test_run_json_schedule_that_contradicts_the_traces_is_refused(tmp_path, capsys, fields, problem):
    run = good_run(tmp_path / "run")
    edit_run_json(run, **fields)
    code, err = cli(capsys, "analyze", str(run))
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {run / 'run.json'}: "), err
    assert problem in err, err


def test_duplicate_events_merge_into_a_valid_trace(tmp_path, capsys):
    """Every event written twice (a trace concatenated with itself): the analysis refuses it (each action
    ran twice), so merge says why in one note and merges the events without the analysis's transfer
    arrows and tracks (it used to fail joining the doubled labels); Perfetto shows it as written."""
    run = good_run(tmp_path / "run")
    rewrite(run, lambda t: t.update(traceEvents=t["traceEvents"] * 2))
    code, err = cli(capsys, "merge", str(run))
    assert code == 0, err
    assert "note: merged without the analysis:" in err and "ran PP:0B0 2x, the schedule 1x" in err
    merged = json.loads(gzip.decompress((run / "merged.json.gz").read_bytes()))
    assert problems(merged) == []
    assert not [e for e in merged["traceEvents"] if e.get("cat") in ("p2p", "analysis")]
    assert not (run / "analysis").exists()


def test_a_negative_duration_is_one_warning_line_and_the_rest_is_analysed(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    rewrite(run, lambda t: event(t, "aten::gelu").update(dur=-5))
    code, err = cli(capsys, "analyze", str(run))
    assert code == 0, err
    assert err == f"warning: {run / 'rank0.json.gz'}: dropped 1 events with a negative duration\n"
    assert json.loads((run / "analysis" / "summary.json").read_text())["steps_analyzed"] == 2


def test_bare_event_arrays_are_analysed_like_the_full_format(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    assert cli(capsys, "analyze", str(run))[0] == 0
    expected = json.loads((run / "analysis" / "summary.json").read_text())
    for rank in (0, 1):  # the legacy format: no header, so the rank comes from the file name
        trace = document(run, rank)
        (run / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(trace["traceEvents"]).encode()))
    code, err = cli(capsys, "analyze", str(run))
    assert code == 0, err
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert summary["step_time_ms"] == expected["step_time_ms"] and summary["ranks"] == expected["ranks"]


def test_huge_string_args_and_markup_in_names_are_analysed_and_escaped(tmp_path, capsys):
    traces = tmp_path / "traces"
    run = good_run(traces / "run")
    markup = "<script>alert('x')</script> ünïcödé ☃"

    def poison(trace: dict) -> None:
        event(trace, "aten::gelu").update(name=markup, args={"blob": "x" * 2_000_000})
        trace["traceName"] = markup

    rewrite(run, poison)
    assert cli(capsys, "analyze", str(run))[0] == 0
    assert cli(capsys, "merge", str(run))[0] == 0
    assert (
        markup in gzip.decompress((run / "merged.json.gz").read_bytes()).decode()
    )  # kept verbatim as JSON text
    assert cli(capsys, "report", "--traces", str(traces), "--out", str(tmp_path / "reports"))[0] == 0
    for page in (tmp_path / "reports").rglob("*.html"):
        assert "<script>alert" not in page.read_text(), page


def test_non_nesting_labels_are_one_warning_line_and_still_close(tmp_path, capsys):
    """PP:0F1 starting half a millisecond before PP:0F0 ends: impossible on one thread (a stitched or
    corrupt trace), so the analysis says so, once for the rank, and analyses the times as they are."""
    run = good_run(tmp_path / "run")
    rewrite(run, lambda t: event(t, "PP:0F1").update(ts=event(t, "PP:0F1")["ts"] - 500))
    code, err = cli(capsys, "analyze", str(run))
    assert code == 0, err
    assert err.count("\n") == 1 and err.startswith(
        f"warning: {run / 'rank0.json.gz'}: 1 PP action(s) start before"
    )
    assert "first PP:0F1 in step 0" in err
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    for rank in summary["ranks"]:
        assert sum(rank[part] or 0 for part in summary["parts"]) == pytest.approx(summary["step_time_ms"])


def test_run_json_naming_another_schedule_of_the_same_actions_is_a_warning(tmp_path, capsys):
    """run.json says gpipe, the traces ran 1f1b (same actions, another order): replayed as it ran, and said."""
    run = good_run(tmp_path / "run")
    assert cli(capsys, "analyze", str(run))[0] == 0
    truth = json.loads((run / "analysis" / "summary.json").read_text())
    edit_run_json(run, schedule="gpipe")
    code, err = cli(capsys, "analyze", str(run))
    assert code == 0, err
    assert (
        err
        == f"warning: {run / 'run.json'}: says gpipe, but every rank ran 1f1b's order; replayed as it ran\n"
    )
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert summary["typical_step_ms"] == pytest.approx(truth["typical_step_ms"])  # 1f1b's replay


def test_a_trace_without_steps_labels_or_cpu_ops_is_refused(tmp_path, capsys):
    """Found by the analysis fuzz: with nothing to infer cells from, inference indexed an empty thread list.
    Now the trust gate refuses it first: one rank with nothing that hops is not a pipeline."""
    (tmp_path / "trace.json").write_text(
        json.dumps([{"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 5}])
    )
    code, err = cli(capsys, "analyze", str(tmp_path))
    assert code == 2 and err == (
        f"error: {tmp_path}: not a pipeline-parallel job: one rank, no send/recv and no pipeline labels; "
        "found no collectives either\n"
    ), err
