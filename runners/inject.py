"""Delays injected on purpose, so the analysis can be checked against a known truth (torch-free).

`--inject host:0:20,slow:1:3` (Makefile: INJECT=...), comma-separated:

- `host:R:X`: rank R sleeps X ms before each forward, inside the F's span before its ops: a host stall
  that the isolated calibration does not see: the analysis should find it as launch_overhead on rank
  R (host time inside an action is not work), about m x X a step. R is the global rank: with DP > 1
  it slows one pipeline's rank alone (runners/mesh.py).
- `slow:S:K`: stage S holds K times its layers (K a whole number >= 1), so it does K times the matrix
  work, forward and backward, in the steps and in its calibration alike: real compute that scales,
  which the analysis should find as stage imbalance, not as slowdown. K times the layers is also K
  times the host's dispatch between their ops, which on CPU is launch_overhead (+5 to +37 ms at K=4 on
  the cpu preset), and K times the stage's small-GEMM loss. With --model the stage is K of the
  factory's modules in a row (runners/stage_factory.py).

Checked in the launcher before any process starts (one line per problem) and recorded in run.json as
`injections`, a list of {"kind": "host", "rank": R, "ms": X} and {"kind": "slow", "stage": S,
"factor": K}.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from runners.arguments import decimal, whole_number

KINDS = ("host", "slow")
SYNTAX = "host:RANK:MS or slow:STAGE:FACTOR, comma-separated"


class InjectionError(ValueError):
    """An injection that cannot be honoured; the message is one line."""


@dataclass(frozen=True)
class Injection:
    kind: str  # host | slow
    target: int  # host: the rank; slow: the stage
    amount: float  # host: ms slept before each forward; slow: the factor (whole)

    def __str__(self) -> str:
        amount = int(self.amount) if self.amount == int(self.amount) else self.amount
        return f"{self.kind}:{self.target}:{amount}"

    def as_json(self) -> dict:
        if self.kind == "host":
            return {"kind": "host", "rank": self.target, "ms": self.amount}
        return {"kind": "slow", "stage": self.target, "factor": int(self.amount)}


def _one(text: str) -> Injection:
    parts = text.strip().split(":")
    if len(parts) != 3 or parts[0] not in KINDS:
        raise InjectionError(f"bad injection {text.strip()!r}: write {SYNTAX}")
    kind, target_text, amount_text = parts
    try:
        target = whole_number(target_text)
        amount = decimal(amount_text)
    except argparse.ArgumentTypeError as error:
        raise InjectionError(f"bad injection {text.strip()!r}: write {SYNTAX} ({error})") from None
    if kind == "host" and not amount > 0:
        raise InjectionError(f"bad injection {text.strip()!r}: the stall must be a time in ms > 0")
    if kind == "slow" and not (amount >= 1 and amount == int(amount)):
        raise InjectionError(
            f"bad injection {text.strip()!r}: the factor must be a whole number >= 1 (K times the stage's layers)"
        )
    return Injection(kind, target, amount)


def parse_injections(text: str | None) -> tuple[Injection, ...]:
    """The injections a --inject text names, in its order; each kind and target at most once."""
    if text is None or not text.strip():
        return ()
    found = tuple(_one(item) for item in text.split(","))
    seen: set[tuple[str, int]] = set()
    for injection in found:
        key = (injection.kind, injection.target)
        if key in seen:
            what = "rank" if injection.kind == "host" else "stage"
            raise InjectionError(f"injection {injection.kind} given twice for {what} {injection.target}")
        seen.add(key)
    return found


def injection_problem(injections: tuple[Injection, ...], p: int, n_stages: int, dp: int = 1) -> str | None:
    """Why these injections do not fit a run of dp pipelines of p ranks and n_stages stages, or None when
    they do. A host stall names a global rank (runners/mesh.py), so it can slow one pipeline alone."""
    world, shape = p * dp, f"p={p}" + (f" x DP={dp}" if dp > 1 else "")
    for injection in injections:
        if injection.kind == "host" and injection.target >= world:
            return (
                f"injection {injection}: rank {injection.target} does not exist with {shape} "
                f"(ranks 0..{world - 1})"
            )
        if injection.kind == "slow" and injection.target >= n_stages:
            return (
                f"injection {injection}: stage {injection.target} does not exist "
                f"(this run has {n_stages} stages, 0..{n_stages - 1})"
            )
    return None


def as_text(injections: tuple[Injection, ...]) -> str:
    """The --inject text that parses back to `injections`."""
    return ",".join(str(injection) for injection in injections)


def host_stall_ms(injections: tuple[Injection, ...], rank: int) -> float:
    """Milliseconds rank sleeps before each forward (0: none)."""
    return sum(i.amount for i in injections if i.kind == "host" and i.target == rank)


def layer_factors(injections: tuple[Injection, ...]) -> dict[int, int]:
    """Stage -> how many times its layers it holds (stages not named: 1)."""
    return {i.target: int(i.amount) for i in injections if i.kind == "slow"}
