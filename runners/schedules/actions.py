"""The action IR: one value per thing a rank does, with torch.distributed.pipelining's string form.

`Action(stage=1, kind=Kind.F, microbatch=3)` prints as `1F3` and `Action.parse("1F3")` gives it back,
so the labels in our traces (`PP:1F3`) and in torchtitan's parse with one function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    F = "F"  # forward of one microbatch through one stage
    B = "B"  # full backward (input and weight gradients)
    I = "I"  # backward, input gradient only (zero-bubble split)  # noqa: E741
    W = "W"  # backward, weight gradient only (zero-bubble split)
    SEND_F = "SEND_F"  # send the forward activation to the next stage
    RECV_F = "RECV_F"  # receive the forward activation from the previous stage
    SEND_B = "SEND_B"  # send the input gradient to the previous stage
    RECV_B = "RECV_B"  # receive the output gradient from the next stage

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE

    @property
    def is_comm(self) -> bool:
        return not self.is_compute

    def __str__(self) -> str:
        return self.value


COMPUTE = frozenset({Kind.F, Kind.B, Kind.I, Kind.W})
# The kinds as the strings that label traces and fill the analysis's `kind` column.
COMPUTE_KINDS = tuple(kind.value for kind in Kind if kind in COMPUTE)
COMM_KINDS = tuple(kind.value for kind in Kind if kind not in COMPUTE)

# Longest alternatives first so "RECV_F" is not read as "R" + ...
_ACTION_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


class ActionParseError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        match = _ACTION_RE.match(text.strip())
        if match is None:
            raise ActionParseError(f"not a pipeline action: {text!r} (expected e.g. '0F3' or '1RECV_B0')")
        stage, kind, microbatch = match.groups()
        return cls(int(stage), Kind(kind), int(microbatch))
