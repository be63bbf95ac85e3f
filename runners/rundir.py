"""Run directories: traces/<run_id>/ with rank{r}.json.gz and run.json, and traces/latest.

A run is complete only when run.json says "complete": true; it is written last, atomically (temporary
file + os.replace), so readers see either no run.json or a whole one. In a run our launcher started,
rank 0 writes it with "complete": false and the launcher alone sets it true, once torchrun has ended
well and no stop signal came (runners.launch): a worker that outlives its launcher cannot complete
the run. A run that did not complete says why in run.json's "outcome"; while its launcher lives, the
launcher holds a lock on torchrun.log (which torchrun and its workers inherit), so a reader can tell a
run in progress from one whose launcher died without a word (`incomplete_reason`).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import secrets
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_JSON = "run.json"
RUNNER_LOG = "torchrun.log"  # the launcher writes it before any worker starts: a run of ours
LATEST = "latest"
# Temporary files are hidden and carry this mark (".rank0.123.tmp.json"), so a stopped run's can be
# told from anything else and removed (remove_temporaries).
TEMPORARY_MARK = ".tmp"


def run_id(schedule: str, p: int, m: int, v: int, dp: int = 1) -> str:
    """Sortable by time, readable, and unique even for two runs started in the same second."""
    chunks = f"-v{v}" if v > 1 else ""
    replicas = f"-dp{dp}" if dp > 1 else ""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{schedule}-p{p}{replicas}-m{m}{chunks}-{secrets.token_hex(3)}"


def create_run_dir(traces: Path, run: str) -> Path:
    path = traces / run
    path.mkdir(parents=True, exist_ok=False)
    return path


def temporary_beside(path: Path, suffix: str = "") -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{TEMPORARY_MARK}{suffix}")


def remove_temporaries(run_dir: Path) -> None:
    """The run's hidden temporary files, left by a process stopped while it wrote one."""
    for path in run_dir.glob(f".*{TEMPORARY_MARK}*"):
        path.unlink(missing_ok=True)


def write_json_atomically(path: Path, document: dict) -> None:
    """A temporary file beside `path`, renamed over it: readers see no file or a whole one; the
    temporary file is removed when it cannot be written (a full disk)."""
    temporary = temporary_beside(path)
    try:
        temporary.write_text(json.dumps(document, indent=2) + "\n")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_run_json(run_dir: Path, facts: dict, complete: bool = True) -> None:
    """run.json with "complete" as its last key (False: the launcher completes it, complete_run)."""
    facts = {key: value for key, value in facts.items() if key != "complete"}
    write_json_atomically(run_dir / RUN_JSON, {**facts, "complete": complete})


def _read_run_json(run_dir: Path) -> dict | None:
    try:
        found = json.loads((run_dir / RUN_JSON).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def is_complete(run_dir: Path) -> bool:
    return (_read_run_json(run_dir) or {}).get("complete") is True


def complete_run(run_dir: Path) -> bool:
    """Set the run.json rank 0 wrote to "complete": true; False where it wrote none."""
    facts = _read_run_json(run_dir)
    if facts is None:
        return False
    write_run_json(run_dir, facts)
    return True


def record_outcome(run_dir: Path, outcome: str) -> None:
    """Why the run did not complete, into run.json (rank 0's, or a new one): "complete" stays false. Best
    effort: where it cannot be written (a full disk) the run is incomplete all the same."""
    facts = _read_run_json(run_dir) or {}
    try:
        write_run_json(run_dir, facts | {"outcome": outcome}, complete=False)
    except OSError:
        pass


def hold_run(log: IO) -> None:
    """Mark the run as in progress for as long as `log` (its torchrun.log, open) or a process that
    inherits it lives."""
    fcntl.flock(log.fileno(), fcntl.LOCK_EX)


def incomplete_reason(run_dir: Path) -> str:
    """Why a run of ours has no complete run.json: its recorded outcome, in progress, or a launcher gone
    without a word (killed)."""
    outcome = (_read_run_json(run_dir) or {}).get("outcome")
    if isinstance(outcome, str):
        return f"{outcome} (see {RUNNER_LOG})"
    try:
        with (run_dir / RUNNER_LOG).open("rb") as log:
            fcntl.flock(log.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return f"in progress (its launcher is running; see {RUNNER_LOG})"
    except OSError:
        pass
    return f"its launcher ended before the run completed (killed?); see {RUNNER_LOG}"


def point_latest(run_dir: Path) -> Path | None:
    """Make <traces>/latest a relative symlink to run_dir, replacing any old link atomically; None where
    `latest` is no link (a directory copied with `cp -rL` or `scp -r`), which is left as it is."""
    latest = run_dir.parent / LATEST
    if latest.exists() and not latest.is_symlink():
        return None
    temporary = temporary_beside(latest)
    temporary.unlink(missing_ok=True)
    try:
        temporary.symlink_to(run_dir.name)
        os.replace(temporary, latest)
    finally:
        temporary.unlink(missing_ok=True)
    return latest


def git_revision(root: Path = REPO_ROOT) -> str | None:
    """HEAD's hash, with "-dirty" when tracked files differ from it; None outside a git checkout."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode:
            return None
        dirty = git("diff", "--quiet", "HEAD").returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def host_facts() -> dict:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
