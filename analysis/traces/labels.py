"""The numbers in a trace's labels, range-checked once at load, before anything builds on them.

Stage and microbatch numbers of `PP:` labels (`PP:1F3`, `PP:0UNSHARD`, DualPipeV's fused
`PP:(0F1;3B0)OVERLAP_F_B`) and of torch's `Forward i` / `Backward i` labels size the schedule the
analysis builds; a number past the limits (analysis.traces.limits) is refused here, naming the label,
instead of overflowing a 64-bit column or building a schedule of that size later. Step numbers
(`ProfilerStep#N`) must fit 64 bits.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from analysis.errors import InputError, LimitExceeded
from analysis.traces import limits
from analysis.traces.kineto import STEP_PREFIX

_PREFIXES = ("PP:", "Forward ", "Backward ", STEP_PREFIX)
# stage, kind, microbatch (absent for torch's bookkeeping labels), anywhere in a PP: label
_ACTION = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|REDUCE_GRAD|UNSHARD|RESHARD|F|B|I|W)(\d*)")
_TORCH = re.compile(r"^(?:Forward|Backward) (\d+)$")
_STEP = re.compile(r"^" + re.escape(STEP_PREFIX) + r"(\d+)$")
_INT64_DIGITS = 18  # any number of at most 18 digits fits a signed 64-bit integer


def check_label_numbers(path: Path, frame: pl.DataFrame) -> None:
    """InputError naming the first label whose stage, microbatch or step number is out of range."""
    unique = frame["name"].unique()  # names repeat (steps, kernels): the cheapest first cut
    named = unique.str.starts_with(_PREFIXES[0])
    for prefix in _PREFIXES[1:]:
        named |= unique.str.starts_with(prefix)
    names = unique.filter(named)
    current = limits.current()
    for name in names.to_list():
        if name.startswith("PP:"):
            for stage, _, microbatch in _ACTION.findall(name):
                _check(path, name, "stage", stage, current.stages, "stages")
                _check(path, name, "microbatch", microbatch, current.microbatches, "microbatches")
        elif (found := _TORCH.match(name)) is not None:
            _check(path, name, "microbatch", found[1], current.microbatches, "microbatches")
        elif (found := _STEP.match(name)) is not None and len(found[1].lstrip("0")) > _INT64_DIGITS:
            raise InputError(path, f"label {name[:60]!r}: step number out of range (more than 18 digits)")


def _check(path: Path, name: str, what: str, digits: str, limit: int, field: str) -> None:
    if digits and (len(digits.lstrip("0")) > _INT64_DIGITS or int(digits) >= limit):
        shown = digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits)} digits)"
        raise LimitExceeded(
            path, f"label {name[:60]!r}: {what} {shown} is past {limits.current().describe(field)}"
        )
