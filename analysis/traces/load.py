"""Kineto Chrome traces (.json, .json.gz, or a legacy bare event array) -> one polars frame per rank.

`read_trace` decodes a file once with typed msgspec structs (analysis.traces.kineto) and keeps what the merge
needs verbatim: every top-level key as `msgspec.Raw` and the whole traceEvents array as one
`msgspec.Raw` (a view of the decompressed bytes, unknown fields included; `RawTrace.events()` decodes
it to dicts, and a frame row's `index` is its event's position there). The array is located without
decoding it first (`_guess_top_level`), so the events are parsed once, not twice. `load_trace` gives
the frame:

    index, rank, ph, name, cat, pid, tid, start_ns, end_ns, correlation, external_id, stream, sequence,
    flow_id, bp

(correlation links a runtime launch to its kernel, external_id a CPU op to its launches, stream is the
kernel's CUDA stream, sequence is autograd's sequence number (a backward op has the one of the forward op
it differentiates), flow_id and bp belong to flow events "s"/"f".)

Times are integer nanoseconds since the epoch: Kineto's `ts` is microseconds relative to the header's
`baseTimeNanoseconds`, so start_ns = base + ts, exact to the nanosecond of the JSON text: ints as they
are, floats through a double only where the double settles the nanosecond, else from the text
(analysis.traces.times), so 5110114341537.881 gives ...537881. end_ns = start_ns + dur for "X" events, start_ns
otherwise. A ts or dur written as a JSON string ("1234.5") is read as that number, from its text, and
counted (`RawTrace.string_times`); a string that is no number is refused. pid/tid that are not integers
(Kineto's "Spans"/"Traces" pseudo-processes) are null.

Bad input raises InputError naming the file and the problem. Events with a negative duration are
dropped with a TraceWarning and counted in `RawTrace.dropped` (clock glitches; one such event must not
make a whole run unusable). JSON has no NaN or infinity: such files are refused as not JSON.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from analysis.errors import InputError, LimitExceeded, TraceWarning
from analysis.traces import kineto, limits
from analysis.traces.durations import has_pairs, pair_durations
from analysis.traces.events import Events, ParamComms, event_frame, json_problem, where
from analysis.traces.labels import check_label_numbers
from analysis.traces.run_files import rank_from_name
from analysis.traces.source import read_text
from analysis.traces.stream import streamed
from analysis.traces.toplevel import (
    EVENTS_KEY,
    NESTED_TOO_DEEPLY,
    Malformed,
    around_events,
    members,
    refuse_repeated,
)

_NOT_BLANK = re.compile(rb"[^ \t\r\n]")
_RAW = msgspec.json.Decoder(msgspec.Raw)
_ARRAY_OF_OBJECTS = re.compile(rb"[ \t\r\n]*\[[ \t\r\n]*\{")


class NotATrace(InputError):
    """Valid or invalid JSON that is no Chrome trace: no traceEvents array, no event array."""


@dataclass(frozen=True)
class RawTrace:
    path: Path
    rank: int | None
    world_size: int | None
    backend: str | None
    base_ns: int
    header: dict[str, Any]  # the typed top-level keys of kineto.HEADER_TYPES that were present
    metadata: dict[str, msgspec.Raw]  # every top-level key but traceEvents, verbatim
    events_json: msgspec.Raw  # the traceEvents array, verbatim
    frame: pl.DataFrame
    counters: pl.DataFrame  # analysis.traces.events.COUNTER_SCHEMA: the counter and instant events' values
    comms: ParamComms  # its record_param_comms ops' args (analysis.traces.comms); empty unless asked for
    dropped: int  # events dropped: a negative duration, a "B" never ended, an "E" with no "B"
    paired: int = 0  # "E" events folded into their "B" (analysis.traces.durations)
    replaced: int = 0  # invalid UTF-8 sequences replaced by U+FFFD (analysis.traces.source)
    string_times: int = 0  # events whose ts or dur was a JSON string ("1234.5"), read as that number

    def events(self) -> list[dict[str, Any]]:
        """Every event as written, unknown fields included (for the merge)."""
        return msgspec.json.decode(self.events_json)


@dataclass
class Budget:
    """What is left of a run's limits (analysis.traces.limits: run_mb, run_events) as its files load."""

    bytes: int
    events: int

    @classmethod
    def of_run(cls) -> Budget:
        current = limits.current()
        return cls(current.run_bytes, current.run_event_count)


def read_trace(
    path: str | Path, budget: Budget | None = None, keep_text: bool = True, comms: bool = True
) -> RawTrace:
    """One trace file, within the limits in force (and what is left of the run's, with `budget`).
    Without `keep_text` the events are decoded as the file is read (analysis.traces.stream) where it
    can be, and `events_json` is left empty. Without `comms`, `RawTrace.comms` is left empty (a run of
    one pipeline reads none)."""
    path = Path(path)
    current = limits.current()
    byte_limit, byte_name = current.file_bytes, "file_mb"
    if budget is not None and budget.bytes < byte_limit:
        byte_limit, byte_name = budget.bytes, "run_mb"
    event_limit, event_name = current.events, "events"
    if budget is not None and budget.events < event_limit:
        event_limit, event_name = budget.events, "run_events"
    found = None if keep_text else streamed(path, byte_limit, byte_name, event_limit, event_name, comms)
    if found is not None:
        try:
            trace = _parse(path, found.metadata, msgspec.Raw(), found.frames.finish)
        except RecursionError:
            raise InputError(path, NESTED_TOO_DEEPLY) from None
        return _charged(trace, found.size, budget)
    text = read_text(path, byte_limit, byte_name)
    data = text.data
    if _NOT_BLANK.search(data) is None:
        raise InputError(path, "empty file")
    if text.replaced:
        warnings.warn(
            f"{path}: replaced {text.replaced} invalid UTF-8 sequence(s) with U+FFFD (the first at byte "
            f"{text.first_replaced})",
            TraceWarning,
            stacklevel=2,
        )

    def parsed(metadata: dict[str, msgspec.Raw], events_json: msgspec.Raw) -> RawTrace:
        return _parse(
            path,
            metadata,
            events_json,
            lambda base: event_frame(path, events_json, base, event_limit, event_name, comms),
        )

    try:
        guess = _guess_top_level(path, data)
        trace = None
        if guess is not None:
            try:
                trace = parsed(*guess)
            except LimitExceeded:
                raise
            except InputError:
                pass  # a wrong guess or a bad file: the full split below decides, and words the error
        if trace is None:
            trace = parsed(*_split_top_level(path, data))
    except RecursionError:
        raise InputError(path, NESTED_TOO_DEEPLY) from None
    return replace(_charged(trace, len(data), budget), replaced=text.replaced)


def _charged(trace: RawTrace, size: int, budget: Budget | None) -> RawTrace:
    """The trace, its `size` bytes of JSON and its events taken from `budget`."""
    if budget is not None:
        budget.bytes -= size
        budget.events -= trace.frame.height + trace.paired + trace.dropped
    return trace


def _parse(
    path: Path,
    metadata: dict[str, msgspec.Raw],
    events_json: msgspec.Raw,
    frames: Callable[[int], Events],
) -> RawTrace:
    """The trace of these top-level members, its events' frame and counters given by `frames(base_ns)`."""
    header = _decode_header(path, metadata)
    info = header.get("distributedInfo") or kineto.DistributedInfo()
    rank = _checked_rank(path, info)
    base_ns = header.get("baseTimeNanoseconds", 0)
    events = frames(base_ns)
    frame, dropped = events.frame, events.dropped
    if dropped:
        warnings.warn(
            f"{path}: dropped {dropped} events with a negative duration", TraceWarning, stacklevel=3
        )
    paired = 0
    if has_pairs(frame):
        pairs = pair_durations(frame)
        frame, paired = pairs.frame, pairs.paired
        if pairs.unended or pairs.unopened:
            warnings.warn(
                f"{path}: dropped {pairs.unended} begin (B) event(s) never ended and {pairs.unopened} end (E) "
                "event(s) with nothing open (a trace cut short?)",
                TraceWarning,
                stacklevel=3,
            )
        dropped += pairs.unended + pairs.unopened
    check_label_numbers(path, frame)
    frame = frame.with_columns(rank=pl.lit(rank, dtype=pl.Int64))
    return RawTrace(
        path,
        rank,
        info.world_size,
        info.backend,
        base_ns,
        header,
        metadata,
        events_json,
        frame,
        events.counters,
        events.comms,
        dropped,
        paired,
        string_times=events.string_times,
    )


def _checked_rank(path: Path, info: kineto.DistributedInfo) -> int | None:
    """The trace's rank (its distributedInfo, else its file name), and its world size, range-checked."""
    most = limits.current().ranks
    size = info.world_size
    if size is not None and size < 1:
        raise InputError(path, f"distributedInfo.world_size is {size}, not a number of ranks")
    if size is not None and size > most:
        raise LimitExceeded(
            path, limits.current().exceeded("ranks", f"world size {size} (distributedInfo.world_size)")
        )
    if info.rank is not None:
        rank, where_from = info.rank, "distributedInfo.rank"
    else:
        rank, where_from = rank_from_name(path), "the file name"
    if rank is None:
        return None
    if rank < 0:
        raise InputError(path, f"rank {rank} ({where_from}) is negative")
    if rank >= most:
        raise LimitExceeded(
            path, f"rank {_digits(rank)} ({where_from}) is past {limits.current().describe('ranks')}"
        )
    if size is not None and rank >= size:
        raise InputError(path, f"rank {rank} ({where_from}) is outside its world size of {size}")
    return rank


def _digits(number: int) -> str:
    return str(number) if number < 10**24 else f"of {len(str(number))} digits"


def load_trace(path: str | Path) -> pl.DataFrame:
    return read_trace(path).frame


def _guess_top_level(path: Path, data: Any) -> tuple[dict[str, msgspec.Raw], msgspec.Raw] | None:
    """The top level split without scanning the events: the array is taken to run from the `[` after
    the "traceEvents" key to the file's last `]` (Kineto writes only short keys after it). The header and
    the trailer are checked to be an object around one value, so if the array then decodes, the whole
    file is valid JSON and that array is its traceEvents. None when the guess fails its cheap checks;
    InputError when the header and trailer repeat a key."""
    key = data.find(b'"traceEvents"')
    found = EVENTS_KEY.match(data, key) if key >= 0 else None
    if found is None:
        return None
    start, end = found.end() - 1, data.rfind(b"]") + 1
    metadata = around_events(path, bytes(data[:start]), bytes(data[end:]))
    return None if metadata is None else (metadata, msgspec.Raw(memoryview(data)[start:end]))


def _split_top_level(path: Path, data: Any) -> tuple[dict[str, msgspec.Raw], msgspec.Raw]:
    first = _NOT_BLANK.search(data).start()
    if data[first : first + 1] == b"[":  # legacy format: a bare event array
        if _ARRAY_OF_OBJECTS.match(data) is None:
            _validate(path, data)
            raise NotATrace(path, "not a trace: an array, but not of event objects")
        return {}, msgspec.Raw(data)
    if data[first : first + 1] != b"{":
        _validate(path, data)
        raise NotATrace(path, "not a trace: the top level is neither an object nor an event array")
    try:
        found = members(data)
    except Malformed as malformed:
        _validate(path, data)
        raise _not_json(path, data, f"not valid JSON: {malformed.problem}") from None
    refuse_repeated(path, [key for key, _, _ in found])
    view = memoryview(data)
    top = {key: msgspec.Raw(view[a:b]) for key, a, b in found}
    events_json = top.pop("traceEvents", None)
    if events_json is None:
        raise NotATrace(path, "no traceEvents array (not a Chrome trace?)")
    return top, events_json


def _validate(path: Path, data: Any) -> None:
    """InputError with msgspec's words where `data` is not one JSON value."""
    try:
        _RAW.decode(data)
    except msgspec.DecodeError as error:
        raise _not_json(path, data, json_problem(error)) from None


def _not_json(path: Path, data: Any, problem: str) -> InputError:
    """Invalid JSON is a broken trace where it names traceEvents, else possibly some other file."""
    kind = InputError if data.find(b'"traceEvents"') >= 0 else NotATrace
    return kind(path, problem)


def _decode_header(path: Path, metadata: dict[str, msgspec.Raw]) -> dict[str, Any]:
    header = {}
    for key, kind in kineto.HEADER_TYPES.items():
        if key in metadata:
            try:
                header[key] = msgspec.json.decode(metadata[key], type=kind)
            except msgspec.ValidationError as error:  # a subclass of DecodeError: test it first
                raise InputError(path, f"bad {key}: {where(error, key)}") from None
            except msgspec.DecodeError as error:
                raise InputError(path, f"bad {key}: {json_problem(error)}") from None
    if not 0 <= header.get("baseTimeNanoseconds", 0) < 4 * 10**18:
        raise InputError(path, f"baseTimeNanoseconds out of range: {_digits(header['baseTimeNanoseconds'])}")
    return header


def with_rank(trace: RawTrace, rank: int) -> RawTrace:
    """The trace as rank `rank` (a single process's trace that names none is rank 0)."""
    return replace(trace, rank=rank, frame=trace.frame.with_columns(rank=pl.lit(rank, dtype=pl.Int64)))
