"""Where the report's files go, and how they are written: atomically, and only when they change.

Writing only changed files keeps a rebuild idempotent down to the mtimes, so a browser tab or a
file watcher sees nothing happen when nothing changed.
"""

from __future__ import annotations

import re
from pathlib import Path

from analysis.files import write_atomically

RUNS_DIR = "runs"
ASSETS_DIR = "assets"


def write_atomic(path: Path, text: str) -> bool:
    """Write `text` to `path` through a temporary file and a rename; return False if it was already so."""
    data = text.encode("utf-8")
    if path.is_file() and path.read_bytes() == data:
        return False
    write_atomically(path, data)
    return True


def page_stem(run_id: str) -> str:
    """A file name for a run's page: run ids are directory names and may hold any character."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id).lstrip(".")
    return safe or "run"


def remove_stale_pages(runs_dir: Path, keep: set[str]) -> None:
    """Delete pages of runs that are gone, so the folder mirrors traces/ after every rebuild."""
    if not runs_dir.is_dir():
        return
    for path in runs_dir.iterdir():
        if path.is_file() and path.suffix in {".html", ".js"} and path.name not in keep:
            path.unlink()
