"""The pairs of runs a report compares unasked: each sweep's neighbours, one m to the next.

A sweep is one family, (schedule, p, v, engine, device), measured at several m, as the report's sweep
charts group runs (analysis.report.sweeps); where an m was measured more than once, the run of median
step time stands for it (the lower one of an even count), as on those charts, so the diff page of a
neighbour pair shows the runs the sweep chart plots.
"""

from __future__ import annotations

from collections import defaultdict

from analysis.schema import Summary


def _family(summary: Summary) -> tuple:
    return summary.schedule, summary.p, summary.v, summary.engine, summary.device


def _median_run(repeats: list[tuple[str, Summary]]) -> str:
    ordered = sorted(repeats, key=lambda run: (run[1].step_time_ms, run[0]))
    return ordered[(len(ordered) - 1) // 2][0]


def sweep_neighbours(runs: list[tuple[str, Summary]]) -> list[tuple[str, str]]:
    """(A, B) run ids for each family's consecutive measured m, A at the smaller m; `runs`: each whole
    analysed run's id and summary."""
    by_family: dict[tuple, dict[int, list[tuple[str, Summary]]]] = defaultdict(lambda: defaultdict(list))
    for run_id, summary in runs:
        by_family[_family(summary)][summary.m].append((run_id, summary))
    pairs = []
    for by_m in by_family.values():
        chosen = [_median_run(by_m[m]) for m in sorted(by_m)]
        pairs += list(zip(chosen, chosen[1:]))
    return pairs
