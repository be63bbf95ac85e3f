"""How big an input the analysis takes on: the one place that sets the limits, checked before the work
they bound, so a hostile or absurd input is refused in one line instead of exhausting the machine.

    file_mb       decompressed JSON per trace file (gzip is decompressed as a stream and stopped here;
                  a plain file's size is checked before it is read)
    run_mb        decompressed JSON of all the files of a run together (none by default)
    events        events per trace file (counted while the file is decoded, piece by piece)
    run_events    events of all the files of a run together (none by default)
    ranks         ranks of a run: trace files, `distributedInfo` rank and world_size, rank numbers in
                  file names, and a `merge --ranks` selection
    stages        pipeline stages: the stage numbers of `PP:` labels
    microbatches  microbatches: the microbatch numbers of `PP:` and `Forward i` / `Backward i` labels
    steps         profiler steps a `merge --steps` selection names

A process holds one trace at a time (analysis.ranks.pool), so what bounds its memory is the largest
file, not the run: the per-file defaults are what the memory available to this process holds of one
trace's footprint (`memory_defaults`), and the run-wide limits are off unless a flag sets them. Going
past a limit is an InputError that names it and its flag (`--max-file-mb` ...). The commands set the
limits for the duration of a command (`applied`); the code that checks them reads `current()`.
"""

from __future__ import annotations

import argparse
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from pathlib import Path

from runners.arguments import whole_number

MB = 1_000_000
# run.json is a few kB of configuration; not a limit to raise, just the most it may be read as.
RUN_JSON_BYTES = 16 * MB


# One trace's peak memory while it is read and reduced to its tables, per byte of its JSON (the text
# in pieces, its event frame and the tables made from it: about 2.5 measured on the bench's trace sets)
# and per event (a frame row and its share of the tables: 3.9 million tiny events peaked at 1.13 GB).
# A file within both fits in the memory available; analysis.ranks.workers sizes its pool by the first.
FOOTPRINT_PER_BYTE = 3
FOOTPRINT_PER_EVENT = 300
# What a machine that says nothing of its memory (no /proc/meminfo) is taken to have.
ASSUMED_AVAILABLE = 4_000_000_000
# A budget no run reaches: what a run-wide limit that is off leaves.
UNBOUNDED = 1 << 62


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo, or less where an address-space limit (`ulimit -v`) says so;
    None where neither says anything (not Linux, no limit)."""
    known = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                known.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    space = resource.getrlimit(resource.RLIMIT_AS)[0]
    if space != resource.RLIM_INFINITY:
        known.append(space)
    return min(known, default=None)


def memory_defaults(available: int | None) -> tuple[int, int]:
    """(file_mb, events): the largest trace whose footprint fits in `available` bytes."""
    available = ASSUMED_AVAILABLE if available is None else available
    return max(1, available // FOOTPRINT_PER_BYTE // MB), max(1, available // FOOTPRINT_PER_EVENT)


_FILE_MB, _EVENTS = memory_defaults(available_bytes())


def _limit(default: int | None, flag: str, unit: str, help_text: str):
    return field(default=default, metadata={"flag": flag, "unit": unit, "help": help_text})


@dataclass(frozen=True)
class Limits:
    file_mb: int = _limit(_FILE_MB, "--max-file-mb", "MB", "decompressed MB of JSON per trace file")
    run_mb: int | None = _limit(
        None, "--max-run-mb", "MB", "decompressed MB of JSON of a run's files together"
    )
    events: int = _limit(_EVENTS, "--max-events", "events", "events per trace file")
    run_events: int | None = _limit(None, "--max-run-events", "events", "events of a run's files together")
    ranks: int = _limit(1024, "--max-ranks", "ranks", "ranks per run (files, world_size, rank numbers)")
    stages: int = _limit(256, "--max-stages", "stages", "pipeline stages (stage numbers in PP: labels)")
    microbatches: int = _limit(
        10_000, "--max-microbatches", "microbatches", "microbatches per step (in labels)"
    )
    steps: int = _limit(100_000, "--max-steps", "steps", "profiler steps a merge --steps selection names")

    @property
    def file_bytes(self) -> int:
        return self.file_mb * MB

    @property
    def run_bytes(self) -> int:
        return UNBOUNDED if self.run_mb is None else self.run_mb * MB

    @property
    def run_event_count(self) -> int:
        return UNBOUNDED if self.run_events is None else self.run_events

    def describe(self, name: str) -> str:
        """ "the limit of 1,024 MB (raise it with --max-file-mb)" for the field `name`."""
        meta = _FIELDS[name].metadata
        return f"the limit of {getattr(self, name):,} {meta['unit']} (raise it with {meta['flag']})"

    def exceeded(self, name: str, what: str) -> str:
        """ "`what`, more than the limit of ... (raise it with ...)": a problem past the field `name`."""
        return f"{what}, more than {self.describe(name)}"


_FIELDS = {f.name: f for f in fields(Limits)}
_DEFAULTS = Limits()
_CURRENT: ContextVar[Limits | None] = ContextVar("limits", default=None)


def current() -> Limits:
    """The limits in force (the defaults unless a command applied others)."""
    return _CURRENT.get() or _DEFAULTS


@contextmanager
def applied(limits: Limits) -> Iterator[Limits]:
    token = _CURRENT.set(limits)
    try:
        yield limits
    finally:
        _CURRENT.reset(token)


def positive(text: str) -> int:
    try:
        value = whole_number(text)
    except argparse.ArgumentTypeError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a whole number >= 1: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One `--max-...` flag per limit, defaulting to the dataclass's value."""
    group = parser.add_argument_group("limits (bigger inputs are refused in one line; raise with care)")
    for f in fields(Limits):
        group.add_argument(
            f.metadata["flag"],
            dest=f"limit_{f.name}",
            type=positive,
            default=f.default,
            metavar="N",
            help=f"{f.metadata['help']} (default {'none' if f.default is None else f.default})",
        )


def from_arguments(args: argparse.Namespace) -> Limits:
    """The limits the command line asked for (the defaults where a command has no such flags)."""
    return Limits(**{f.name: getattr(args, f"limit_{f.name}", f.default) for f in fields(Limits)})
