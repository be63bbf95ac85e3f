"""Typed msgspec view of a Kineto Chrome trace: only the fields the analysis and the merge read.

Decoding into these structs skips every other field in C, which is what makes loading fast. Times
come as int or float, range-checked in C; the few floats whose nanoseconds a double cannot settle are
read again as their JSON text (`EventTimes`, see analysis.traces.times). Free-form `args` values are typed
`Any` because real traces put anything there. Decoded JSON cannot form reference cycles, so the
structs opt out of the cyclic garbage collector (gc=False), which would otherwise rescan the growing
event list again and again while it is decoded. A time written as a JSON string ("ts": "1234.5", as some
writers emit) fails that typed decode; only such a piece is decoded again, strings allowed (`EVENTS`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

# |ts|, |dur| below this many microseconds (about 127 years): base + ts then fits in int64 nanoseconds,
# and every such int is exact as a float.
MAX_US = 4 * 10**15
# Names torch.profiler gives: its step spans (ProfilerStep#N) and autograd's backward ops.
STEP_PREFIX = "ProfilerStep#"
BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function:"
# The op torch records around each c10d call, its peer and process group in its args.
RECORD_PARAM_COMMS = "record_param_comms"
# Event categories (lowercased: the 2021 format capitalises them) of work that runs on a GPU stream, and
# of every event that lives on one (the device-side copies of user annotations too).
DEVICE_WORK_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
DEVICE_TRACK_CATS = (*DEVICE_WORK_CATS, "gpu_user_annotation")
_IN_RANGE = msgspec.Meta(gt=-MAX_US, lt=MAX_US)
Micros = Annotated[int, _IN_RANGE] | Annotated[float, _IN_RANGE] | None

# Unset `ts`/`dur` text: an empty Raw, told apart from a present value by its length.
NO_TIME = msgspec.Raw()


class Args(msgspec.Struct, frozen=True, gc=False):
    correlation: Any = None
    external_id: Any = msgspec.field(name="External id", default=None)
    stream: Any = None
    # autograd's sequence number: a backward op carries the one of the forward op it differentiates
    sequence: Any = msgspec.field(name="Sequence number", default=None)
    # Values of counter ("C") and instant ("i") events, read in the same pass (COUNTER_VALUES): the
    # executor's stash and run-queue counters, torch's "[memory]" allocator events.
    microbatches: Any = None
    activation_bytes: Any = None
    peak_bytes_above_step_start: Any = None
    total_allocated: Any = msgspec.field(name="Total Allocated", default=None)
    allocation: Any = msgspec.field(name="Bytes", default=None)  # this event's (de)allocation, signed
    device_type: Any = msgspec.field(name="Device Type", default=None)  # 0 CPU, 1 CUDA
    run_delay_ns: Any = None  # the thread's cumulative run-queue delay (runners/runqueue.py)


NO_ARGS = Args()
# The Args fields kept for counter and instant events (analysis.traces.events.counter_values).
COUNTER_VALUES = (
    "microbatches",
    "activation_bytes",
    "peak_bytes_above_step_start",
    "total_allocated",
    "allocation",
    "device_type",
    "run_delay_ns",
)
COUNTER_PHASES = ("C", "i")


class Event(msgspec.Struct, gc=False):
    ph: str
    name: str = ""
    cat: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: Micros = None
    dur: Micros = None
    id: int | str | None = None  # flow id of ph "s"/"f" events (ac2g: runtime launch -> kernel)
    bp: str | None = None
    args: Args | None = NO_ARGS  # shared, so a missing args costs no object (JSON null gives None)


class TextTimesEvent(Event, gc=False):
    """An event whose ts or dur may be a JSON string: its number's text, read by analysis.traces.events."""

    ts: Micros | str = None
    dur: Micros | str = None


class CommArgs(msgspec.Struct, gc=False):
    """What a record_param_comms op says of its peer and process group (analysis.traces.comms). Not in
    Args: every field there costs every event's args a comparison per key it does not know (five more
    made the decode 23% slower), so these are decoded in a second pass over the pieces that hold such ops."""

    src: Any = msgspec.field(name="Src Rank", default=None)
    dst: Any = msgspec.field(name="Dst Rank", default=None)
    ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    group_id: Any = msgspec.field(name="Process Group Name", default=None)
    group_desc: Any = msgspec.field(name="Process Group Description", default=None)


class CommOp(msgspec.Struct, gc=False):
    name: str = ""
    args: CommArgs | None = None  # (an array EVENTS has decoded holds objects or null here)


class EventTimes(msgspec.Struct, gc=False):
    """ts and dur as their JSON text, for exact nanoseconds where a float cannot give them."""

    ts: msgspec.Raw = NO_TIME
    dur: msgspec.Raw = NO_TIME


class DistributedInfo(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: Any = None  # the rank's process groups (pg_desc, ranks, ...): analysis.traces.layout reads them


# Top-level keys besides traceEvents that the analysis reads, with their types (the rest stay raw).
HEADER_TYPES: dict[str, Any] = {
    "distributedInfo": DistributedInfo,
    "baseTimeNanoseconds": int,
    "deviceProperties": list[Any],
    "traceName": str,
    "trace_id": str,
    "run_id": str,  # written by our runners and the synthetic generator: the same in every rank
}

# msgspec's words for a string where a time should be (the only refusal TextTimesEvent lifts)
_STRING_TIME = re.compile(r"got `str` - at `\$\[\d+\]\.(?:ts|dur)`$")


class EventsDecoder:
    """A JSON array of events -> list[Event]; where the typed decode meets a time written as a string, the
    array is decoded again as TextTimesEvent (a piece's events: the typed decode stays the loader's speed
    wherever times are numbers)."""

    typed = msgspec.json.Decoder(list[Event])
    text_times = msgspec.json.Decoder(list[TextTimesEvent])

    def decode(self, text: Any) -> list[Event]:
        try:
            return self.typed.decode(text)
        except msgspec.ValidationError as error:
            if _STRING_TIME.search(str(error)) is None:
                raise
        return self.text_times.decode(text)


EVENTS = EventsDecoder()
EVENT_TIMES = msgspec.json.Decoder(list[EventTimes])
COMM_OPS = msgspec.json.Decoder(list[CommOp])
TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])


def span(name: str, cat: str, pid: int, tid: int, start: int, end: int, **args: Any) -> dict[str, Any]:
    """A complete ("X") event as the profiler writes it, from times in ns (the synthetic generators and the
    op-level conversion write traces with it)."""
    event = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": start / 1000,
        "dur": (end - start) / 1000,
    }
    if args:
        event["args"] = args
    return event
