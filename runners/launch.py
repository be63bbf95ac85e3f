"""Start one run: a fresh run directory, the workers under the real torchrun, then traces/latest.

torchrun's --standalone rendezvous binds port 0, so the OS picks a free port and two runs at once do
not clash; a single_gpu run is one worker holding all P ranks as streams (--virtual-ranks P). Worker
output goes to <run>/torchrun.log. The run is complete only when the launcher says so (runners.rundir):
after torchrun ended well and before any stop signal. A signal ends the whole run (runners.stop); a
run that failed or was stopped stays incomplete, says why in run.json's "outcome", keeps no temporary
file, and the caller gets one line and the exit code: 1 for a failure, 128 + N for signal N (to the
launcher, or to torchrun).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

from runners.inject import as_text
from runners.request import RequestError, Resolved
from runners.rundir import (
    RUNNER_LOG,
    complete_run,
    create_run_dir,
    hold_run,
    point_latest,
    record_outcome,
    remove_temporaries,
    run_id,
)
from runners.schedules.single_gpu import SINGLE_GPU
from runners.stop import Stopped, adopting_orphans, die_with_parent, signals_held, stopping

SHUTDOWN_S = 30  # how long torchrun gets to stop its workers after SIGTERM
FAILED = 1  # the launcher's exit code for a run that failed; a stopped run's is the signal's (Stopped)


class LaunchError(RuntimeError):
    """The workers did not produce a complete run: `outcome` (run.json's), then where to look; one line,
    exit_code the launcher's."""

    def __init__(self, outcome: str, where: str, exit_code: int = FAILED):
        super().__init__(f"{outcome}; {where}")
        self.outcome, self.exit_code = outcome, exit_code


def torchrun_command(resolved: Resolved, run_dir: Path) -> list[str]:
    request = resolved.request
    one_process = resolved.mode == SINGLE_GPU
    return [
        sys.executable,
        "-m",
        "runners.torchrun",
        "--standalone",
        f"--nproc_per_node={1 if one_process else request.p * request.dp}",
        "-m",
        "runners.worker",
        "--run-dir",
        str(run_dir),
        "--completed-by-launcher",
        *(["--virtual-ranks", str(request.p)] if one_process else []),
        "--sched",
        request.schedule,
        "--microbatches",
        str(request.m),
        "--chunks",
        str(request.v),
        "--engine",
        request.engine,
        "--preset",
        resolved.preset.name,
        "--steps",
        str(request.steps),
        "--device",
        resolved.device,
        "--timed-steps",
        str(request.timed_steps),
        *(["--rows-per-mb", str(request.rows_per_microbatch)] if request.rows_per_microbatch else []),
        *([] if request.profile_memory else ["--no-profile-memory"]),
        *(["--inject", as_text(request.injections)] if request.injections else []),
        *(["--model", request.model] if request.model else []),
        *(["--dp", str(request.dp)] if request.dp > 1 else []),
        *(["--dp-overlap"] if request.dp_overlap else []),
        *(["--calibrate-advice"] if request.calibrate_advice else []),
    ]


def _start(command: list[str], log: IO) -> subprocess.Popen:
    """torchrun, SIGTERMed should the launcher die (SIGKILL) before it."""
    launcher = os.getpid()
    return subprocess.Popen(command, stdout=log, stderr=log, preexec_fn=lambda: die_with_parent(launcher))


def _end(process: subprocess.Popen, stop_adopted: Callable[[], None]) -> None:
    """Nothing of the run left: torchrun, if it still runs, gets SIGTERM, which it passes on to its
    workers, and SIGKILL after SHUTDOWN_S; workers it left behind (it died first) are stopped too."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    stop_adopted()


def _failure(code: int, run_dir: Path) -> LaunchError:
    log = run_dir / RUNNER_LOG
    if code < 0:  # torchrun ended by a signal: SIGKILL, or one it passed on to its workers
        name = signal.Signals(-code).name
        return LaunchError(f"torchrun was stopped by {name}", f"see {log}", 128 - code)
    return LaunchError(f"a worker failed (torchrun exit {code})", f"see {log}")


def _new_run_dir(resolved: Resolved, traces: Path) -> Path:
    request = resolved.request
    run = run_id(request.schedule, request.p, request.m, request.v, request.dp)
    try:
        return create_run_dir(traces.resolve(), run)
    except OSError as error:
        raise RequestError(f"{traces}: cannot make a run directory here ({error.strerror})") from None


def _run(resolved: Resolved, run_dir: Path) -> None:
    """torchrun to its end, the run completed where it ended well; LaunchError or Stopped otherwise."""
    try:
        log = (run_dir / RUNNER_LOG).open("w")
    except OSError as error:
        raise RequestError(f"{run_dir}: cannot write {RUNNER_LOG} ({error.strerror})") from None
    with log, stopping() as whole, adopting_orphans() as stop_adopted:
        hold_run(log)
        process = _start(torchrun_command(resolved, run_dir), log)
        try:
            code = process.wait()
        finally:
            with signals_held():
                _end(process, stop_adopted)
        if code != 0:
            raise _failure(code, run_dir)
        with signals_held():
            try:
                completed = complete_run(run_dir)
            except OSError as error:
                raise LaunchError(f"cannot complete run.json ({error.strerror})", str(run_dir)) from None
            if not completed:
                raise LaunchError("the workers exited but wrote no run.json", f"see {log.name}")
            whole()


def launch(resolved: Resolved, traces: Path) -> Path:
    """Run the request; return the complete run directory, which traces/latest then points at where it
    is a link it can write (a directory there, a copy, is left as it is)."""
    run_dir = _new_run_dir(resolved, traces)
    try:
        _run(resolved, run_dir)
    except Stopped as stop:
        error = LaunchError(f"interrupted by {stop.name}", f"{run_dir} is left incomplete", stop.exit_code)
        record_outcome(run_dir, error.outcome)
        raise error from None
    except LaunchError as error:
        record_outcome(run_dir, error.outcome)
        raise
    finally:
        remove_temporaries(run_dir)
    try:
        point_latest(run_dir)
    except OSError:
        pass  # the caller says where latest points; the run is complete all the same
    return run_dir
