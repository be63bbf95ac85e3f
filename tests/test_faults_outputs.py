"""A full file system, a read-only one, two writers of one analysis: every command's outputs.

Each case starts from a run with every output made (analysis/, merged.json.gz, predict.json,
advice.json, a report), then makes the place full or read-only (tests/places.py: a real tmpfs where
the machine lets the tests mount one) and runs one command again: one line naming the place and the
cause, exit 2, no temporary file left, every previous output as it was. Before: tracebacks (an OSError
or polars' ComputeError from analyze, a chained one from the merge that also left its temporary file,
the report's, predict's and advise's), and the runner's on a read-only --traces.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, trace_command
from places import FULL_CAUSES, READ_ONLY_CAUSES, mount_tmpfs

import analysis.results
from analysis import results
from analysis.cli import main
from analysis.job.run_dir import analysis_of
from runners.schedules import build
from synthetic.generate import synthesize
from synthetic.truth import ROWS_PER_MICROBATCH, Work, calibration, calibration_by_rows, dims


def predictable_run(run: Path) -> Path:
    """A 1f1b p=2 m=2 run with the runner's run.json (calibration and rows), so predict and advise take it."""
    schedule = build("1f1b", 2, 2)
    work = Work({"F": 1000.0, "B": 2000.0})
    run.mkdir(parents=True)
    for rank, trace in synthesize(schedule, steps=2, run_id=run.name).traces.items():
        (run / f"rank{rank}.json").write_text(json.dumps(trace))
    config = {
        "schedule": "1f1b",
        "p": 2,
        "m": 2,
        "v": 1,
        "engine": "native",
        "device": "cpu",
        "calibration": calibration(schedule, work),
        "calibration_by_rows": calibration_by_rows(schedule, work),
        "rows_per_microbatch": ROWS_PER_MICROBATCH,
        "dims": dims(schedule),
        "complete": True,
    }
    (run / "run.json").write_text(json.dumps(config))
    return run


@dataclass(frozen=True)
class Command:
    name: str
    argv: list[str]  # {run}, {traces} and {reports} filled in
    written: str  # what the refusal names, relative to the place


COMMANDS = [
    Command("analyze", ["analyze", "{run}"], "traces/run/analysis"),
    Command("merge", ["merge", "{run}"], "traces/run/merged.json.gz"),
    Command("predict", ["predict", "{run}", "--ms", "2,4"], "traces/run/predict.json"),
    Command("advise", ["advise", "{run}", "--ms", "2,4"], "traces/run/advice.json"),
    Command("report", ["report", "--traces", "{traces}", "--out", "{reports}"], "reports/"),
]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """A folder with the run under traces/ and every command's output made, and a second run analysed
    since the report (so the report has a page to write): made once, copied into each place."""
    folder = tmp_path_factory.mktemp("outputs")
    paths = arguments(folder)
    predictable_run(folder / "traces" / "run")
    for command in COMMANDS:
        assert main([word.format(**paths) for word in command.argv]) == 0
    analysis_of(predictable_run(folder / "traces" / "newer"))
    return folder


def arguments(folder: Path) -> dict[str, str]:
    """What the commands' {run}, {traces} and {reports} are in `folder`."""
    return {
        "run": str(folder / "traces" / "run"),
        "traces": str(folder / "traces"),
        "reports": str(folder / "reports"),
    }


def every_output(place, outputs: Path, capsys) -> dict[str, str]:
    shutil.copytree(outputs, place.folder, symlinks=True, dirs_exist_ok=True)
    capsys.readouterr()
    return arguments(place.folder)


def refused(command: Command, place, paths: dict[str, str], capsys, causes: tuple[str, ...]) -> None:
    before = place.files()
    assert main([word.format(**paths) for word in command.argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {place.folder / command.written}".rstrip("/")), (
        err
    )
    assert any(f"({cause})" in err for cause in causes), err
    assert place.files() == before  # no temporary file, every previous output as it was


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_a_full_file_system_is_one_line_and_leaves_every_previous_output(place, outputs, capsys, command):
    paths = every_output(place, outputs, capsys)
    with place.full():
        refused(command, place, paths, capsys, FULL_CAUSES)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_a_read_only_file_system_is_one_line_and_leaves_every_previous_output(
    place, outputs, capsys, command
):
    paths = every_output(place, outputs, capsys)
    with place.read_only():
        refused(command, place, paths, capsys, READ_ONLY_CAUSES)


@pytest.mark.parametrize("where", ["read-only", "a file"])
def test_a_traces_folder_the_runner_cannot_write_is_one_line_before_any_process(place, where):
    traces = place.folder / "traces"
    if where == "a file":
        traces.write_text("not a folder")
    options = "--sched gpipe --p 2 --m 2 --preset tiny --device cpu --steps 1 --timed-steps 1"
    with place.read_only() if where == "read-only" else contextlib.nullcontext():
        result = subprocess.run(
            trace_command(traces, *options.split()), cwd=REPO, capture_output=True, text=True, timeout=120
        )
    assert (result.returncode, result.stderr.count("\n")) == (2, 1), result.stderr
    assert result.stderr.startswith(f"error: {traces}: cannot make a run directory here (")


@pytest.mark.slow
def test_a_run_on_a_full_file_system_fails_in_one_line_and_leaves_no_hidden_file(tmp_path):
    """A tmpfs that holds the run directory and its log but not the traces (it left 2 MB of hidden
    partial traces); the rank's refusal is in torchrun.log."""
    traces = tmp_path / "traces"
    traces.mkdir()
    if not mount_tmpfs(traces, "size=64k"):
        pytest.skip("needs a tmpfs of its own, and this machine refuses to mount one")
    try:
        options = "--sched gpipe --p 2 --m 2 --preset cpu --device cpu --steps 1 --timed-steps 1"
        result = subprocess.run(
            trace_command(traces, *options.split()), cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert (result.returncode, result.stderr.count("\n")) == (1, 1), result.stderr
        assert "a worker failed" in result.stderr
        (run,) = [path for path in traces.iterdir()]
        assert [path.name for path in run.iterdir() if path.name.startswith(".")] == []
        assert not (run / "rank0.json.gz").exists() and not (traces / "latest").exists()
    finally:
        subprocess.run(["umount", "-l", str(traces)], check=True)


def test_two_writers_of_one_analysis_each_leave_it_whole(tmp_path, monkeypatch):
    """Both find the analysis there and both move it aside at once: the second used to meet
    FileNotFoundError (1 in 1,200 writes with three writers); it now writes its own in turn."""
    run = predictable_run(tmp_path / "run")
    found = analysis_of(run)
    replace, met = analysis.results.os.replace, threading.Barrier(2, timeout=10)
    waited = threading.local()

    def together(source, target):  # the two writers meet before moving the analysis aside
        if Path(source) == run / results.ANALYSIS_DIR and not getattr(waited, "once", False):
            waited.once = True
            met.wait()
        return replace(source, target)

    monkeypatch.setattr(analysis.results.os, "replace", together)
    failures = []

    def write() -> None:
        try:
            results.write(run, found)
        except Exception as error:  # noqa: BLE001 - the failure is what the test reports
            failures.append(error)

    writers = [threading.Thread(target=write) for _ in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert failures == []
    assert results.read(run).summary == found.summary
    assert sorted(path.name for path in run.iterdir() if path.name.startswith(".")) == []


def test_the_analysis_directory_is_shared_as_the_other_outputs_are(tmp_path):
    """It was 0700 (mkdtemp's) while every file is 0644."""
    run = predictable_run(tmp_path / "run")
    analysis_of(run)
    assert stat.S_IMODE((run / results.ANALYSIS_DIR).stat().st_mode) == 0o755


@pytest.mark.parametrize("kind", ["a file", "a link"])
def test_an_analysis_that_is_a_file_or_a_link_is_left_as_it_is_and_refused(tmp_path, capsys, kind):
    run = predictable_run(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("mine")
    if kind == "a file":
        (run / results.ANALYSIS_DIR).write_text("mine")
    else:
        (run / results.ANALYSIS_DIR).symlink_to(elsewhere)
    assert main(["analyze", str(run)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {run / results.ANALYSIS_DIR}: is not the analysis directory analyze writes (a file or a "
        "link); left as it is\n"
    )
    assert (elsewhere / "mine.txt").read_text() == "mine" and [p.name for p in elsewhere.iterdir()] == [
        "mine.txt"
    ]
    assert (run / results.ANALYSIS_DIR).is_symlink() == (kind == "a link")


def test_python_dash_m_analysis_is_one_line_for_a_bad_option(tmp_path):
    """A command line the analysis refuses is `error: ...` on one line, as its runner's is."""
    result = subprocess.run(
        [sys.executable, "-m", "analysis", "advise", str(tmp_path), "--memory-mb", "inf"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (
        2,
        "error: argument --memory-mb: not a number written in decimals: 'inf'\n",
    )


# A real SIGTERM, sent by the command to itself at the moment it writes its output, in a process of its
# own (before, the default action ended it on the spot, the temporary file left beside the output).
STOPPED_WHILE_WRITING = """
import os, signal, sys
import polars as pl
from analysis.cli import main
from analysis.merge import output

def stop(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)

pl.DataFrame.write_parquet = stop
output.GzipStream.write = stop
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["analyze", "merge"])
def test_a_signal_while_writing_is_one_line_and_leaves_no_temporary_file(tmp_path, command):
    run = predictable_run(tmp_path / "run")
    analysis_of(run)
    before = {path.name for path in run.rglob("*")}
    result = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_WRITING, command, str(run)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (143, "error: interrupted by SIGTERM\n")
    assert {path.name for path in run.rglob("*")} == before
