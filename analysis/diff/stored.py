"""A diff kept in the run directory of its B, where the report finds it: RUN/diffs/<A's run id>.json.

`python -m analysis diff A B` stores every diff it makes, and `python -m analysis report` stores one for
each sweep's neighbours; the report reads them (`read_diff`) and draws one page per pair, computing
nothing. A subfolder, not a file beside the traces: the loader reads a run's top-level JSON files as
possible rank traces (analysis.traces.run_files.trace_files).

RUN/diffs/<A>.json: {"format": 1, "a_run": A's run id, "b_run": B's run id, "a": DIR, "b": DIR,
"test": str, "notes": [str], "changes": [{"name", "rank", "stage", "unit", "a", "b", "low", "high",
"significant", "why", "expected"}, ...]}, the changes in diff.json's order (significant first, largest
first); `unit` is "ms", "fraction" or "bytes", so the values carry no unit in their keys (diff.json's
do). A run id is the name of the run's directory, as the report's index lists it.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from analysis.errors import InputError
from analysis.files import unwritable, write_atomically

DIFFS_DIR = "diffs"
STORED_FORMAT = 1  # bump with any change to the keys below: a diff of another format is made again


class StoredChange(msgspec.Struct, frozen=True):
    name: str
    rank: int | None
    stage: int | None
    unit: str
    a: float
    b: float
    low: float | None  # the interval of b - a; None where untested (`why`)
    high: float | None
    significant: bool
    why: str | None
    expected: float | None  # the change the formula or the model expects, where the configurations differ

    @property
    def delta(self) -> float:
        return self.b - self.a


class StoredDiff(msgspec.Struct):
    format: int
    a_run: str
    b_run: str
    a: str
    b: str
    test: str
    notes: list[str]
    changes: list[StoredChange]


def diff_path(b_dir: Path, a_run: str) -> Path:
    return Path(b_dir) / DIFFS_DIR / f"{a_run}.json"


def write_diff(b_dir: Path, stored: StoredDiff) -> Path:
    """RUN/diffs/<A>.json in B's run directory, written whole or not at all; OutputError where it cannot
    be (a read-only run directory)."""
    target = diff_path(b_dir, stored.a_run)
    try:
        target.parent.mkdir(exist_ok=True)
    except OSError as error:
        raise unwritable(target.parent, error) from None
    write_atomically(target, msgspec.json.format(msgspec.json.encode(stored)) + b"\n")
    return target


def stored_diffs(b_dir: Path) -> list[Path]:
    """The diffs stored in a run directory (the run as B), by A's run id."""
    folder = Path(b_dir) / DIFFS_DIR
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def read_diff(path: Path) -> StoredDiff:
    """One stored diff; InputError where it cannot be read or is of another format."""
    try:
        found = msgspec.json.decode(path.read_bytes(), type=StoredDiff)
    except (msgspec.DecodeError, msgspec.ValidationError, OSError) as error:
        raise InputError(path, f"not a stored diff ({str(error).splitlines()[0]})") from None
    if found.format != STORED_FORMAT:
        raise InputError(path, f"a stored diff of format {found.format}, not {STORED_FORMAT}")
    return found
