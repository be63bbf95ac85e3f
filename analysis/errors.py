"""The one error class for bad input. The CLI prints it as one line and exits 2; anything else is a bug.

File names and text taken from a trace (labels, keys) are untrusted: `printable` escapes the characters
that could break the line or disguise it (control characters such as a newline, which would let a
crafted input forge a second `error:` line; Unicode line separators and bidirectional overrides; lone
surrogates from undecodable file names), so every message stays one line that says what it contains.
"""

from __future__ import annotations

import re
from pathlib import Path

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match) -> str:
    char = found[0]
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def printable(text: object) -> str:
    """`text` as one line: control, invisible-format and unpaired surrogate characters as escapes."""
    return _UNSAFE.sub(_escape, str(text))


class InputError(Exception):
    """A file or directory the toolkit cannot use, with the path and the problem in one line."""

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else Path(path)
        self.problem = printable(problem)
        where = None if self.path is None else printable(self.path)
        super().__init__(f"{where}: {self.problem}" if where is not None else self.problem)

    def __reduce__(self):
        # As it was made, so that an error raised in a worker process comes back the same.
        return type(self), (self.path, self.problem)


class LimitExceeded(InputError):
    """Input past one of the limits of analysis.traces.limits; the problem names the limit and its flag."""


class TraceWarning(UserWarning):
    """Usable input with something dropped or assumed; the message names the file."""


class NotAPipeline(InputError):
    """A job whose traces show no pipeline: no send/recv between ranks and no pipeline labels
    (analysis.trust.gate). The report lists it as what it is, not as a failed analysis."""
