"""A run directory's traces: every rank's file read (analysis.traces.load.read_trace, or a reader that
does as it does) and checked to form one whole run: one file per rank, the same world size and run id,
as many ranks as run.json says (analysis.traces.run_config)."""

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
    traces: tuple[RawTrace, ...]  # traces[r] is rank r
    config: dict[str, Any] | None  # run.json; None for traces our runners did not write

    @property
    def world_size(self) -> int:
        return len(self.traces)

    def frame(self) -> pl.DataFrame:
        """Every rank's events in one frame (column `rank` tells them apart)."""
        return pl.concat([trace.frame for trace in self.traces], how="vertical")


def load_run(directory: str | Path, read: Callable[[Path, Budget], RawTrace] = read_trace) -> RunTraces:
    """Every rank trace of a run directory (+ run.json if present), checked to form one whole run, within
    the limits in force (analysis.traces.limits) for each file and for the run. `read` reads each file
    in turn, as read_trace does (analysis.ranks.pool reads them in other processes)."""
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
    one_process = config is not None and config.get("mode") == SINGLE_GPU  # P ranks in one trace
    if config is not None and not one_process and _ranks_said(config) not in (None, len(by_rank)):
        dp = f", dp={config['dp']!r:.20}" if "dp" in config else ""
        raise InputError(
            directory / "run.json",
            f"says p={config['p']!r:.40}{dp} but the directory has {len(by_rank)} rank traces",
        )
    return RunTraces(directory, tuple(by_rank), config)


def _ranks_said(config: dict[str, Any]) -> Any:
    """The number of ranks run.json says the job has: p ranks per pipeline x dp pipelines (1 unsaid)."""
    p, dp = config.get("p"), config.get("dp", 1)
    return p * dp if type(p) is int and type(dp) is int else p


def _one_per_rank(directory: Path, traces: list[RawTrace]) -> list[RawTrace]:
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
    sizes = {trace.world_size for trace in traces} - {None}
    expected = max([len(traces), max(by_rank) + 1, *sizes])
    if expected > len(by_rank):  # ranges, not a set of every rank: world_size may be large
        raise InputError(
            directory,
            f"missing rank(s) {_listed(_gaps(sorted(by_rank), expected))} (found {_listed(sorted(by_rank))})",
        )
    return [by_rank[rank] for rank in range(expected)]


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


def _listed(ranks: list[int] | list[tuple[int, int]]) -> str:
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
