"""The traceEvents array (JSON text) -> one validated polars row per event, times in exact nanoseconds,
the values of its counter and instant events (kineto.COUNTER_VALUES) in a table of their own, and the
args of its record_param_comms ops (what analysis.traces.comms reads).

The array is decoded piece by piece (analysis.traces.array_split), each piece into typed structs
(analysis.traces.kineto) and at once into polars columns, so only one piece's Python objects live at a time:
peak memory stays near the text plus the frame, not the ~3x of a whole array of objects. The counter
values and the record_param_comms args come from the same pass: the memory and run-queue tables and the
p2p peers and process groups need no second decode of the text.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from analysis.errors import InputError, LimitExceeded
from analysis.traces import kineto, limits
from analysis.traces.array_split import array_pieces
from analysis.traces.times import exact_ns, missing_time, nanoseconds, string_problem
from analysis.traces.toplevel import NESTED_TOO_DEEPLY, shifted_offsets

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
COUNTER_SCHEMA = {"index": pl.Int64} | {name: pl.Int64 for name in kineto.COUNTER_VALUES}
ParamComms = list[tuple[int, kineto.CommArgs]]  # (index, args) of the record_param_comms ops with args
# About 20k events of compact JSON (fewer of Kineto's indented): their objects add ~8 MB to the peak
# while the piece is converted; 1 MB pieces were ~20% slower (each piece costs ~20 small polars calls).
PIECE_BYTES = 4 << 20

_EVENT_AT = re.compile(r" - at `\$\[(\d+)\](.*)`$")
_FOUR_DECIMALS = re.compile(rb"\.[0-9]{4}")  # a literal first byte: searched at memchr speed
_TIME_BEFORE = re.compile(rb'"(?:ts|dur)"[ \t\r\n]*:[ \t\r\n]*-?[0-9]*\Z')


@dataclass(frozen=True)
class Events:
    frame: pl.DataFrame  # index, ph, name, cat, pid, tid, start_ns, end_ns, args ids
    counters: pl.DataFrame  # COUNTER_SCHEMA: index and values of the "C" and "i" events
    dropped: int  # events dropped for a negative duration
    comms: ParamComms
    string_times: int  # events whose ts or dur was a JSON string (kineto.TextTimesEvent)


def event_frame(
    path: Path,
    events_json: msgspec.Raw,
    base_ns: int,
    max_events: int | None = None,
    limit: str = "events",
    comms: bool = True,
) -> Events:
    """The events' frame and counter values (and the record_param_comms args, with `comms`). More than
    `max_events` events is an InputError naming `limit` (a field of analysis.traces.limits.Limits),
    raised as soon as a piece passes it."""
    frames = EventFrames(path, max_events, limit, comms)
    with no_collection():
        for offset, piece, events in decoded_pieces(path, memoryview(events_json), kineto.EVENTS):
            frames.add(offset, piece, events)
            del events, piece  # before the next piece is decoded: one piece's objects at a time
    return frames.finish(base_ns)


class EventFrames:
    """The frame and counter values of an event array, a decoded piece at a time (`add`), then whole
    (`finish`, once the base time is known); with `comms`, its record_param_comms ops' args too."""

    def __init__(self, path: Path, max_events: int | None, limit: str, comms: bool = True) -> None:
        self.path, self.max_events, self.limit, self.wants_comms = path, max_events, limit, comms
        self.frames: list[pl.DataFrame] = []
        self.counters: list[pl.DataFrame] = []
        self.comms: ParamComms = []
        self.count = 0
        self.string_times = 0

    def add(self, offset: int, piece: Any, events: list[kineto.Event]) -> None:
        """A piece's events (the array's from `offset` on) and its text `[...]`."""
        self.count += len(events)
        if self.max_events is not None and self.count > self.max_events:
            scope = (
                "with the files before it, the run holds"
                if self.limit.startswith("run")
                else "this file holds"
            )
            raise LimitExceeded(self.path, f"{scope} more than {limits.current().describe(self.limit)}")
        frame, strings = _frame(self.path, offset, events, piece)
        self.frames.append(frame)
        self.string_times += strings
        self.counters.append(_counter_values(events, offset, self.frames[-1]["ph"]))
        if self.wants_comms:
            self.comms += _comms(piece, offset, self.frames[-1]["name"])

    def finish(self, base_ns: int) -> Events:
        frame = pl.concat(self.frames, rechunk=False).with_columns(
            start_ns=pl.lit(base_ns, dtype=pl.Int64) + pl.col("ts_ns"),
            dur_ns=pl.when(pl.col("ph") == "X").then(pl.col("dur_ns")).otherwise(0),
        )
        negative = pl.col("dur_ns") < 0
        dropped = frame.select(negative.sum()).item()
        if dropped:
            frame = frame.filter(~negative)
        frame = frame.with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns")).drop("ts_ns", "dur_ns")
        return Events(frame, pl.concat(self.counters, rechunk=False), dropped, self.comms, self.string_times)


@contextmanager
def no_collection() -> Iterator[None]:
    # Millions of new objects would trigger many full collections that find nothing (JSON has no cycles).
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def decoded_pieces(
    path: Path, text: memoryview, decoder: msgspec.json.Decoder, size: int | None = None
) -> Iterator[tuple[int, Any, list]]:
    """(index of its first element, its text, its elements decoded) for consecutive pieces of the JSON
    array `text`, so that only one piece's objects live at a time. A piece that is not JSON on its own
    (a cut inside a string or a nested object: analysis.traces.array_split) is decoded together with the
    pieces after it, twice as many at each try, until it is; what is still not JSON at the array's end
    is the file's error, an InputError."""
    pieces = array_pieces(text, size or PIECE_BYTES)
    if pieces is None or len(pieces) == 1:
        yield 0, text, _decoded(path, decoder, text, 0, 0)
        return
    offset, first = 0, 0
    while first < len(pieces):
        width = 1
        while True:
            last = min(first + width, len(pieces))
            start, end = pieces[first][0], pieces[last - 1][1]
            piece = b"".join((b"[", text[start:end], b"]"))
            try:
                elements = decoder.decode(piece)
                break
            except RecursionError:
                raise InputError(path, NESTED_TOO_DEEPLY) from None
            except msgspec.DecodeError:
                if last == len(pieces):
                    _decoded(path, decoder, piece, offset, start - 1)  # raises, wording the problem
                    raise
                width *= 2
        offset += len(elements)
        yield offset - len(elements), piece, elements
        del piece, elements  # (the caller drops its own references too)
        first = last


def _decoded(path: Path, decoder: msgspec.json.Decoder, text: Any, offset: int, at: int) -> list:
    """`text` decoded; its problem as an InputError (events numbered from `offset`, bytes from `at`)."""
    try:
        return decoder.decode(text)
    except RecursionError:
        raise InputError(path, NESTED_TOO_DEEPLY) from None
    except msgspec.ValidationError as error:  # a subclass of DecodeError: test it first
        raise InputError(path, bad_event(error, offset)) from None
    except msgspec.DecodeError as error:
        raise InputError(path, shifted_offsets(json_problem(error), at)) from None


def _frame(path: Path, offset: int, events: list[kineto.Event], text: Any) -> tuple[pl.DataFrame, int]:
    """One piece's columns, with ts_ns and dur_ns (base time not yet added), and how many of its events
    wrote a time as a string."""
    columns = _columns(events, offset)
    (ts_us, ts_texts), (dur_us, dur_texts) = columns.pop("ts_us"), columns.pop("dur_us")
    whole_ns = pl.Float64 in (ts_us.dtype, dur_us.dtype) and _times_in_whole_ns(text)
    (ts_ns, ts_rows), (dur_ns, dur_rows) = nanoseconds(ts_us, whole_ns), nanoseconds(dur_us, whole_ns)
    rows = pl.concat([ts_rows, dur_rows]).unique()
    if rows.len():
        ts_ns, dur_ns = _from_text(kineto.EVENT_TIMES.decode(text), rows, ts_ns, dur_ns)
    strings = 0
    if ts_texts is not None or dur_texts is not None:
        times = {"ts": (ts_ns, ts_texts), "dur": (dur_ns, dur_texts)}
        (ts_ns, dur_ns), strings = _string_times(path, columns["index"], times)
    problem = missing_time(columns["index"], columns["ph"], columns["name"], ts_ns, dur_ns)
    if problem is not None:
        raise InputError(path, problem)
    return pl.DataFrame(columns | {"ts_ns": ts_ns, "dur_ns": dur_ns}), strings


def _string_times(
    path: Path, index: pl.Series, times: dict[str, tuple[pl.Series, pl.Series | None]]
) -> tuple[list[pl.Series], int]:
    """Each field's nanoseconds (`times`: field -> its nanoseconds, its strings or None) with the times
    written as strings read from their text, and how many events wrote one; an InputError naming the
    first event whose string is no number or out of range."""
    written = pl.repeat(False, index.len(), eager=True)
    read = []
    for field, (ns, texts) in times.items():
        if texts is not None:
            problem = string_problem(texts, kineto.MAX_US)
            if problem is not None:
                row, number = problem
                wrong = _wrong(field, number)
                raise InputError(path, f"event {index[row]}: {field} {wrong}: {texts[row][:60]!r}")
            ns = ns.zip_with(texts.is_null(), pl.DataFrame({"t": texts}).select(exact_ns("t"))["t"])
            written |= texts.is_not_null()
        read.append(ns)
    return read, written.sum()


def _counter_values(events: list[kineto.Event], offset: int, ph: pl.Series) -> pl.DataFrame:
    """COUNTER_SCHEMA rows of the piece's counter and instant events (picked by row before any field
    is read: a quarter of a CPU trace's events with memory profiling, none of most others)."""
    rows = ph.is_in(kineto.COUNTER_PHASES).arg_true().to_list()
    args = [events[row].args or kineto.NO_ARGS for row in rows]
    values = {name: whole_numbers([getattr(a, name) for a in args]) for name in kineto.COUNTER_VALUES}
    return pl.DataFrame({"index": [offset + row for row in rows]} | values, schema=COUNTER_SCHEMA)


def _comms(text: Any, offset: int, name: pl.Series) -> ParamComms:
    """(index, args) of the piece's record_param_comms ops with args; the piece is decoded again, for
    them alone, only where it holds one."""
    rows = (name == kineto.RECORD_PARAM_COMMS).arg_true().to_list()
    if not rows:
        return []
    ops = kineto.COMM_OPS.decode(text)
    return [(offset + row, ops[row].args) for row in rows if ops[row].args is not None]


def _times_in_whole_ns(text: Any) -> bool:
    """No ts or dur in the text has more than three decimals (Kineto writes three). A number with four
    is rare outside times (some args), so each is checked for a time key before it. (A key spelled with
    escapes, "t\\u0073", is not recognised: a crafted file could lose its sub-nanosecond rounding.)"""
    for found in _FOUR_DECIMALS.finditer(text):
        if _TIME_BEFORE.search(text, max(0, found.start() - 256), found.start()):
            return False
    return True


def _from_text(
    times: list[kineto.EventTimes], rows: pl.Series, ts_ns: pl.Series, dur_ns: pl.Series
) -> tuple[pl.Series, pl.Series]:
    """ts_ns and dur_ns with `rows` converted again from their JSON text (analysis.traces.times: unsettled)."""
    texts = pl.DataFrame(
        {
            field: pl.Series([bytes(getattr(times[row], field)) for row in rows], dtype=pl.Binary).cast(
                pl.String
            )
            for field in ("ts", "dur")
        }
    ).select(ts=exact_ns("ts"), dur=exact_ns("dur"))
    return ts_ns.scatter(rows, texts["ts"]), dur_ns.scatter(rows, texts["dur"])


def _columns(events: list[kineto.Event], offset: int) -> dict[str, pl.Series]:
    """Struct list -> columns. A comprehension per field is the fast path from Python objects (Python
    specialises `e.name` on a struct's slot; attrgetter and astuple are slower)."""
    args = [e.args for e in events]
    try:
        correlation, external_id, stream, sequence = _argids(args)
    except AttributeError:  # "args": null
        correlation, external_id, stream, sequence = _argids([a or kineto.NO_ARGS for a in args])
    return {
        "index": pl.int_range(offset, offset + len(events), dtype=pl.Int64, eager=True),
        "ph": pl.Series([e.ph for e in events], dtype=pl.String),
        "name": pl.Series([e.name for e in events], dtype=pl.String),
        "cat": pl.Series([e.cat for e in events], dtype=pl.String),
        "pid": ids([e.pid for e in events]),
        "tid": ids([e.tid for e in events]),
        "ts_us": _micros([e.ts for e in events]),
        "dur_us": _micros([e.dur for e in events]),
        "correlation": correlation,
        "external_id": external_id,
        "stream": stream,
        "sequence": sequence,
        "flow_id": ids([e.id for e in events]),
        "bp": pl.Series([e.bp for e in events], dtype=pl.String),
    }


def _argids(args: list[kineto.Args]) -> tuple[pl.Series, pl.Series, pl.Series, pl.Series]:
    return (
        ids([a.correlation for a in args]),
        ids([a.external_id for a in args]),
        ids([a.stream for a in args]),
        ids([a.sequence for a in args]),
    )


def ids(values: list[Any]) -> pl.Series:
    """Integers; anything else ("Spans" pseudo-pids, strings in free-form args, numbers past 64 bits)
    becomes null."""
    try:
        return pl.Series(values, dtype=pl.Int64)
    except (TypeError, OverflowError):  # filtering in Python is ~3x faster than polars' strict=False
        pass
    ints = [v if v.__class__ is int else None for v in values]  # (not `type(v) is int and ...`: 2x slower)
    try:
        return pl.Series(ints, dtype=pl.Int64)
    except (TypeError, OverflowError):  # past 64 bits: rare enough for the slower test
        return pl.Series(
            [v if v is not None and _INT64_MIN <= v <= _INT64_MAX else None for v in ints], dtype=pl.Int64
        )


def whole_numbers(values: list[Any]) -> pl.Series:
    """Whole numbers (not booleans, not floats) within 64 bits; anything else null."""
    if bool in set(map(type, values)):  # (polars would take True for 1; ids turns the rest to null)
        values = [None if type(v) is bool else v for v in values]
    return ids(values)


def _micros(values: list[int | float | str | None]) -> tuple[pl.Series, pl.Series | None]:
    """Int64 when every time is an int (exact as is), else Float64 (ints below kineto.MAX_US stay exact);
    beside it the times written as strings (kineto.TextTimesEvent), or None where there are none."""
    try:
        return pl.Series(values, dtype=pl.Int64), None
    except TypeError:
        pass
    try:
        return pl.Series(values, dtype=pl.Float64), None
    except TypeError:  # strings: a piece decoded as kineto.TextTimesEvent
        texts = [v if v.__class__ is str else None for v in values]
        numbers = [None if v.__class__ is str else v for v in values]
        return _micros(numbers)[0], pl.Series(texts, dtype=pl.String)


def bad_event(error: msgspec.ValidationError, offset: int) -> str:
    """msgspec's "Expected `str`, got `int` - at `$[3].ph`" -> "bad trace event: ... at traceEvents[3].ph",
    numbering events from the array's start; a bad ts/dur says what is wrong with the time."""
    message = str(error)
    found = _EVENT_AT.search(message)
    if found is None:
        return f"bad trace event: {message}"
    index, rest = offset + int(found[1]), found[2]
    if rest in (".ts", ".dur"):
        wrong = _wrong(rest[1:], number=", got `" not in message)
        return f"event {index}: {rest[1:]} {wrong}: {message[: found.start()]}"
    return f"bad trace event: {message[: found.start()]} at `traceEvents[{index}]{rest}`"


def _wrong(field: str, number: bool) -> str:
    """What is wrong with a time that is no number, or (`number`) a number out of range."""
    return f"out of range (|{field}| >= {kineto.MAX_US} us)" if number else "is not a number"


def json_problem(error: msgspec.DecodeError) -> str:
    if "truncated" in str(error):
        return "truncated JSON (profiler killed while writing?)"
    return f"not valid JSON: {error}"


def where(error: msgspec.ValidationError, root: str) -> str:
    """msgspec's "Expected `str`, got `int` - at `$[3].ph`" -> "... at traceEvents[3].ph"."""
    return str(error).replace("- at `$", f"at `{root}")
