"""Activation memory per rank and step, read from the memory events in the traces.

Three sources, best first (runners.stash writes the first two):
  stash      "PP stash" counter events: the executor's own count of microbatches and bytes it holds
             for backward, sampled inside the span of the F/B/I/W that changed it
  cuda_peak  "PP cuda step peak" counter events: the allocator's peak above the step's start (CUDA)
  cuda_allocator, allocator
             torch.profiler's "[memory]" events (profile_memory=True) on the GPU, else the CPU: the
             most bytes allocated above what was allocated when the step began (activations plus
             gradients and temporaries)
Their values come from the loader's table of counter and instant events (analysis.traces.events), read
in the one decode of the text. Times are the rank's own clock: steps come from its ProfilerStep spans.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.traces.spans import step_spans
from analysis.traces.spans import rows
from analysis.traces.load import RawTrace
from analysis.traces.run import RunTraces
from runners.schedules.trace_names import CUDA_PEAK_COUNTER, STASH_COUNTER

ALLOCATOR_EVENT = "[memory]"
SOURCES = ("stash", "cuda_peak", "cuda_allocator", "allocator")  # best first
EVENT_SCHEMA = {
    "rank": pl.Int64,
    "source": pl.String,
    "t_ns": pl.Int64,
    "microbatches": pl.Int64,
    "bytes": pl.Int64,
    "allocation": pl.Int64,
}
PEAK_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "source": pl.String,
    "peak_bytes": pl.Int64,
    "peak_microbatches": pl.Int64,
}


# The events memory_events reads: the executor's and the allocator's counters, torch's allocator events.
MEMORY_EVENTS = ((pl.col("ph") == "C") & pl.col("name").is_in([STASH_COUNTER, CUDA_PEAK_COUNTER])) | (
    (pl.col("ph") == "i") & (pl.col("name") == ALLOCATOR_EVENT)
)
_VALUES = ("microbatches", "activation_bytes", "peak_bytes_above_step_start", "total_allocated", "allocation")


def memory_events(trace: RawTrace) -> pl.DataFrame:
    """One rank's memory events: (rank, source, t_ns, microbatches, bytes, allocation), their values
    from the loader's counter table (RawTrace.counters)."""
    wanted = rows(trace.frame, MEMORY_EVENTS, "index", "name", "start_ns")
    if wanted.is_empty():
        return pl.DataFrame(schema=EVENT_SCHEMA)
    values = wanted.join(trace.counters, on="index", how="left", maintain_order="left")
    name = pl.col("name")
    stash, peak = name == STASH_COUNTER, name == CUDA_PEAK_COUNTER
    return values.select(
        pl.lit(trace.rank, dtype=pl.Int64).alias("rank"),
        source=pl.when(stash)
        .then(pl.lit("stash"))
        .when(peak)
        .then(pl.lit("cuda_peak"))
        .when(pl.col("device_type") == 1)
        .then(pl.lit("cuda_allocator"))
        .otherwise(pl.lit("allocator")),
        t_ns="start_ns",
        microbatches=pl.when(stash).then("microbatches"),
        bytes=pl.when(stash)
        .then("activation_bytes")
        .when(peak)
        .then("peak_bytes_above_step_start")
        .otherwise("total_allocated"),
        allocation=pl.when(~stash & ~peak).then("allocation"),
    )


def with_steps(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """One rank's events, each tagged with the profiled step whose span holds it; events between steps
    are dropped."""
    spans = steps.select("step", "start_ns", step_end_ns="end_ns").sort("start_ns")
    tagged = events.sort("t_ns").join_asof(spans, left_on="t_ns", right_on="start_ns", strategy="backward")
    return tagged.filter(pl.col("t_ns") <= pl.col("step_end_ns")).drop("start_ns", "step_end_ns")


def step_peaks(events: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step, source): the most bytes (and microbatches) held. Allocator events count from the
    step's start: the running sum of their signed sizes (older Kineto writes no "Total Allocated")."""
    above_step_start = pl.col("allocation").sort_by("t_ns").cum_sum().max().clip(lower_bound=0)
    peaks = events.group_by("rank", "step", "source").agg(
        most=pl.col("bytes").max(),
        above_start=above_step_start,
        peak_microbatches=pl.col("microbatches").max(),
    )
    from_allocator = pl.col("source").str.ends_with("allocator")
    return (
        peaks.with_columns(peak_bytes=pl.when(from_allocator).then("above_start").otherwise("most"))
        .select(*PEAK_SCHEMA)
        .sort("rank", "step", "source")
    )


def best_peaks(peaks: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step): the best source present (SOURCES order)."""
    rank_of_source = pl.col("source").replace_strict(
        list(SOURCES), list(range(len(SOURCES))), return_dtype=pl.Int64
    )
    return (
        peaks.sort(rank_of_source).group_by("rank", "step", maintain_order=True).first().sort("rank", "step")
    )


@dataclass(frozen=True)
class Memory:
    stash: pl.DataFrame  # rank, step, t_ns, microbatches, bytes: the executor's samples in profiled steps
    peaks: pl.DataFrame  # PEAK_SCHEMA: per (rank, step, source)

    def peak_bytes(self, step: int) -> dict[int, int]:
        """rank -> the best source's peak in `step` (ranks without memory events are absent)."""
        chosen = best_peaks(self.peaks.filter(pl.col("step") == step))
        return dict(chosen.select("rank", "peak_bytes").iter_rows())


def run_memory(run: RunTraces) -> Memory:
    """Every rank's memory events, placed in its profiled steps."""
    return memory_of(pl.concat([with_steps(memory_events(t), step_spans(t.frame)) for t in run.traces]))


def memory_of(events: pl.DataFrame) -> Memory:
    """The run's Memory from every rank's memory events placed in its steps (with_steps)."""
    stash = events.filter(pl.col("source") == "stash").select("rank", "step", "t_ns", "microbatches", "bytes")
    return Memory(stash, step_peaks(events))
