"""The native executor's `PP run queue` counter (runners/runqueue.py): per rank, samples of how long its
thread had sat runnable but not running, cumulative ns, taken at the start and the end of every action.
Traces without it (other loops, non-Linux runs) give no samples, and cpu_contention stays unknown."""

from __future__ import annotations

import warnings

import msgspec
import polars as pl

from analysis.traces.load import RawTrace, TraceWarning
from analysis.traces.memory import events_at
from runners.schedules.trace_names import RUN_QUEUE_COUNTER

RUN_QUEUE_EVENTS = (pl.col("ph") == "C") & (pl.col("name") == RUN_QUEUE_COUNTER)
SAMPLE_SCHEMA = {"rank": pl.Int64, "t_ns": pl.Int64, "run_delay_ns": pl.Int64}


class _Args(msgspec.Struct, gc=False):
    run_delay_ns: int | None = None


class _Sample(msgspec.Struct, gc=False):
    args: _Args | None = None


_SAMPLE = msgspec.json.Decoder(_Sample)


def run_queue_samples(trace: RawTrace, raw: dict[int, msgspec.Raw] | None = None) -> pl.DataFrame:
    """One rank's samples (SAMPLE_SCHEMA), on its own clock; a sample without a whole number is dropped
    with one warning. `raw`: their events' JSON by index, where the caller decoded them already."""
    wanted = trace.frame.filter(RUN_QUEUE_EVENTS)
    if wanted.is_empty():
        return pl.DataFrame(schema=SAMPLE_SCHEMA)
    if raw is None:
        raw = events_at(trace, wanted["index"].to_list())
    rows, malformed = [], 0
    for index, t_ns in wanted.select("index", "start_ns").iter_rows():
        try:
            delay = (_SAMPLE.decode(raw[index]).args or _Args()).run_delay_ns
        except msgspec.ValidationError:
            delay = None
        if delay is None or delay < 0:
            malformed += 1
            continue
        rows.append((trace.rank, t_ns, delay))
    if malformed:
        warnings.warn(
            f"{trace.path}: {malformed} {RUN_QUEUE_COUNTER} sample(s) without a run_delay_ns >= 0; ignored",
            TraceWarning,
            stacklevel=2,
        )
    return pl.DataFrame(rows, schema=SAMPLE_SCHEMA, orient="row")
