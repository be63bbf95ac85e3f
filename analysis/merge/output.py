"""Where the merged trace may go, and its gzip stream.

The merge writes a new file or replaces one it wrote before, nothing else: each merged trace carries a
mark in its gzip header's comment field (RFC 1952 FCOMMENT, which gzip readers skip), so a file at
`--out` without it (someone's own file, a run's trace or run.json) is refused and left as it is; so is
anything but a regular file (a device such as /dev/full, a link, a directory: analysis.files) and a
path among a run's files, which the loader would read next time as one of the run's traces (a run's
own RUN/merged.json.gz aside, the name the loader skips: analysis.traces.run_files.RUN_FILES).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import BinaryIO

from analysis.files import OutputError, check_replaceable
from analysis.results import ANALYSIS_DIR
from analysis.traces.run_files import is_run_directory

MERGED_FILE = "merged.json.gz"  # the merge's output in a run directory
MARK = b"pipeline-bubbles: python -m analysis merge"
# gzip: magic, deflate, FCOMMENT flag, no mtime, no extra flags, unknown OS; then the comment, 0-ended.
HEADER = b"\x1f\x8b\x08\x10" + bytes(4) + b"\x00\xff" + MARK + b"\x00"


def written_by_merge(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(len(HEADER)) == HEADER
    except OSError:
        return False


def _run_directory_holding(path: Path) -> Path | None:
    """The run directory `path` would be one of the files of (directly in it, or in its analysis/)."""
    parent = path.parent
    for folder in (parent, parent.parent if parent.name == ANALYSIS_DIR else None):
        if folder is not None and is_run_directory(folder):
            return folder
    return None


def check_out(out: Path) -> None:
    """OutputError where writing the merged trace to `out` would destroy or add to what the merge did
    not write; checked before any trace is read."""
    check_replaceable(out)
    where = out.parent.resolve() / out.name  # through links to the folder; a link at `out` is refused above
    run = _run_directory_holding(where)
    if run is not None and where != run / MERGED_FILE:
        raise OutputError(
            out,
            f"is among the files of run directory {run}, which the analysis reads; write the merged trace "
            f"elsewhere, or as {run / MERGED_FILE}",
        )
    if run is None and out.exists() and not written_by_merge(out):
        raise OutputError(
            out, "exists and is no merged trace of this command's; left as it is (choose another --out)"
        )


class GzipStream:
    """The merged trace's gzip, its header marked (MARK), written to `file` piece by piece; `size`
    counts the bytes before compression (what a browser's limit applies to)."""

    def __init__(self, file: BinaryIO):
        self._file, self.size, self._crc = file, 0, 0
        self._deflate = zlib.compressobj(5, zlib.DEFLATED, -zlib.MAX_WBITS)
        file.write(HEADER)

    def write(self, data: bytes) -> None:
        self.size += len(data)
        self._crc = zlib.crc32(data, self._crc)
        self._file.write(self._deflate.compress(data))

    def finish(self) -> None:
        """The rest of the stream and gzip's trailer: CRC-32 and size modulo 2**32."""
        self._file.write(self._deflate.flush() + struct.pack("<II", self._crc, self.size & 0xFFFFFFFF))
