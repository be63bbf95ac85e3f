"""Start one run: a fresh run directory, the workers under the real torchrun, then traces/latest.

torchrun's --standalone rendezvous binds port 0, so the OS picks a free port and two runs at once do
not clash; a single_gpu run is one worker holding all P ranks as streams (--virtual-ranks P). Worker
output goes to <run>/torchrun.log; on failure the directory stays without "complete": true and the
caller gets one line pointing at the log.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from runners.inject import as_text
from runners.request import Resolved
from runners.rundir import create_run_dir, is_complete, point_latest, run_id
from runners.schedules.single_gpu import SINGLE_GPU

SHUTDOWN_S = 30  # how long torchrun gets to stop its workers after Ctrl-C


class LaunchError(RuntimeError):
    """The workers did not produce a complete run; the message is one line."""


def torchrun_command(resolved: Resolved, run_dir: Path) -> list[str]:
    request = resolved.request
    one_process = resolved.mode == SINGLE_GPU
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={1 if one_process else request.p * request.dp}",
        "-m",
        "runners.worker",
        "--run-dir",
        str(run_dir),
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


def _wait(process: subprocess.Popen) -> int:
    """Wait for torchrun; on Ctrl-C let it stop its workers (SIGTERM, then kill) and re-raise."""
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            process.kill()
        raise


def launch(resolved: Resolved, traces: Path) -> Path:
    """Run the request; return the complete run directory, now also traces/latest."""
    request = resolved.request
    run_dir = create_run_dir(
        traces.resolve(), run_id(request.schedule, request.p, request.m, request.v, request.dp)
    )
    log = run_dir / "torchrun.log"
    with log.open("w") as output:
        process = subprocess.Popen(torchrun_command(resolved, run_dir), stdout=output, stderr=output)
        code = _wait(process)
    if code != 0:
        raise LaunchError(f"a worker failed (torchrun exit {code}); see {log}")
    if not is_complete(run_dir):
        raise LaunchError(f"the workers exited but {run_dir / 'run.json'} is not complete; see {log}")
    point_latest(run_dir)
    return run_dir
