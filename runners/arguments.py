"""Command lines read strictly, and refused in one line (torch-free; the analysis's commands share it).

argparse's own refusal is a usage block of several lines, and `int`/`float` take more than a number
as a user writes one: `1_000`, ` 7`, `+3`, Arabic-Indic digits, and `float` also `1e20`, `inf`, `nan`.
Here a whole number is ASCII digits, a decimal ASCII digits with at most one point, a switch 1 or 0;
anything else is refused naming the option and the text, before any work.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import NoReturn

_WHOLE = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusal is `error: <problem>` on one line and exit 2 (the error contract)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {' '.join(message.split())}\n")
        sys.exit(2)


def whole_number(text: str) -> int:
    """A whole number >= 0 as digits alone: `8`, not `8.0`, `1e3`, `+8`, `yes`."""
    if not _WHOLE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    digits = text.lstrip("0")
    if len(digits) > sys.get_int_max_str_digits():  # int() refuses them; every limit is far below
        raise argparse.ArgumentTypeError(f"a number of {len(digits):,} digits is past every limit")
    return int(text)


def decimal(text: str) -> float:
    """A number >= 0 written in decimals: `512`, `0.5`, not `1e20`, `inf`, `nan`, `-1`."""
    if not _DECIMAL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a number written in decimals: {text!r}")
    value = float(text)
    if not math.isfinite(value):  # 400 digits or more are past a double
        raise argparse.ArgumentTypeError(f"a number of {len(text):,} digits is past every limit")
    return value


def switch(text: str) -> bool:
    """A switch's value as make passes it (DP_OVERLAP=1): 1 or 0, nothing else (`yes` is no 1)."""
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"1 or 0, not {text!r}")
    return text == "1"


# An option that is on alone (--dp-overlap) or says 1 or 0 (--dp-overlap 0, as the Makefile passes it).
SWITCH = {"nargs": "?", "const": True, "default": False, "type": switch, "metavar": "1|0"}
