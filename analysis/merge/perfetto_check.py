"""Is a Chrome JSON trace one that Perfetto shows as written? The checks the merge tests rely on.

Perfetto quietly moves a slice that overlaps its neighbour without nesting to an overflow track, drops a
flow whose other end is missing, and joins two flows that share an id into one. Each check here finds
one of those before a reader is misled by it. `problems(trace)` returns one line per kind of problem
(empty: valid); timestamps are compared in integer nanoseconds, as Perfetto stores them.
"""

from __future__ import annotations

from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal

import polars as pl

_FLOW_PHASES = ("s", "t", "f")
_WHOLE_NS_LIMIT_US = 2.0**43


def problems(trace: dict) -> list[str]:
    """Every way `trace` (a decoded Chrome JSON trace) would be shown other than as written."""
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    slices = _slices(events)
    return [*_nesting_problems(slices), *_flow_problems(events, slices), *_process_problems(events)]


def _ns(microseconds) -> int:
    """Integer ns from Chrome's microseconds: a float where it names every ns, else the exact decimal
    (load the trace with parse_float=Decimal to check a merge whose times pass 2**43 us)."""
    if isinstance(microseconds, float) and abs(microseconds) < _WHOLE_NS_LIMIT_US:
        return round(microseconds * 1000)
    return int((Decimal(str(microseconds)) * 1000).to_integral_value(ROUND_HALF_EVEN))


def _slices(events: list[dict]) -> pl.DataFrame:
    rows = [
        (str(e["pid"]), str(e["tid"]), _ns(e["ts"]), _ns(e["ts"]) + _ns(e.get("dur", 0)))
        for e in events
        if e.get("ph") == "X"
    ]
    schema = {"pid": pl.String, "tid": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row").sort(
        ["pid", "tid", "start_ns", "end_ns"], descending=[False, False, False, True]
    )


def _nesting_problems(slices: pl.DataFrame) -> list[str]:
    bad = [
        f"{key}: {count} slice(s) overlap a slice on their track without nesting in it"
        for key, count in sorted(_partial_overlaps(slices).items())
    ]
    negative = slices.filter(pl.col("end_ns") < pl.col("start_ns")).height
    return bad + ([f"{negative} slice(s) with negative duration"] if negative else [])


def _partial_overlaps(slices: pl.DataFrame) -> Counter:
    """Per (pid, tid), how many slices start inside an open slice but end after it.

    A stack walk over the sorted starts: the one check here that is inherently sequential.
    """
    counts: Counter = Counter()
    for (pid, tid), track in slices.group_by(["pid", "tid"], maintain_order=True):
        open_ends: list[int] = []
        for start, end in zip(track["start_ns"].to_list(), track["end_ns"].to_list()):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            if open_ends and end > open_ends[-1]:
                counts[f"pid {pid} tid {tid}"] += 1
            else:
                open_ends.append(end)
    return counts


def _flow_problems(events: list[dict], slices: pl.DataFrame) -> list[str]:
    flows = [e for e in events if e.get("ph") in _FLOW_PHASES]
    if not flows:
        return []
    phases_by_id: dict[str, list[str]] = {}
    for e in flows:
        phases_by_id.setdefault(str(e.get("id")), []).append(e["ph"])
    counts = Counter(
        "has no start" if "s" not in phases else "has no end" if "f" not in phases else "collides"
        for phases in phases_by_id.values()
        if phases.count("s") != 1 or phases.count("f") != 1
    )
    out = [f"{n} flow id(s) {what}" for what, n in sorted(counts.items())]
    unbound = _unbound_flow_ends(flows, slices)
    return out + ([f"{unbound} flow end(s) not inside any slice on their track"] if unbound else [])


def _unbound_flow_ends(flows: list[dict], slices: pl.DataFrame) -> int:
    """Flow ends that no slice on their (pid, tid) track encloses: Perfetto cannot attach them.

    Some slice starting at or before t contains t exactly when the latest end among those slices
    reaches t, so one as-of join against the running maximum of ends answers it for every flow end.
    """
    ends = pl.DataFrame(
        [(str(e["pid"]), str(e["tid"]), _ns(e["ts"])) for e in flows],
        schema={"pid": pl.String, "tid": pl.String, "start_ns": pl.Int64},
        orient="row",
    ).sort("start_ns")
    reach = slices.with_columns(pl.col("end_ns").cum_max().over(["pid", "tid"]).alias("reach_ns")).sort(
        "start_ns"
    )
    bound = ends.join_asof(
        reach.select("pid", "tid", "start_ns", "reach_ns"),
        on="start_ns",
        by=["pid", "tid"],
        check_sortedness=False,
    )
    return bound.filter(pl.col("reach_ns").is_null() | (pl.col("reach_ns") < pl.col("start_ns"))).height


def _process_problems(events: list[dict]) -> list[str]:
    named = Counter(e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name")
    used = {e["pid"] for e in events if e.get("ph") in ("X", *_FLOW_PHASES)}
    twice = sorted(str(pid) for pid, n in named.items() if n > 1)
    unnamed = sorted(str(pid) for pid in used - named.keys())
    return ([f"pid(s) named twice: {', '.join(twice)}"] if twice else []) + (
        [f"pid(s) without a process_name: {', '.join(unnamed)}"] if unnamed else []
    )
