"""The native executor's `PP run queue` counter (runners/runqueue.py): per rank, samples of how long its
thread had sat runnable but not running, cumulative ns, taken at the start and the end of every action.
Traces without it (other loops, non-Linux runs) give no samples, and cpu_contention stays unknown."""

from __future__ import annotations

import warnings

import polars as pl

from analysis.traces.spans import rows
from analysis.errors import TraceWarning
from analysis.traces.load import RawTrace
from runners.schedules.trace_names import RUN_QUEUE_COUNTER

RUN_QUEUE_EVENTS = (pl.col("ph") == "C") & (pl.col("name") == RUN_QUEUE_COUNTER)
SAMPLE_SCHEMA = {"rank": pl.Int64, "t_ns": pl.Int64, "run_delay_ns": pl.Int64}


def run_queue_samples(trace: RawTrace) -> pl.DataFrame:
    """One rank's samples (SAMPLE_SCHEMA), on its own clock, their values from the loader's counter
    table (RawTrace.counters); a sample without a whole number >= 0 is dropped with one warning."""
    wanted = rows(trace.frame, RUN_QUEUE_EVENTS, "index", "start_ns")
    if wanted.is_empty():
        return pl.DataFrame(schema=SAMPLE_SCHEMA)
    samples = wanted.join(trace.counters, on="index", how="left", maintain_order="left").select(
        pl.lit(trace.rank, dtype=pl.Int64).alias("rank"), t_ns="start_ns", run_delay_ns="run_delay_ns"
    )
    valid = samples.filter(pl.col("run_delay_ns") >= 0)
    if valid.height < samples.height:
        warnings.warn(
            f"{trace.path}: {samples.height - valid.height} {RUN_QUEUE_COUNTER} sample(s) without a "
            "run_delay_ns >= 0; ignored",
            TraceWarning,
            stacklevel=2,
        )
    return valid
