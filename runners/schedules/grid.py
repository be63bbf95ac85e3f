"""The step x rank text grid, torch.distributed.pipelining's picture of a schedule.

Without a timeline, row k is each rank's k-th action. With one, rows are time: a row per distinct start
time, each cell the actions a rank starts then, so idle ranks show as blanks (the bubble). Marked cells
(rank, step) are bracketed and their rows flagged, which is how errors point at the failing step.
"""

from __future__ import annotations

from collections.abc import Collection

from .schedule import Schedule
from .timeline import Timeline


def _render(header: list[str], rows: list[tuple[str, list[str], bool]]) -> str:
    cells = [header] + [[label, *row] for label, row, _ in rows]
    widths = [max(len(line[c]) for line in cells) for c in range(len(header))]
    flags = ["  "] + [">>" if flagged else "  " for _, _, flagged in rows]
    return "\n".join(
        (flag + " " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths))).rstrip()
        for flag, line in zip(flags, cells)
    )


def _step_rows(schedule: Schedule, marks: Collection[tuple[int, int]]) -> list[tuple[str, list[str], bool]]:
    n_steps = max((len(order) for order in schedule.orders), default=0)
    rows = []
    for k in range(n_steps):
        row = []
        for r, order in enumerate(schedule.orders):
            text = str(order[k]) if k < len(order) else ""
            row.append(f"[{text}]" if (r, k) in marks else text)
        rows.append((str(k), row, any((r, k) in marks for r in range(schedule.p))))
    return rows


def _time_rows(schedule: Schedule, timeline: Timeline) -> list[tuple[str, list[str], bool]]:
    starts: dict[float, list[list[str]]] = {}
    for rank, action, start, _ in timeline.rows:
        starts.setdefault(start, [[] for _ in range(schedule.p)])[rank].append(str(action))
    return [(f"{t:g}", [",".join(cell) for cell in starts[t]], False) for t in sorted(starts)]


def grid(
    schedule: Schedule, timeline: Timeline | None = None, marks: Collection[tuple[int, int]] = ()
) -> str:
    """The schedule as text: one column per rank, one row per step (or per start time with a timeline)."""
    header = ["step" if timeline is None else "time"] + [f"rank {r}" for r in range(schedule.p)]
    rows = _step_rows(schedule, marks) if timeline is None else _time_rows(schedule, timeline)
    return f"{schedule.name} p={schedule.p} m={schedule.m} v={schedule.v}\n" + _render(header, rows)
