"""Holistic Trace Analysis run on a run's rank traces (package hta, the `[hta]` extra): per rank, the
numbers HTA users know: the temporal breakdown (idle, compute, non-compute), the comm/compute overlap,
the idle-time breakdown per stream (host_wait, kernel_wait, other) and the top kernels. hta is imported
inside `run_hta` only: it takes seconds to import and reconfigures logging, which no other command
should pay."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import polars as pl

from analysis.cells.labelled import device_events, is_gpu
from analysis.errors import InputError
from analysis.hta.figures import IDLE_CATEGORIES, TOP_KERNELS, HtaFigures, HtaRank, Kernel, StreamIdle
from analysis.traces.run import load_run

INSTALL_HINT = "pip install -e '.[hta]'"


@contextmanager
def _quiet() -> Iterator[None]:
    """HTA logs every file it parses to stdout and pandas warns on its calls: neither is for the user."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


@dataclass(frozen=True)
class _RankTrace:
    path: Path
    rounding_ms: float
    compute_stream: int | None


def _rank_traces(run_dir: Path) -> tuple[dict[int, _RankTrace], list[int]]:
    """The ranks with GPU kernels (the loader says which files are rank traces), and those without."""
    with_kernels, without = {}, []
    for trace in load_run(run_dir).traces:  # (any of the job's ranks: a trace's rank is its own)
        rank = trace.rank
        if not is_gpu(trace.frame):
            without.append(rank)
            continue
        events = device_events(trace.frame)
        # HTA rounds each kernel's start up and its end down to a whole microsecond of the trace's ts (a
        # float when it has ns digits): the kernel shrinks by the two fractions, its busy union by their sum
        # at most, and the idle beside it grows by as much.
        fraction = [(pl.col(edge) - trace.base_ns) % 1000 for edge in ("start_ns", "end_ns")]
        rounding_ns = events.select(((1000 - fraction[0]) % 1000 + fraction[1]).sum()).item()
        compute = (
            events.filter(~pl.col("is_p2p"))
            .group_by("stream")
            .agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum())
            .sort("ns", "stream", descending=[True, False])
        )
        stream = compute["stream"][0] if compute.height else None
        with_kernels[rank] = _RankTrace(trace.path, rounding_ns / 1e6, stream)
    return with_kernels, without


def run_hta(run_dir: Path) -> HtaFigures:
    """HTA's breakdowns of the run's rank traces. InputError when hta is missing, the run has no GPU
    kernels (a CPU run), or HTA fails on the traces (its error, in one line)."""
    with _quiet():
        try:
            from hta.trace_analysis import TraceAnalysis
        except ModuleNotFoundError:
            raise InputError(
                None, f"python -m analysis hta needs Holistic Trace Analysis: {INSTALL_HINT}"
            ) from None
    traces, without = _rank_traces(run_dir)
    if not traces:
        raise InputError(
            run_dir,
            "no GPU kernels in the rank traces (a CPU run): HTA's temporal, idle-time and kernel "
            "breakdowns are of GPU kernels and do not apply",
        )
    version = metadata.version("holistictraceanalysis")
    with _quiet():
        try:
            # trace_files, not trace_dir: HTA would parse every *.json[.gz] there (merged.json.gz too) and
            # number ranks by its own reading; these are the loader's rank traces under our rank numbers
            analysis = TraceAnalysis(
                trace_files={rank: str(t.path.resolve()) for rank, t in traces.items()},
                include_last_profiler_step=True,
            )
            temporal = analysis.get_temporal_breakdown(visualize=False)
            overlap = analysis.get_comm_comp_overlap(visualize=False)
            idle, _ = analysis.get_idle_time_breakdown(ranks=sorted(traces), visualize=False)
            _, kernels = analysis.get_gpu_kernel_breakdown(
                visualize=False, duration_ratio=1.0, num_kernels=TOP_KERNELS, include_memory_kernels=True
            )
        except Exception as error:  # a third-party tool failing on input we read: one line, not its traceback
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
            raise InputError(
                run_dir,
                f"Holistic Trace Analysis {version} failed on the traces: {type(error).__name__}: {first}",
            ) from error
    ranks = [_hta_rank(rank, traces[rank], temporal, overlap, idle, kernels) for rank in sorted(traces)]
    return HtaFigures(version, ranks, without)


def _hta_rank(rank: int, trace: _RankTrace, temporal, overlap, idle, kernels) -> HtaRank:
    """One rank's rows of HTA's pandas frames, in ms."""
    times = temporal[temporal["rank"] == rank].iloc[0]
    overlap_pct = float(overlap[overlap["rank"] == rank]["comp_comm_overlap_pctg"].iloc[0])
    streams = []
    mine = idle[idle["rank"] == rank]
    for stream, rows in mine.groupby("stream"):
        us = dict(zip(rows["idle_category"], rows["idle_time"]))
        streams.append(StreamIdle(int(stream), *(float(us.get(c, 0.0)) / 1000 for c in IDLE_CATEGORIES)))
    top = kernels[(kernels["rank"] == rank) & (kernels["name"] != "others")].nlargest(TOP_KERNELS, "sum (us)")
    return HtaRank(
        rank=rank,
        rounding_ms=trace.rounding_ms,
        compute_stream=trace.compute_stream,
        span_ms=float(times["kernel_time(us)"]) / 1000,
        idle_ms=float(times["idle_time(us)"]) / 1000,
        compute_ms=float(times["compute_time(us)"]) / 1000,
        non_compute_ms=float(times["non_compute_time(us)"]) / 1000,
        overlap_pct=None if math.isnan(overlap_pct) else overlap_pct,  # NaN: no communication kernels
        streams=streams,
        top_kernels=[
            Kernel(str(name), str(kind), float(us) / 1000)
            for name, kind, us in zip(top["name"], top["kernel_type"], top["sum (us)"])
        ],
    )
