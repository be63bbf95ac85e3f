"""Atomic file writes for every output of the analysis (analysis/, the merged trace, the report):
readers see the old file or the whole new one, never a half-written one. A place that cannot be
written (a full disk, a read-only file system, a missing permission) is one OutputError line naming it
and the cause, with no temporary file left and the previous file as it was; a path that holds anything
but a regular file (a link, a directory, a device such as /dev/null) is left as it is and refused."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from analysis.errors import InputError

SHARED = 0o644  # outputs are for sharing; mkstemp and mkdtemp make them private
SHARED_DIRECTORY = 0o755
TEMPORARY_SUFFIX = ".tmp"  # hidden temporaries are named .<name>.<random>.tmp


class OutputError(InputError):
    """A place a command cannot write its output; the CLI's one line and exit 2, as for bad input."""


def cause(error: BaseException) -> str:
    """What an OSError (or a library's error around one) says, without its path: `No space left on device`."""
    return getattr(error, "strerror", None) or str(error).splitlines()[0]


def unwritable(path: Path, error: BaseException) -> OutputError:
    return OutputError(path, f"cannot write here ({cause(error)}); the previous output, if any, is as it was")


def check_replaceable(path: Path) -> None:
    """OutputError where `path` holds something other than a regular file (a symbolic link, a directory,
    a device): replacing it would destroy what the command did not write."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise unwritable(path, error) from None
    if not stat.S_ISREG(mode):
        raise OutputError(path, "is not a regular file (a link, a directory or a device); left as it is")


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A temporary file beside `path` to write, renamed over `path` when the block ends without an
    exception; removed whatever else happens. OSError inside is an OutputError naming `path`."""
    check_replaceable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX
        )
    except OSError as error:
        raise unwritable(path, error) from None
    try:
        with os.fdopen(handle, "wb") as file:
            yield file
        os.chmod(temporary, SHARED)
        os.replace(temporary, path)
    except OSError as error:
        raise unwritable(path, error) from None
    finally:
        Path(temporary).unlink(missing_ok=True)


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename (atomic_file)."""
    with atomic_file(path) as file:
        file.write(data)
