"""Run directories: traces/<run_id>/ with rank{r}.json.gz and run.json, and traces/latest.

A run is complete only when run.json says "complete": true; it is written last, atomically (temporary
file + os.replace), so readers see either no run.json or a whole one.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import socket
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_id(schedule: str, p: int, m: int, v: int, dp: int = 1) -> str:
    """Sortable by time, readable, and unique even for two runs started in the same second."""
    chunks = f"-v{v}" if v > 1 else ""
    replicas = f"-dp{dp}" if dp > 1 else ""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{schedule}-p{p}{replicas}-m{m}{chunks}-{secrets.token_hex(3)}"


def create_run_dir(traces: Path, run: str) -> Path:
    path = traces / run
    path.mkdir(parents=True, exist_ok=False)
    return path


def write_json_atomically(path: Path, document: dict) -> None:
    """A temporary file beside `path`, renamed over it: readers see no file or a whole one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(temporary, path)


def write_run_json(run_dir: Path, facts: dict) -> None:
    """run.json with "complete": true as its last key."""
    facts = {key: value for key, value in facts.items() if key != "complete"}
    write_json_atomically(run_dir / "run.json", {**facts, "complete": True})


def is_complete(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "run.json").read_text()).get("complete") is True
    except (OSError, ValueError):
        return False


def point_latest(run_dir: Path) -> Path:
    """Make <traces>/latest a relative symlink to run_dir, replacing any old one atomically."""
    latest = run_dir.parent / "latest"
    temporary = run_dir.parent / f".latest.{os.getpid()}.tmp"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(run_dir.name)
    os.replace(temporary, latest)
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
