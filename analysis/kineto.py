"""Typed msgspec view of a Kineto Chrome trace: only the fields the analysis and the merge read.

Decoding into these structs skips every other field in C, which is what makes loading fast. Times
stay as their JSON text (`msgspec.Raw`) so analysis.load can turn them into exact nanoseconds;
free-form `args` values are typed `Any` because real traces put anything there. Decoded JSON cannot form
reference cycles, so the structs opt out of the cyclic garbage collector (gc=False), which would
otherwise rescan the growing event list again and again while it is decoded.
"""

from __future__ import annotations

from typing import Any

import msgspec

# Unset `ts`/`dur`: an empty Raw, told apart from a present value by its length.
NO_TIME = msgspec.Raw()


class Args(msgspec.Struct, gc=False):
    correlation: Any = None
    external_id: Any = msgspec.field(name="External id", default=None)
    record_function_id: Any = msgspec.field(name="Record function id", default=None)
    stream: Any = None
    device: Any = None


class Event(msgspec.Struct, gc=False):
    ph: str
    name: str = ""
    cat: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = NO_TIME
    dur: msgspec.Raw = NO_TIME
    id: int | str | None = None  # flow id of ph "s"/"f" events (ac2g: runtime launch -> kernel)
    bp: str | None = None
    args: Args | None = None


class DistributedInfo(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None


# Top-level keys besides traceEvents that the analysis reads, with their types (the rest stay raw).
HEADER_TYPES: dict[str, Any] = {
    "distributedInfo": DistributedInfo,
    "baseTimeNanoseconds": int,
    "deviceProperties": list[Any],
    "traceName": str,
    "trace_id": str,
    "run_id": str,  # written by our runners and the synthetic generator: the same in every rank
}

EVENTS = msgspec.json.Decoder(list[Event])
TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
