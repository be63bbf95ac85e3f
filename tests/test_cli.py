"""The command line's own flags: --debug is accepted before and after the command."""

from __future__ import annotations

import contextlib
import io

import pytest

from analysis.cli import main
from analysis.errors import InputError


@pytest.mark.parametrize("argv", [["--debug", "analyze", "{}"], ["analyze", "{}", "--debug"]])
def test_debug_before_or_after_the_command_shows_the_traceback(tmp_path, argv):
    missing = str(tmp_path / "missing")
    with pytest.raises(InputError, match="not a directory"):
        main([a.format(missing) for a in argv])


def test_without_debug_bad_input_is_one_line(tmp_path):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["analyze", str(tmp_path / "missing")])
    assert (code, err.getvalue()) == (2, f"error: {tmp_path / 'missing'}: not a directory\n")
