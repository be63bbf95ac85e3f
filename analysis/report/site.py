"""Where the report's files go, and how they are written: atomically, only when they change, and only
into a folder of the report's own.

Writing only changed files keeps a rebuild idempotent down to the mtimes, so a browser tab or a
file watcher sees nothing happen when nothing changed. The folder (`--out`) holds a list of every file
the report wrote there (MANIFEST), each name added before its file is written: the report writes into a
new or empty folder, or one holding only files on that list, and refuses any other (someone's own
pages, /dev/null) before writing anything; of what is there, it replaces or deletes only listed files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from analysis.files import TEMPORARY_SUFFIX, OutputError, write_atomically

RUNS_DIR = "runs"
ASSETS_DIR = "assets"
MANIFEST = ".report-files.json"  # the files this report wrote into its folder, relative to it


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


def _manifest_text(names: set[str]) -> str:
    return json.dumps(sorted(names), indent=0) + "\n"


class Site:
    """The report's folder `out`: its files written through `write` (or left as they are, `keep`);
    `finish` deletes the listed files this build did not write (pages of runs that are gone, an older
    bundle) and lists what it did."""

    def __init__(self, out: Path):
        self.out = out
        self._listed = self._claimed()
        self._kept: set[str] = set()

    def _name(self, path: Path) -> str:
        return path.relative_to(self.out).as_posix()

    def _claimed(self) -> set[str]:
        """The files a report listed here before; OutputError where `out` is no folder, or holds a file
        not on that list (a hidden temporary of ours, left by a killed report, aside)."""
        if not self.out.exists():
            return set()
        if not self.out.is_dir():
            raise OutputError(
                self.out, "is not a directory (the report writes a folder of pages); left as it is"
            )
        manifest = self.out / MANIFEST
        try:
            listed = set(json.loads(manifest.read_text())) if manifest.is_file() else set()
        except (OSError, ValueError, TypeError) as error:
            raise OutputError(
                manifest, f"not the list of files a report wrote ({error}); left as it is"
            ) from None
        for path in sorted(self.out.rglob("*")):
            name = self._name(path)
            ours = name in listed or name == MANIFEST or path.name.endswith(TEMPORARY_SUFFIX)
            if not ours and not (path.is_dir() and not path.is_symlink()):
                raise OutputError(
                    self.out,
                    f"holds {name}, which no report wrote; give --out a new or empty folder, or one a report "
                    f"wrote (its files are listed in {MANIFEST})",
                )
        return listed

    def _list(self, names: set[str]) -> None:
        write_atomic(self.out / MANIFEST, _manifest_text(names))
        self._listed = names

    def write(self, files: dict[Path, str]) -> set[str]:
        """Each path's text written (listed first); returns their names relative to the folder."""
        names = {self._name(path) for path in files}
        if not names <= self._listed:
            self._list(self._listed | names)
        for path, text in files.items():
            write_atomic(path, text)
        self._kept |= names
        return names

    def keep(self, path: Path) -> None:
        """A listed file left as it is (the vega bundle, written once per version)."""
        self._kept.add(self._name(path))

    def finish(self) -> None:
        for name in sorted(self._listed - self._kept):
            (self.out / name).unlink(missing_ok=True)
        self._list(self._kept)
