"""A progress line on stderr for long work: `NAME: 3/8 (12 s)`.

Shown only where someone watches it: on a terminal once the work has run a second, rewritten in place
and erased at the end (so an error line that follows stands alone); elsewhere (a log, CI) one line per
step once the work has run half a minute. Short work prints nothing.
"""

from __future__ import annotations

import sys
from time import monotonic  # a name of this module's own, so a test's clock replaces it here alone

TERMINAL_AFTER_S = 1.0
LOG_AFTER_S = 30.0


class Progress:
    def __init__(self, name: str, total: int = 0) -> None:
        self.name, self.total, self.done = name, total, 0
        self.began = monotonic()
        self.shown = 0  # characters of the line on the terminal

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_exc) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * self.shown + "\r")
            sys.stderr.flush()

    def done_one(self) -> None:
        self.done += 1
        elapsed = monotonic() - self.began
        terminal = sys.stderr.isatty()
        if elapsed < (TERMINAL_AFTER_S if terminal else LOG_AFTER_S):
            return
        line = f"{self.name}: {self.done}/{self.total} ({elapsed:.0f} s)"
        if terminal:
            sys.stderr.write("\r" + line.ljust(self.shown))
            self.shown = max(self.shown, len(line))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
