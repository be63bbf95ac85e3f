"""How big an input the analysis takes on: the one place that sets the limits, checked before the work
they bound, so a hostile or absurd input is refused in one line instead of exhausting the machine.

    file_mb       decompressed JSON per trace file (gzip is decompressed as a stream and stopped here;
                  a plain file's size is checked before it is read)
    run_mb        decompressed JSON of all the files of a run together
    events        events per trace file (counted while the file is decoded, piece by piece)
    run_events    events of all the files of a run together
    ranks         ranks of a run: trace files, `distributedInfo` rank and world_size, rank numbers in
                  file names, and a `merge --ranks` selection
    stages        pipeline stages: the stage numbers of `PP:` labels
    microbatches  microbatches: the microbatch numbers of `PP:` and `Forward i` / `Backward i` labels
    steps         profiler steps a `merge --steps` selection names

The defaults let every command finish within 4 GB of address space (`ulimit -v 4000000`) on any input
within them; a bigger machine raises them with the commands' flags (`--max-file-mb` ...), and going past
one is an InputError that names the limit and its flag. The commands set the limits for the duration of
a command (`applied`); the code that checks them reads `current()`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields

MB = 1_000_000
# run.json is a few kB of configuration; not a limit to raise, just the most it may be read as.
RUN_JSON_BYTES = 16 * MB


def _limit(default: int, flag: str, unit: str, help_text: str):
    return field(default=default, metadata={"flag": flag, "unit": unit, "help": help_text})


@dataclass(frozen=True)
class Limits:
    file_mb: int = _limit(512, "--max-file-mb", "MB", "decompressed MB of JSON per trace file")
    run_mb: int = _limit(512, "--max-run-mb", "MB", "decompressed MB of JSON of a run's files together")
    events: int = _limit(4_000_000, "--max-events", "events", "events per trace file")
    run_events: int = _limit(4_000_000, "--max-run-events", "events", "events of a run's files together")
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
        return self.run_mb * MB

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
        value = int(text)
    except ValueError:
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
            help=f"{f.metadata['help']} (default {f.default})",
        )


def from_arguments(args: argparse.Namespace) -> Limits:
    """The limits the command line asked for (the defaults where a command has no such flags)."""
    return Limits(**{f.name: getattr(args, f"limit_{f.name}", f.default) for f in fields(Limits)})
