"""The one error class for bad input. The CLI prints it as one line and exits 2; anything else is a bug."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """A file or directory the toolkit cannot use, with the path and the problem in one line."""

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path is not None else problem)
