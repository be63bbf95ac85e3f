"""Runner faults with real processes: a rank killed mid-run, signals to each process of a run (make,
the launcher, torchrun), two runs at once.

Each run is the tiny preset on 2 gloo ranks. The killed and interrupted runs are given far more timed
steps than they will live to run, so the fault always lands while the workers are at work. torchrun
starts each worker in a session of its own: no signal to the launcher's process group reaches them,
and one whose torchrun died keeps running unless something stops it (runners.stop).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, trace_command

from analysis.cli import main as analysis_main
from analysis.report import build_report
from runners.bounds import STEPS_MAX
from runners.rundir import is_complete

pytestmark = pytest.mark.slow


def _hang_up_default() -> None:
    """In the launcher before it starts: SIGHUP as a terminal's process has it (under nohup, a CI
    script's, it is ignored, and the launcher rightly leaves an ignored signal ignored)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start(traces: Path, timed_steps: int = 1, **popen) -> subprocess.Popen:
    """The tiny gpipe run started in the background, its output piped; `popen`: Popen's further options."""
    options = f"--sched gpipe --p 2 --m 2 --preset tiny --device cpu --steps 1 --timed-steps {timed_steps}"
    return subprocess.Popen(
        trace_command(traces, *options.split()),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_hang_up_default,
        **popen,
    )


def workers(traces: Path) -> dict[int, int]:
    """RANK -> pid of the workers whose command line names `traces` (so only this test's processes)."""
    found = {}
    for process in Path("/proc").iterdir():
        try:
            argv = (process / "cmdline").read_bytes().split(b"\0")
            if b"runners.worker" not in argv or not any(str(traces).encode() in arg for arg in argv):
                continue
            environ = (process / "environ").read_bytes().split(b"\0")
            rank = next(int(item[5:]) for item in environ if item.startswith(b"RANK="))
        except (OSError, ValueError, StopIteration):
            continue  # not ours, or gone already
        found[rank] = int(process.name)
    return found


def run_processes(traces: Path) -> list[int]:
    """Every process whose command line names `traces`: the launcher, torchrun and the workers."""
    found = []
    for process in Path("/proc").iterdir():
        try:
            if str(traces).encode() in (process / "cmdline").read_bytes():
                found.append(int(process.name))
        except (OSError, ValueError):
            continue
    return found


def torchrun_of(traces: Path) -> int:
    (pid,) = [
        pid
        for pid in run_processes(traces)
        if b"runners.torchrun" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    return pid


def wait_for_workers(traces: Path, launcher: subprocess.Popen) -> dict[int, int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and launcher.poll() is None:
        found = workers(traces)
        if len(found) == 2:
            time.sleep(2)  # let them get into the run (process group, calibration, steps)
            return found
        time.sleep(0.2)
    raise AssertionError(f"the workers never started: {launcher.communicate(timeout=30)}")


def only_run(traces: Path) -> Path:
    (run,) = [path for path in traces.iterdir() if not path.name.startswith(".")]
    return run


def assert_refused_as_incomplete(run: Path, capsys) -> None:
    """No run.json, no traces/latest, and the analysis says the run is incomplete (exit 2, one line)."""
    assert not is_complete(run) and not (run.parent / "latest").exists()
    assert analysis_main(["analyze", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "incomplete run" in err, err
    assert not (run / "analysis").exists()
    assert not list(run.glob(".*"))  # no temporary file left


def test_a_rank_killed_mid_run_leaves_an_incomplete_run_the_analysis_refuses(tmp_path, capsys):
    traces = tmp_path / "traces"
    launcher = start(traces, timed_steps=STEPS_MAX)
    os.kill(wait_for_workers(traces, launcher)[1], signal.SIGKILL)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 1 and err.count("\n") == 1 and "a worker failed" in err, err
    assert workers(traces) == {}  # torchrun stopped the surviving rank
    assert_refused_as_incomplete(only_run(traces), capsys)


def test_ctrl_c_stops_every_process_and_leaves_nothing_looking_complete(tmp_path, capsys):
    traces = tmp_path / "traces"
    # A terminal's Ctrl-C reaches the whole foreground process group: launcher, torchrun and workers.
    launcher = start(traces, timed_steps=STEPS_MAX, start_new_session=True)
    wait_for_workers(traces, launcher)
    os.killpg(launcher.pid, signal.SIGINT)
    _, err = launcher.communicate(timeout=120)
    run = only_run(traces)
    assert launcher.returncode == 130, err
    assert err == f"error: interrupted by SIGINT; {run} is left incomplete\n"
    assert workers(traces) == {}
    assert not list(run.glob("rank*.json.gz"))  # profiled traces are renamed into place only when whole
    assert_refused_as_incomplete(run, capsys)


def test_two_runs_started_at_once_both_complete_in_their_own_directories(tmp_path):
    traces = tmp_path / "traces"
    launchers = [start(traces) for _ in range(2)]
    for launcher in launchers:
        _, err = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, err
    runs = sorted(path for path in traces.iterdir() if path.name != "latest")
    assert len(runs) == 2
    for run in runs:
        config = json.loads((run / "run.json").read_text())
        assert config["complete"] is True and config["p"] == 2
        assert sorted(path.name for path in run.glob("rank*")) == ["rank0.json.gz", "rank1.json.gz"]
    assert (traces / "latest").resolve() in runs


def assert_stopped(traces: Path, capsys, outcome: str) -> None:
    """Nothing of the run is left running, its run.json says `outcome` and not complete, the analysis
    refuses it naming that, and the report lists it so."""
    assert run_processes(traces) == []
    run = only_run(traces)
    assert_refused_as_incomplete(run, capsys)
    assert json.loads((run / "run.json").read_text()) == {"outcome": outcome, "complete": False}
    index = build_report(traces, traces.parent / "reports").read_text()
    assert f"incomplete run: {outcome} (see torchrun.log)" in index


@pytest.mark.parametrize(
    "process, signum, outcome",
    [
        ("launcher", signal.SIGHUP, "interrupted by SIGHUP"),
        ("torchrun", signal.SIGTERM, "torchrun was stopped by SIGTERM"),
        ("torchrun", signal.SIGKILL, "torchrun was stopped by SIGKILL"),
    ],
)
def test_a_signal_to_the_launcher_or_torchrun_stops_every_worker_and_the_run_stays_incomplete(
    tmp_path, capsys, process, signum, outcome
):
    """The launcher's exit code is the shell's for the signal (128 + N), whoever got it; before, SIGHUP
    ended the launcher alone, and after a SIGKILL to torchrun the workers finished a complete run.
    (SIGTERM to the launcher: test_sigterm_to_make_ends_the_whole_run, where it comes from make.)"""
    traces = tmp_path / "traces"
    launcher = start(traces, timed_steps=STEPS_MAX)
    wait_for_workers(traces, launcher)
    os.kill(launcher.pid if process == "launcher" else torchrun_of(traces), signum)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + signum and err.count("\n") == 1, err
    assert err.startswith(f"error: {outcome}; "), err
    assert_stopped(traces, capsys, outcome)


def wait_until_gone(traces: Path) -> None:
    """Until no process of the run is left (they stop on their own: nobody waits for them here)."""
    deadline = time.monotonic() + 60
    while run_processes(traces) and time.monotonic() < deadline:
        time.sleep(0.2)


def test_a_launcher_killed_outright_leaves_no_worker_and_no_complete_run(tmp_path, capsys):
    """SIGKILL cannot be handled: torchrun is told by the kernel that its parent died and stops its
    workers; had any lived on, the run could not be complete, since only the launcher completes it."""
    traces = tmp_path / "traces"
    launcher = start(traces, timed_steps=STEPS_MAX)
    wait_for_workers(traces, launcher)
    launcher.kill()
    launcher.wait()
    wait_until_gone(traces)
    assert run_processes(traces) == []
    run = only_run(traces)
    assert_refused_as_incomplete(run, capsys)
    index = build_report(traces, tmp_path / "reports").read_text()
    assert "its launcher ended before the run completed (killed?)" in index


def test_sigterm_to_make_ends_the_whole_run(tmp_path, capsys):
    """make passes SIGTERM to its recipe's shell only, which dies without passing it on: the launcher
    learns of it from its parent's death. Before, make said `Terminated` and the workers went on to
    write a complete run."""
    for name in (".venv", "pyproject.toml"):
        (tmp_path / name).symlink_to(REPO / name)
    traces = tmp_path / "traces"
    variables = ["SCHED=gpipe", "P=2", "M=2", "PRESET=tiny", "DEVICE=cpu", f"STEPS={STEPS_MAX}"]
    make = subprocess.Popen(
        ["make", "-f", str(REPO / "Makefile"), "trace", *variables],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_workers(traces, make)
    make.send_signal(signal.SIGTERM)
    _, err = make.communicate(timeout=120)
    assert make.returncode != 0, err
    wait_until_gone(traces)
    assert_stopped(traces, capsys, "interrupted by SIGTERM")
