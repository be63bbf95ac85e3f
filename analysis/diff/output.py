"""A diff as the CLI's table, a pull-request comment (markdown) and diff.json.

diff.json: {"a": DIR, "b": DIR, "test": str, "notes": [str], "changes": [{"name", "rank", "stage",
"a_ms", "b_ms", "delta_ms", "low_ms", "high_ms", "significant", "why", "expected_ms"}, ...]} in the
order of analysis.diff.compare.order; a figure not in ms (a fraction, bytes) has the same keys without
`_ms`. low and high are null where the change is untested, and `why` says why; `expected` is the change
the formula (the bubble) or the model (the step) expects where the runs' configurations differ, else
null.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from analysis.diff.compare import EXPECTED_FROM, Change, Diff
from analysis.diff.figures import MS, place, shown
from analysis.diff.significance import TEST
from analysis.diff.stored import STORED_FORMAT, StoredDiff
from analysis.files import write_atomically

MARKDOWN_ROWS = 15  # a pull-request comment shows the largest changes, then says how many more


def _verdict(change: Change) -> str:
    if change.significant:
        return "significant"
    return change.why or "within noise"


def _interval(change: Change) -> str:
    if change.low is None:
        return "-"
    return f"{shown(change.low, change.unit, True)} .. {shown(change.high, change.unit, True)}"


def describe(change: Change) -> str:
    """One change in a line: `--fail-on`'s."""
    return (
        f"{change.name} ({place(change.rank, change.stage)}) {shown(change.delta, change.unit, True)}, "
        f"{shown(change.a, change.unit)} -> {shown(change.b, change.unit)}, interval {_interval(change)}"
    )


def _row(change: Change) -> list[str]:
    expected = (
        ""
        if change.expected is None
        else f" ({EXPECTED_FROM[change.name]} {shown(change.expected, change.unit, True)})"
    )
    return [
        change.name,
        place(change.rank, change.stage),
        shown(change.a, change.unit),
        shown(change.b, change.unit),
        shown(change.delta, change.unit, True) + expected,
        _interval(change),
        _verdict(change),
    ]


HEADER = ["figure", "where", "A", "B", "change", "interval", ""]


def _configuration(found: Diff, side: str) -> str:
    summary = (found.a if side == "a" else found.b).summary
    return (
        f"{summary.schedule} p={summary.p} m={summary.m} v={summary.v} dp={summary.dp}, "
        f"{summary.steps_analyzed} steps analysed"
    )


def table(found: Diff, a: Path, b: Path) -> str:
    """The CLI's table: every change, significant first, largest first."""
    rows = [HEADER] + [_row(change) for change in found.changes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [
        f"A: {a} ({_configuration(found, 'a')})",
        f"B: {b} ({_configuration(found, 'b')})",
        f"test: {TEST}",
    ]
    lines += [f"note: {note}" for note in found.notes]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    significant = sum(change.significant for change in found.changes)
    lines.append(f"{significant} of {len(found.changes)} figures changed beyond the runs' noise")
    return "\n".join(lines)


def markdown(found: Diff, a: Path, b: Path) -> str:
    """A pull-request comment: the configurations, the significant changes (the largest first), the test."""
    significant = [change for change in found.changes if change.significant]
    lines = [
        f"**Pipeline diff**: {len(significant)} of {len(found.changes)} figures changed beyond the runs' noise",
        "",
        f"- A: `{a}` ({_configuration(found, 'a')})",
        f"- B: `{b}` ({_configuration(found, 'b')})",
        *(f"- note: {note}" for note in found.notes),
        "",
    ]
    expected = [change for change in found.changes if change.expected is not None]
    shown = significant[:MARKDOWN_ROWS] + [change for change in expected if not change.significant]
    if shown:
        lines += ["| " + " | ".join(HEADER[:-1]) + " |", "|" + "---|" * (len(HEADER) - 1)]
        lines += ["| " + " | ".join(_row(change)[:-1]) + " |" for change in shown]
    if len(significant) > MARKDOWN_ROWS:
        lines.append(
            f"\n{len(significant) - MARKDOWN_ROWS} more significant changes: `python -m analysis diff`"
        )
    lines += ["", f"<sub>{TEST}</sub>"]
    return "\n".join(lines)


def _entry(change: Change) -> dict:
    suffix = "_ms" if change.unit == MS else ""
    values = {"a": change.a, "b": change.b, "delta": change.delta, "low": change.low, "high": change.high}
    return {
        "name": change.name,
        "rank": change.rank,
        "stage": change.stage,
        **{f"{key}{suffix}": value for key, value in values.items()},
        "significant": change.significant,
        "why": change.why,
        f"expected{suffix}": change.expected,
    }


def document(found: Diff, a: Path, b: Path) -> dict:
    return {
        "a": str(a),
        "b": str(b),
        "test": TEST,
        "notes": found.notes,
        "changes": [_entry(change) for change in found.changes],
    }


def stored(found: Diff, a: Path, b: Path) -> StoredDiff:
    """The diff as B's run directory keeps it for the report (analysis.diff.stored); `a` and `b` are the
    run directories as the report lists them (a link's name, where traces/ holds a link), whose names are
    the run ids."""
    return StoredDiff(STORED_FORMAT, a.name, b.name, str(a), str(b), TEST, found.notes, list(found.changes))


def write_json(path: Path, found: Diff, a: Path, b: Path) -> Path:
    """diff.json, written whole or not at all."""
    write_atomically(path, msgspec.json.format(msgspec.json.encode(document(found, a, b))) + b"\n")
    return path
