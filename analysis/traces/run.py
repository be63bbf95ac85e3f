"""A run directory's traces: every rank's file read (analysis.traces.load.read_trace, or a reader that
does as it does) and checked to be ranks of one job: one file per rank, the same world size and run id,
run.json (analysis.traces.run_config) agreeing with the traces. Any subset of the job's ranks loads (a
public trace is often one rank of a big job: rank 0 of 64); the run says which ranks it has and how many
the job has, and `RunTraces.require_complete` refuses it where a reader needs every rank."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from analysis.errors import InputError, LimitExceeded, TraceWarning
from analysis.traces import limits, oplevel_kineto
from analysis.traces.load import Budget, NotATrace, RawTrace, read_trace, with_rank
from analysis.traces.run_config import read_run_config
from analysis.traces.run_files import looks_like_trace, oplevel_files, trace_files
from runners.schedules.single_gpu import SINGLE_GPU


@dataclass(frozen=True)
class RunTraces:
    path: Path
    traces: tuple[RawTrace, ...]  # the ranks present, in rank order: traces[i].rank is the rank, not i
    config: dict[str, Any] | None  # run.json; None for traces our runners did not write
    # the job's ranks: distributedInfo.world_size, else run.json's p x dp, else the highest rank + 1
    world_size: int

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks whose traces are here, in order."""
        return tuple(trace.rank for trace in self.traces)

    @property
    def missing(self) -> list[tuple[int, int]]:
        """The job's ranks with no trace here, as runs (first, last), not every rank listed: a job may be
        far bigger than the ranks at hand. Empty where the run is complete."""
        return _gaps(list(self.ranks), self.world_size)

    def require_complete(self) -> RunTraces:
        """The run itself where every rank of the job has its trace; else an InputError naming the
        missing ranks. The one place that refuses a partial run, for readers that need every rank."""
        if self.missing:
            raise InputError(
                self.path, f"missing rank(s) {listed(self.missing)} (found {listed(self.ranks)})"
            )
        return self

    def frame(self) -> pl.DataFrame:
        """Every rank's events in one frame (column `rank` tells them apart)."""
        return pl.concat([trace.frame for trace in self.traces], how="vertical")


def load_run(directory: str | Path, read: Callable[[Path, Budget], RawTrace] = read_trace) -> RunTraces:
    """Every rank trace of a run directory (+ run.json if present), checked to be ranks of one job (any
    subset of them: RunTraces.missing), within the limits in force (analysis.traces.limits) for each file
    and for the run. `read` reads each file in turn, as read_trace does (analysis.ranks.pool reads them in
    other processes)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(directory, "not a directory")
    config = read_run_config(directory / "run.json")
    files = trace_files(directory)
    unnamed = not any(looks_like_trace(path.name) for path in files)
    if unnamed and oplevel_files(directory) is not None:  # read as the GPU traces it converts to
        oplevel_kineto.write_traces(directory)
        files = trace_files(directory)
    if not files:
        raise InputError(directory, "no trace files (*.json, *.json.gz) in the run directory")
    most = limits.current().ranks
    named = [path for path in files if looks_like_trace(path.name)]
    if len(named) > most:
        raise LimitExceeded(directory, limits.current().exceeded("ranks", f"{len(named)} trace files"))
    budget = Budget.of_run()
    traces = []
    for path in files:
        try:
            traces.append(read(path, budget))
        except NotATrace as error:
            if path in named:
                raise
            warnings.warn(
                f"{path}: skipped: {error.problem}, and not named like a trace", TraceWarning, stacklevel=2
            )
        if len(traces) > most:
            raise LimitExceeded(
                directory, limits.current().exceeded("ranks", f"more than {most} trace files")
            )
    if not traces:
        raise InputError(
            directory, "no trace files (*.json, *.json.gz) in the run directory, only other JSON"
        )
    if len(traces) == 1 and traces[0].rank is None:  # someone's single-process trace
        traces = [with_rank(traces[0], 0)]
    _check_same_run(directory, traces)
    by_rank = _one_per_rank(directory, traces)
    return RunTraces(directory, tuple(by_rank), config, _world_size(directory, by_rank, config))


def one_trace_run(trace: RawTrace, config: dict[str, Any] | None = None) -> RunTraces:
    """A run of one trace whose rank is known (a file merged alone, a pool worker's file), its job's
    size as load_run finds it."""
    return RunTraces(trace.path.parent, (trace,), config, _job_size([trace], config))


def _job_size(traces: list[RawTrace], config: dict[str, Any] | None) -> int:
    """The job's ranks: distributedInfo.world_size (one, _check_same_run), else run.json's p x dp where
    it is a number of ranks (not for single_gpu: P ranks in one process's trace), else the highest rank
    + 1. `traces` in rank order."""
    sizes = {trace.world_size for trace in traces} - {None}
    said = _ranks_said(config)
    return next(iter(sizes), said if type(said) is int else traces[-1].rank + 1)


def _world_size(directory: Path, traces: list[RawTrace], config: dict[str, Any] | None) -> int:
    """_job_size, where run.json agrees with the traces: its p x dp is their world size, or where they
    say none, a number of ranks within the limit that holds the highest rank."""
    world, said = _job_size(traces, config), _ranks_said(config)
    if said is None:
        return world
    if type(said) is int and said > limits.current().ranks:
        raise LimitExceeded(
            directory / "run.json", limits.current().exceeded("ranks", f"{said} ranks (p x dp)")
        )
    highest = traces[-1].rank
    if said != world or said <= highest:
        if len(traces) < world and any(trace.world_size is not None for trace in traces):
            found = f"ranks of a job of {world} (distributedInfo.world_size)"
        else:
            found = f"{len(traces)} rank traces" if len(traces) == highest + 1 else f"rank {highest}"
        dp = f", dp={config['dp']!r:.40}" if "dp" in config else ""
        raise InputError(
            directory / "run.json", f"says p={config['p']!r:.40}{dp} but the directory has {found}"
        )
    return world


def _ranks_said(config: dict[str, Any] | None) -> Any:
    """The number of ranks run.json says the job has: p ranks per pipeline x dp pipelines (1 unsaid);
    None without run.json, or for single_gpu (P ranks in one process's trace)."""
    if config is None or config.get("mode") == SINGLE_GPU:
        return None
    p, dp = config.get("p"), config.get("dp", 1)
    return p * dp if type(p) is int and type(dp) is int else p


def _one_per_rank(directory: Path, traces: list[RawTrace]) -> list[RawTrace]:
    """The traces in rank order, each rank known and claimed by one file."""
    by_rank: dict[int, RawTrace] = {}
    for trace in traces:
        if trace.rank is None:
            raise InputError(
                trace.path, "cannot tell the rank: no distributedInfo.rank and no rank number in the name"
            )
        if trace.rank in by_rank:
            raise InputError(
                directory,
                f"two files claim rank {trace.rank}: {by_rank[trace.rank].path.name}, {trace.path.name}",
            )
        by_rank[trace.rank] = trace
    return [by_rank[rank] for rank in sorted(by_rank)]


def _gaps(present: list[int], expected: int) -> list[tuple[int, int]]:
    """The runs of ranks in [0, expected) that `present` (sorted, unique) lacks, as (first, last)."""
    gaps, next_rank = [], 0
    for rank in [*present, expected]:
        if rank > next_rank:
            gaps.append((next_rank, rank - 1))
        next_rank = rank + 1
    return gaps


def _check_same_run(directory: Path, traces: list[RawTrace]) -> None:
    """Ranks of one job agree on world size and on our run id (Kineto's trace_id is per process)."""
    for label, values in (
        ("world sizes", {t.rank: t.world_size for t in traces if t.world_size is not None}),
        ("run ids", {t.rank: t.header["run_id"] for t in traces if "run_id" in t.header}),
    ):
        if len(set(values.values())) > 1:
            shown = ", ".join(f"rank{rank}: {str(value)[:40]}" for rank, value in list(values.items())[:8])
            raise InputError(directory, f"ranks from different runs: {label} differ ({shown})")


def listed(ranks: list[int] | list[tuple[int, int]]) -> str:
    """[0, 1, 2, 5, 7, 8] (or the runs [(0, 2), (5, 5), (7, 8)]) -> "0-2, 5, 7-8" (a 300-rank job must
    still give one readable line; past 20 runs, the first 10 and a count)."""
    runs: list[list[int]] = []
    for item in ranks:
        first, last = item if isinstance(item, tuple) else (item, item)
        if runs and first == runs[-1][1] + 1:
            runs[-1][1] = last
        else:
            runs.append([first, last])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return ", ".join(shown) if len(shown) <= 20 else ", ".join(shown[:10]) + f", ... ({len(shown)} runs)"
