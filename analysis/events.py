"""The traceEvents array (JSON text) -> one validated polars row per event, times in exact nanoseconds."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from analysis import kineto
from analysis.errors import InputError
from analysis.times import check_times, exact_ns


def event_frame(path: Path, events_json: msgspec.Raw, base_ns: int) -> tuple[pl.DataFrame, int]:
    """Columns index, ph, name, cat, pid, tid, start_ns, end_ns, args ids; and how many events were
    dropped for a negative duration."""
    frame = _columns(_decode(path, events_json))
    problem = check_times(frame)
    if problem is not None:
        raise InputError(path, problem)
    frame = frame.with_columns(
        start_ns=pl.lit(base_ns, dtype=pl.Int64) + exact_ns("ts_text"),
        dur_ns=pl.when(pl.col("ph") == "X").then(exact_ns("dur_text")).otherwise(0),
    )
    negative = pl.col("dur_ns") < 0
    dropped = frame.select(negative.sum()).item()
    frame = frame.filter(~negative).with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns"))
    return frame.drop("ts_text", "dur_text", "dur_ns"), dropped


def _decode(path: Path, events_json: msgspec.Raw) -> list[kineto.Event]:
    # Millions of new objects would trigger many full collections that find nothing (JSON has no cycles).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return kineto.EVENTS.decode(events_json)
    except msgspec.ValidationError as error:  # a subclass of DecodeError: test it first
        raise InputError(path, f"bad trace event: {where(error, 'traceEvents')}") from None
    except msgspec.DecodeError as error:
        raise InputError(path, json_problem(error)) from None
    finally:
        if collecting:
            gc.enable()


def _columns(events: list[kineto.Event]) -> pl.DataFrame:
    """Struct list -> columns; one comprehension per field is the fast path from Python objects."""
    no_args = kineto.Args()
    args = [e.args or no_args for e in events]

    def ints(values: list[Any]) -> pl.Series:
        return pl.Series(values, dtype=pl.Int64, strict=False)

    def texts(values: list[msgspec.Raw]) -> pl.Series:
        return pl.Series([bytes(v) for v in values], dtype=pl.Binary).cast(pl.String)

    return pl.DataFrame(
        {
            "index": pl.int_range(len(events), dtype=pl.Int64, eager=True),
            "ph": pl.Series([e.ph for e in events], dtype=pl.String),
            "name": pl.Series([e.name for e in events], dtype=pl.String),
            "cat": pl.Series([e.cat for e in events], dtype=pl.String),
            "pid": ints([e.pid for e in events]),
            "tid": ints([e.tid for e in events]),
            "ts_text": texts([e.ts for e in events]),
            "dur_text": texts([e.dur for e in events]),
            "correlation": ints([a.correlation for a in args]),
            "external_id": ints([a.external_id for a in args]),
            "record_function_id": ints([a.record_function_id for a in args]),
            "stream": ints([a.stream for a in args]),
            "device": ints([a.device for a in args]),
            "flow_id": ints([e.id for e in events]),
            "bp": pl.Series([e.bp for e in events], dtype=pl.String),
        }
    )


def json_problem(error: msgspec.DecodeError) -> str:
    if "truncated" in str(error):
        return "truncated JSON (profiler killed while writing?)"
    return f"not valid JSON: {error}"


def where(error: msgspec.ValidationError, root: str) -> str:
    """msgspec's "Expected `str`, got `int` - at `$[3].ph`" -> "... at traceEvents[3].ph"."""
    return str(error).replace("- at `$", f"at `{root}")
