"""How many processes read a run's ranks at once (analysis.ranks.pool): `--jobs N` at most, else one per
core this process may run on; fewer where the machine's available memory would not hold that many
copies of the largest trace's footprint, never more than the run has files, and at least one. A run
of less than POOL_MIN_BYTES of JSON is read in this process unless `--jobs` asks for more: starting a
pool (its server imports the analysis once, about half a second of a core) would cost more than the
pool saves.

A command sets the number for its duration (`applied`), as it does the input limits
(analysis.traces.limits); this module reads only /proc and the file sizes, so the CLI imports it cheaply.
Workers, pooled or a local cluster's, start without the caller's script (`main_not_rerun`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from analysis.traces import limits
from analysis.traces.limits import FOOTPRINT_PER_BYTE, available_bytes
from analysis.traces.source import GZIP_MAGIC

POOL_MIN_BYTES = 32_000_000
_REQUESTED: ContextVar[int | None] = ContextVar("jobs", default=None)


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs",
        type=limits.positive,
        default=None,
        metavar="N",
        help="processes reading the ranks at once, at most (default: one per core, as memory allows)",
    )


@contextmanager
def applied(jobs: int | None) -> Iterator[None]:
    token = _REQUESTED.set(jobs)
    try:
        yield
    finally:
        _REQUESTED.reset(token)


def pool_size(files: list[Path]) -> int:
    """Processes for reading `files` (see the module's docstring)."""
    sizes = [json_bytes(path) for path in files]
    requested = _REQUESTED.get()
    if requested is None and sum(sizes) < POOL_MIN_BYTES:
        return 1
    wanted = requested or len(os.sched_getaffinity(0))
    available = available_bytes()
    footprint = FOOTPRINT_PER_BYTE * max(sizes)
    if available is not None:
        wanted = min(wanted, available // footprint)
    return max(1, min(wanted, len(files)))


def json_bytes(path: Path) -> int:
    """The JSON size a trace file will be read as, at most the per-file limit: a plain file's size, a
    gzip file's from its trailer (the last member's size modulo 4 GiB: an estimate)."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if file.read(2) == GZIP_MAGIC and size >= 6:
                file.seek(-4, os.SEEK_END)
                size = max(size, int.from_bytes(file.read(4), "little"))
    except OSError:
        return 0  # the loader says what is wrong with it
    return min(size, limits.current().file_bytes)


@contextmanager
def main_not_rerun() -> Iterator[None]:
    """Workers started without the caller's script: multiprocessing runs a `__main__` given by its path
    again in each worker (a script calling the analysis at its top level would run in every worker);
    they need only this module, preloaded."""
    main = sys.modules["__main__"]
    path = main.__dict__.pop("__file__", None) if getattr(main.__spec__, "name", None) is None else None
    try:
        yield
    finally:
        if path is not None:
            main.__file__ = path
