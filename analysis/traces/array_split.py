"""Cut the text of a JSON array of objects into pieces of whole elements, without parsing it.

Decoding a trace's event array piece by piece keeps only one piece's Python objects alive at a time
(the whole array as objects is ~3x its text). A cut is placed at the first `}`, `,`, `{` (with any
whitespace) after the target size. Such bytes can also occur inside a string or between nested objects;
a cut there leaves an unclosed string or object in the piece before it, so that piece is not valid JSON
on its own. The caller decodes `[` + piece + `]`: if every piece decodes, every cut was between
elements (each piece starts where the previous one ended cleanly), and if one does not, the caller
decodes the whole array instead.
"""

from __future__ import annotations

import re

_BETWEEN_OBJECTS = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_WHITESPACE = b" \t\r\n"


def array_pieces(text: memoryview, size: int) -> list[tuple[int, int]] | None:
    """(start, end) byte ranges covering the array's elements in order, each about `size` bytes (the
    commas between pieces left out); None when `text` is not bracketed as `[...]`."""
    head, tail = bytes(text[:64]), bytes(text[-64:])  # a longer run of blanks just means no pieces
    first = len(head) - len(head.lstrip(_WHITESPACE))
    last = len(text) - (len(tail) - len(tail.rstrip(_WHITESPACE)))
    if last - first < 2 or text[first : first + 1] != b"[" or text[last - 1 : last] != b"]":
        return None
    start, end = first + 1, last - 1
    pieces = []
    while True:
        cut = next_cut(text, start + size, end) if end - start > size else None
        if cut is None:
            pieces.append((start, end))
            return pieces
        pieces.append((start, cut[0]))
        start = cut[1]


def next_cut(text: memoryview | bytes | bytearray, position: int, end: int) -> tuple[int, int] | None:
    """The first cut from `position` up to `end`: (where the piece before it ends, where the next
    starts), or None."""
    cut = _BETWEEN_OBJECTS.search(text, position, end)
    return None if cut is None else (cut.start() + 1, cut.end() - 1)
