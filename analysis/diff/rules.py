"""`--fail-on`: the changes a CI refuses (docs/guide.md#diff).

A rule is `NAME:+AMOUNT` (an increase beyond AMOUNT breaks it) or `NAME:-AMOUNT` (a decrease beyond
it), NAME a figure's name (analysis.diff.figures.NAMES), AMOUNT `2ms` (a figure in ms), `5%` (of A's
value) or a bare number (a fraction or bytes). Only a significant change breaks a rule, at any rank or
stage of that figure. Rules are comma-separated, or `@FILE`: one a line, `#` comments and blank lines
skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from analysis.diff.compare import Change
from analysis.diff.figures import MS, NAMES, unit_of
from analysis.errors import InputError

FLAG = "--fail-on"
_RULE = re.compile(r"^(?P<name>[\w.]+):(?P<sign>[+-])(?P<amount>\d+(?:\.\d*)?|\.\d+)(?P<unit>ms|%)?$")


@dataclass(frozen=True)
class Rule:
    text: str
    name: str
    increase: bool  # True: an increase beyond the amount breaks it; False: a decrease
    amount: float
    unit: str | None  # "ms", "%", or None: the figure's own unit

    def broken_by(self, change: Change) -> bool:
        if not change.significant or change.name != self.name:
            return False
        limit = self.amount * abs(change.a) / 100 if self.unit == "%" else self.amount
        return change.delta > limit if self.increase else change.delta < -limit


def parse(text: str, source: str | Path = FLAG) -> Rule:
    """One rule; InputError naming `source` (the flag, or the file) and the rule."""
    found = _RULE.match(text.strip())
    if found is None:
        raise InputError(
            source, f"not a rule {text.strip()!r}: NAME:+AMOUNT or NAME:-AMOUNT, AMOUNT as 2ms, 5% or 0.02"
        )
    name = found["name"]
    if name not in NAMES:
        raise InputError(source, f"rule {text.strip()!r}: no figure {name!r}; known: {', '.join(NAMES)}")
    unit = found["unit"]
    if unit != "%" and (unit == MS) != (unit_of(name) == MS):
        form = "2ms" if unit_of(name) == MS else "a bare number"
        raise InputError(
            source, f"rule {text.strip()!r}: {name} is in {unit_of(name)}: its amount as {form} or %"
        )
    return Rule(text.strip(), name, found["sign"] == "+", float(found["amount"]), unit)


def read_rules(argument: str) -> list[Rule]:
    """The rules of `--fail-on`: inline, comma-separated, or `@FILE`."""
    if not argument.startswith("@"):
        rules = [parse(text) for text in argument.split(",") if text.strip()]
    else:
        path = Path(argument[1:])
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise InputError(path, f"cannot read the rules ({type(error).__name__})") from None
        rules = [parse(line, path) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not rules:
        raise InputError(FLAG, f"no rules in {argument!r}")
    return rules


def broken(changes: list[Change], rules: list[Rule]) -> list[tuple[Rule, Change]]:
    """Each rule with each significant change that breaks it."""
    return [(rule, change) for rule in rules for change in changes if rule.broken_by(change)]
