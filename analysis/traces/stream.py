"""A trace file's events decoded as the file is read, without holding its whole text.

The text passes through in chunks (analysis.traces.source.text_chunks: gzip inflated as a stream, the
byte limit checked as it goes) and is cut into pieces of whole events where analysis.traces.array_split
cuts; each piece is decoded into columns (analysis.traces.events.EventFrames) and dropped, so a rank holds
its frame, a chunk and a piece, not its text. It takes the shape trace writers give, a UTF-8 object
`{header..., "traceEvents": [events], trailer...}`, and checks the header and trailer as the whole read's
top-level guess does (analysis.traces.load). Anything else, and any problem but the byte limit and the
file's reading (which the whole read meets first, alike), gives None: the caller reads the file whole,
which accepts or refuses it, and words the problem, as it always has. Only odd or bad files pay for the
second read.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from analysis.errors import InputError
from analysis.traces import kineto
from analysis.traces.array_split import next_cut
from analysis.traces.events import PIECE_BYTES, EventFrames, no_collection
from analysis.traces.source import text_chunks
from analysis.traces.toplevel import EVENTS_KEY, around_events

STREAM_BYTES = 16 << 20  # text read per step: a few pieces
# Header text before traceEvents, and blanks after its key, past which the whole read decides.
_HEADER_BYTES = 1 << 26
_KEY_BYTES = 1 << 12
# Cuts tried one after another where a piece does not decode (args often nest `}, {`), before its size
# doubles (a string full of them costs a decode per cut).
_NEXT_CUTS_TRIED = 8
# `]`s tried from the end as the array's (Kineto writes short arrays after it: a log, device lists).
_ENDS_TRIED = 64
_LEGACY = re.compile(rb"[ \t\r\n]*\[(?=[ \t\r\n]*\{)")
_NOT_BLANK = re.compile(rb"[^ \t\r\n]")


@dataclass(frozen=True)
class Streamed:
    metadata: dict[str, msgspec.Raw]  # every top-level key but traceEvents, verbatim
    frames: EventFrames  # every event's, added
    size: int  # bytes of JSON text


class _Unusual(Exception):
    """A file the stream leaves to the whole read."""


class _ReadError(Exception):
    def __init__(self, error: InputError):
        self.error = error


def streamed(
    path: Path, byte_limit: int, byte_name: str, max_events: int, event_name: str, comms: bool = True
) -> Streamed | None:
    """The file's events and top level (with `comms`, its record_param_comms args too), or None where
    the whole read must decide."""
    chunks = text_chunks(path, byte_limit, byte_name, STREAM_BYTES)
    if chunks is None:
        return None
    frames = EventFrames(path, max_events, event_name, comms)
    try:
        with no_collection():
            metadata, size = _stream(path, _read(chunks), frames)
    except _ReadError as read:
        raise read.error from None
    except (_Unusual, InputError, msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    return Streamed(metadata, frames, size)


def _read(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The chunks, checked to be UTF-8 (strictly: the whole read repairs and counts), the reading's own
    errors told apart from the text's."""
    utf8 = codecs.getincrementaldecoder("utf-8")()
    try:
        for chunk in chunks:
            if not chunk.isascii() or utf8.getstate()[0]:
                utf8.decode(chunk)
            yield chunk
    except InputError as error:
        raise _ReadError(error) from None
    utf8.decode(b"", final=True)


def _stream(path: Path, chunks: Iterator[bytes], frames: EventFrames) -> tuple[dict[str, msgspec.Raw], int]:
    text, size = bytearray(), 0
    for chunk in chunks:  # the header, up to the events array's `[`
        text += chunk
        size += len(chunk)
        found = _LEGACY.match(text)  # a bare event array: no header
        if found is None:
            key = text.find(b'"traceEvents"')
            found = EVENTS_KEY.match(text, key) if key >= 0 else None
        if found is not None:
            break
        if len(text) > _HEADER_BYTES or (key >= 0 and len(text) - key > _KEY_BYTES):
            raise _Unusual
    else:
        raise _Unusual
    head = None if found.re is _LEGACY else bytes(text[: found.end() - 1])
    del text[: found.end()]
    offset, at, target = 0, 0, PIECE_BYTES  # events before the piece, where it starts, its size at least
    failed = 0  # cuts of this piece that did not decode
    while True:
        cut = next_cut(text, at + target, len(text)) if len(text) - at > target else None
        if cut is None:
            chunk = next(chunks, None)
            if chunk is None:
                break
            del text[:at]  # (once a chunk: the pieces before it are done)
            if _NOT_BLANK.search(text) is None:  # blanks between elements: nothing to keep (a gzip of blanks)
                text.clear()
            text += chunk
            size += len(chunk)
            at = 0
            continue
        piece = b"".join((b"[", text[at : cut[0]], b"]"))
        try:
            events = kineto.EVENTS.decode(piece)
        except msgspec.DecodeError:  # a cut inside a string or an object: the next cut on, then further
            failed += 1
            target = cut[1] - at if failed < _NEXT_CUTS_TRIED else 2 * target
            continue
        frames.add(offset, piece, events)
        offset += len(events)
        at, target, failed = cut[1], PIECE_BYTES, 0
        del piece, events
    end = len(text)
    for _ in range(
        _ENDS_TRIED
    ):  # the array's `]`: the last one before which it decodes, after which the top level closes
        end = text.rfind(b"]", at, end)
        if end < 0:
            break
        metadata = _around(path, head, bytes(text[end + 1 :]))
        if metadata is None:
            continue
        piece = b"".join((b"[", text[at:end], b"]"))
        try:
            events = kineto.EVENTS.decode(piece)
        except msgspec.DecodeError:
            continue
        frames.add(offset, piece, events)
        return metadata, size
    raise _Unusual


def _around(path: Path, head: bytes | None, tail: bytes) -> dict[str, msgspec.Raw] | None:
    """The top level around the events array (None: not this way round); a bare array has none."""
    if head is None:
        return {} if _NOT_BLANK.search(tail) is None else None
    return around_events(path, head, tail)
