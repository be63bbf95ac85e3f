"""A run's ranks read into their small tables (analysis.ranks.tables), each in a process of a pool.

`read_ranks` runs analysis.traces.run.load_run, which reads the files one by one in order and checks
they form one run, with a reader that takes each file's result from a pool instead: every worker
reads one trace within the per-file limits, reduces it to its tables with `rank_input` and drops its
frame, so a process holds one trace at a time and only the tables cross processes. The pool has
analysis.ranks.workers.pool_size processes (one: no pool, the same work in this process, still one trace at a
time); this process reads the largest files while the pool starts (analysis.ranks.handout).

What the user sees is what one process reading the files in order gives:
- the run's limits (run_mb, run_events) are charged in file order as each result is taken; a file
  whose bytes or events pass what is left, or that failed to load while less than a file's limits was
  left, is read again here with the run's budget, which raises the error a serial read raises;
- errors come back as the same InputError (one line), load errors before any rank's analysis error;
- a worker's warnings are recorded there and warned here, once each, in file order.
The progress of a long run is one line on stderr (analysis.ranks.progress).

Fanned out further: `rank_work` is a pure function of (file, limits, run.json), and its result pickles,
so with `--cluster` (analysis.ranks.cluster) Dask maps it over the files in place of the pool and the
reader takes the results in file order just the same, the files on storage every worker can read.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import warnings
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from analysis.cells.virtual_ranks import virtual_ranks
from analysis.errors import InputError
from analysis.ranks import cluster, workers
from analysis.ranks.handout import Handout
from analysis.ranks.progress import Progress
from analysis.ranks.tables import RankInput, one_pipeline, rank_input, without_events
from analysis.traces import limits
from analysis.traces.load import Budget, RawTrace, read_trace, with_rank
from analysis.traces.run import RunTraces, load_run, one_trace_run
from analysis.traces.run_config import read_run_config
from analysis.traces.run_files import trace_files

_UNBOUNDED = limits.UNBOUNDED  # a worker's budget: the per-file limits bound it, the run's are charged here
# rank_work sets process-wide state (the recursion limit, the warnings filters): one file at a time per
# process, whatever threads a cluster's worker runs.
_ONE_AT_A_TIME = threading.Lock()
Warned = tuple[str, type[Warning]]


@dataclass
class RankWork:
    """One file's result: its trace as load_run checks it (no frame), or the error reading it; what
    it used of the run's budget; its ranks' tables, or the error making them; the warnings of each."""

    path: Path
    trace: RawTrace | None = None
    load_error: InputError | None = None
    load_warnings: list[Warned] = field(default_factory=list)
    used: Budget = field(default_factory=lambda: Budget(0, 0))
    ranks: list[RankInput] = field(default_factory=list)
    error: InputError | None = None
    warnings: list[Warned] = field(default_factory=list)


def rank_work(
    path: Path, in_force: limits.Limits, alone: bool, config: dict | None, headroom: int | None = None
) -> RankWork:
    """Read one trace file and reduce it to its ranks' tables (one process's trace of P ranks, when it
    is the run's only file, is P ranks: analysis.cells.virtual_ranks). `headroom`: the frames left
    before the recursion limit where the run is read, so JSON nested past it is refused here alike."""
    work = RankWork(path)
    with (
        _recursion_headroom(headroom),
        limits.applied(in_force),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        budget = Budget(_UNBOUNDED, _UNBOUNDED)
        try:
            trace = read_trace(path, budget, keep_text=False, comms=not one_pipeline(config, alone))
        except InputError as error:
            work.load_error = error
            return work
        finally:
            work.load_warnings = _warned(caught)
        work.used = Budget(_UNBOUNDED - budget.bytes, _UNBOUNDED - budget.events)
    trace = replace(trace, events_json=msgspec.Raw())  # (the text's last reference: freed before the cells)
    return _reduced(work, trace, alone, config)


def _reduced(work: RankWork, trace: RawTrace, alone: bool, config: dict | None) -> RankWork:
    """`work` with the trace's ranks' tables (or the error making them) and their warnings."""
    work.trace = without_events(trace)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            work.ranks = _ranks(trace, alone, config)
        except InputError as error:
            work.error = error
        work.warnings = _warned(caught)
    return work


def _ranks(trace: RawTrace, alone: bool, config: dict | None) -> list[RankInput]:
    if not alone:
        return [] if trace.rank is None else [rank_input(trace, config, alone)]  # (no rank: load_run refuses)
    if trace.rank is None:
        trace = with_rank(trace, 0)
    run = virtual_ranks(one_trace_run(trace, config))
    return [rank_input(one, config) for one in run.traces]  # (virtual ranks keep the events' indices)


def _frames_left() -> int:
    """Calls the caller may still nest before the recursion limit, as the interpreter counts them: C calls
    too, which frames do not show (a Dask worker's thread runs its tasks under two of them)."""

    def down(depth: int) -> int:
        try:
            return down(depth + 1)
        except RecursionError:
            return depth

    return down(0)


@contextmanager
def _recursion_headroom(headroom: int | None) -> Iterator[None]:
    """The recursion limit set `headroom` calls above the caller (msgspec's nesting limit is Python's
    recursion limit, so a worker refuses the same nesting as the process that started it)."""
    if headroom is None:
        yield
        return
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(before + headroom - _frames_left())
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def _warned(caught: list[warnings.WarningMessage]) -> list[Warned]:
    return [(str(w.message), w.category) for w in caught]


def _warn(warned: list[Warned]) -> None:
    for message, category in warned:
        warnings.warn(message, category, stacklevel=3)


def _task(task: tuple[Path, limits.Limits, bool, dict | None, int]) -> RankWork:
    with _ONE_AT_A_TIME:
        return rank_work(*task)


class _Reader:
    """load_run's reader: each file's RankWork, taken in file order from the pool (or made here)."""

    def __init__(self, directory: Path, size: int, progress: Progress) -> None:
        self.directory, self.size, self.progress = directory, size, progress
        self.handout: Handout | None = None
        self.results: Iterator[RankWork] | None = None
        self.works: dict[Path, RankWork] = {}
        self.alone, self.config = False, None

    def _start(self) -> None:
        """Hand every file out (on the first read: load_run has checked the directory by then)."""
        files = trace_files(self.directory)
        self.config = read_run_config(self.directory / "run.json")
        self.alone = len(files) == 1
        headroom = _frames_left()
        tasks = [(path, limits.current(), self.alone, self.config, headroom) for path in files]
        self.progress.total = len(files)
        engine = cluster.current()
        if engine is not None:
            self.results = engine.map_in_order(_task, tasks)
            return
        if self.size == 1:
            self.results = map(_task, tasks)
            return
        # The largest files first, so that no worker is left with a big one at the end; taken in order.
        largest_first = sorted(tasks, key=lambda task: workers.json_bytes(task[0]), reverse=True)
        self.handout = Handout(self.start_pool, self.size, _task, largest_first)
        self.handout.read_here_while_starting()
        self.results = (self.handout.results[path].result() for path in files)

    def __call__(self, path: Path, budget: Budget) -> RawTrace:
        if self.results is None:
            self._start()
        work = next(self.results)
        assert work.path == path, (work.path, path)
        self.progress.done_one()
        full = limits.current()
        unbudgeted = budget.bytes >= full.file_bytes and budget.events >= full.events
        fits = work.used.bytes <= budget.bytes and work.used.events <= budget.events
        if (work.load_error is None and fits) or unbudgeted:
            _warn(work.load_warnings)
            if work.load_error is not None:
                raise work.load_error
            budget.bytes -= work.used.bytes
            budget.events -= work.used.events
            self.works[path] = work
            return work.trace
        # Less than a file's limits was left: reading it again here meets them where a serial read does.
        trace = read_trace(path, budget)
        work = self.works[path] = _reduced(RankWork(path), trace, self.alone, self.config)
        return work.trace

    def ranks(self, run: RunTraces) -> dict[int, RankInput]:
        """rank -> tables, for the traces load_run kept (their analysis errors raised in rank order)."""
        if len(run.traces) == 1 and not self.alone:  # the only trace among other JSON: maybe P ranks
            path = run.traces[0].path  # (read again: its load's warnings, given already, are not kept)
            self.works[path] = rank_work(path, limits.current(), True, run.config)
        if len(run.traces) > 1:
            virtual_ranks(run)  # refuses a run.json that says single_gpu of several traces
        by_rank: dict[int, RankInput] = {}
        for trace in run.traces:
            work = self.works[trace.path]
            _warn(work.warnings)
            if work.error is not None:
                raise work.error
            by_rank |= {one.rank: one for one in work.ranks}
        return by_rank

    def start_pool(self) -> Any:
        context = multiprocessing.get_context("forkserver")  # fork is unsafe once polars' threads run
        context.set_forkserver_preload([__name__])
        with workers.main_not_rerun():
            return context.Pool(self.size)

    def close(self) -> None:
        if self.handout is not None:
            self.handout.close()
        if isinstance(self.results, Generator):
            self.results.close()  # (a cluster's results not taken are cancelled there)


def read_ranks(
    directory: Path, check: Callable[[RunTraces], object] | None = None
) -> tuple[RunTraces, dict[int, RankInput]]:
    """The run as load_run checks it (its traces without their frames; any subset of the job's ranks),
    and rank -> its tables. `check` sees the run first, as load_run's own checks: its error comes
    before any rank's analysis error."""
    directory = Path(directory)
    files = trace_files(directory) if directory.is_dir() else []
    with Progress(f"{directory.name}: ranks read") as progress:
        reader = _Reader(directory, workers.pool_size(files), progress)
        try:
            run = load_run(directory, reader)
            if check is not None:
                check(run)
            return run, reader.ranks(run)
        finally:
            reader.close()
