"""Places a command cannot write, made real for the fault tests: a full file system and a read-only one.

Both are a small tmpfs where this process may mount one (root: the tests say so). Where it may not, a
full disk is the kernel's file-size limit (RLIMIT_FSIZE of 0 bytes: every write into a regular file
fails, EFBIG instead of ENOSPC) for the command's duration, and a read-only place is a folder without
write permission, which binds a process that is not root; as root without mount there is no read-only
place to be had, and the test says so when it skips.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FULL_CAUSES = ("No space left on device", "File too large")  # tmpfs filled; RLIMIT_FSIZE
READ_ONLY_CAUSES = ("Read-only file system", "Permission denied")  # remounted ro; no write permission
TMPFS_SIZE = "8m"
FILLER = ".filler"


def mount_tmpfs(folder: Path, options: str) -> bool:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


class Place:
    """A folder for a run and its outputs; `full()` and `read_only()` make it so for a block."""

    def __init__(self, folder: Path):
        folder.mkdir()
        self.folder = folder
        self.tmpfs = mount_tmpfs(folder, f"size={TMPFS_SIZE}")

    def close(self) -> None:
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.folder)], check=True)

    def files(self) -> dict[str, bytes]:
        """Every file under the place, hidden ones too (the filler aside), with its bytes."""
        return {
            str(path.relative_to(self.folder)): path.read_bytes()
            for path in sorted(self.folder.rglob("*"))
            if path.is_file() and path.name != FILLER
        }

    @contextmanager
    def full(self) -> Iterator[None]:
        if not self.tmpfs:
            with _file_size_limit():
                yield
            return
        filler = self.folder / FILLER
        with filler.open("wb") as file:
            try:
                while True:
                    file.write(bytes(1 << 16))
                    file.flush()
            except OSError as error:
                assert error.errno == errno.ENOSPC
        try:
            yield
        finally:
            filler.unlink()

    @contextmanager
    def read_only(self) -> Iterator[None]:
        if self.tmpfs:
            subprocess.run(["mount", "-o", "remount,ro", str(self.folder)], check=True)
            try:
                yield
            finally:
                subprocess.run(["mount", "-o", "remount,rw", str(self.folder)], check=True)
            return
        if os.geteuid() == 0:
            pytest.skip("root ignores write permission and this machine refuses to mount a tmpfs")
        folders = [self.folder, *(path for path in self.folder.rglob("*") if path.is_dir())]
        for path in folders:
            path.chmod(0o555)
        try:
            yield
        finally:
            for path in folders:
                path.chmod(0o755)


@contextmanager
def _file_size_limit() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
