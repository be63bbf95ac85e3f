"""A trace's top level: its members as undecoded JSON, each key once, without decoding any value.

A JSON object may repeat a key, and readers disagree on which value counts (msgspec and Python keep the
last, others the first): a trace with two `traceEvents` arrays would be analysed as one file and shown
as another. So the members are walked one by one and a repeated key is refused by name. msgspec checks
and skips each value as raw JSON without building it (a value's end is where msgspec finds the
characters after it), so the walk costs one validating pass and no memory beyond the text.

Every msgspec call here can meet nesting deeper than its recursion limit; that is `NESTED_TOO_DEEPLY`.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from analysis.errors import InputError

NESTED_TOO_DEEPLY = "JSON nested too deeply (past the decoder's recursion limit of about 1000 levels)"
_RAW = msgspec.json.Decoder(msgspec.Raw)
_KEY = msgspec.json.Decoder(str)
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_BYTE = re.compile(r"\(byte (\d+)\)")
_BLANK = b" \t\r\n"
_SPACE = re.compile(rb"[ \t\r\n]*")
EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')


class Malformed(Exception):
    """The text is not one JSON object; `problem` says why (msgspec's words, offsets into the file)."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


def shifted_offsets(message: str, offset: int) -> str:
    """msgspec's "(byte N)" of a slice, as an offset into the whole text."""
    return _BYTE.sub(lambda found: f"(byte {int(found[1]) + offset})", message)


def _end_of(decoder: msgspec.json.Decoder, view: memoryview, start: int) -> int:
    """Where the JSON value starting at `start` ends (whitespace after it excluded)."""
    try:
        decoder.decode(view[start:])
    except msgspec.ValidationError as error:  # a subclass of DecodeError: test it first
        raise Malformed(shifted_offsets(str(error), start)) from None
    except msgspec.DecodeError as error:
        found = _TRAILING.search(str(error))
        if found is None:
            raise Malformed(shifted_offsets(str(error), start)) from None
        end = start + int(found[1]) - 1  # msgspec counts the first character after the value, plus one
    else:
        end = len(view)
    while end > start and view[end - 1] in _BLANK:
        end -= 1
    return end


def _skip_blank(data: Any, position: int) -> int:
    return _SPACE.match(data, position).end()


def members(data: Any, start: int = 0, end: int | None = None) -> list[tuple[str, int, int]]:
    """(key, value start, value end) of every member of the object in data[start:end], in order.
    Malformed when it is not one object; RecursionError when nested too deeply."""
    view = memoryview(data)[start:end]
    found: list[tuple[str, int, int]] = []
    position = _skip_blank(view, 0)
    if view[position : position + 1] != b"{":
        raise Malformed("not an object")
    position = _skip_blank(view, position + 1)
    if view[position : position + 1] == b"}":
        return _closed(view, position, found)
    while True:
        if view[position : position + 1] != b'"':
            raise Malformed(f"expected a key (byte {start + position})")
        key_end = _end_of(_KEY, view, position)
        key = _KEY.decode(view[position:key_end])
        colon = _skip_blank(view, key_end)
        if view[colon : colon + 1] != b":":
            raise Malformed(f"expected ':' after a key (byte {start + colon})")
        value = _skip_blank(view, colon + 1)
        if value >= len(view):
            raise Malformed("truncated")
        value_end = _end_of(_RAW, view, value)
        found.append((key, start + value, start + value_end))
        position = _skip_blank(view, value_end)
        separator = view[position : position + 1]
        if separator == b"}":
            return _closed(view, position, found)
        if separator != b",":
            raise Malformed(
                "truncated" if not separator else f"expected ',' or '}}' (byte {start + position})"
            )
        position = _skip_blank(view, position + 1)


def _closed(view: memoryview, position: int, found: list) -> list:
    if _skip_blank(view, position + 1) != len(view):
        raise Malformed("trailing characters after the object")
    return found


def repeated(keys: list[str]) -> str | None:
    """The first key that occurs twice, or None."""
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    return None


def refuse_repeated(path: Any, keys: list[str]) -> None:
    key = repeated(keys)
    if key is not None:
        raise InputError(
            path,
            f"the top-level key {key[:60]!r} appears twice (JSON readers disagree on which one counts; "
            "a trace has each once)",
        )


def around_events(path: Any, head: bytes, tail: bytes) -> dict[str, msgspec.Raw] | None:
    """The top-level members (but traceEvents) of a text that is `head`, ending in `"traceEvents": `,
    an array, and `tail`: checked to be an object around that one value, so if the array decodes the
    whole text is valid JSON and the array is its traceEvents. None when they are not; InputError when
    the head and the tail repeat a key."""
    head, tail = head + b"[]}", b'{"traceEvents":[]' + tail
    try:
        head_members, tail_members = members(head), members(tail)
    except Malformed:
        return None
    head_keys, tail_keys = [m[0] for m in head_members], [m[0] for m in tail_members]
    if head_keys[-1:] != ["traceEvents"] or tail_keys[:1] != ["traceEvents"]:
        return None
    refuse_repeated(path, head_keys + tail_keys[1:])
    metadata = {key: msgspec.Raw(memoryview(head)[a:b]) for key, a, b in head_members[:-1]}
    return metadata | {key: msgspec.Raw(memoryview(tail)[a:b]) for key, a, b in tail_members[1:]}
