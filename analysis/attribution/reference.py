"""The one rule for reference durations: how long each compute cell's work takes at full-batch efficiency
(`full`) and in isolation at the cell's own microbatch size (`isolated`). The per-cell split of busy
time, the waterfall and the ideal timeline all use it.

From run.json: `calibration` holds each stage's forward and backward timed on the whole batch in one
piece; a microbatch's full-batch share is that divided by m. `calibration_by_rows` holds the same work
timed in isolation on one microbatch of r rows, for the row counts the runner calibrates (those of
m = 1, 2, 4, ..., 32 and the run's own m); a cell's isolated time is the entry of its microbatch's rows
(run.json dims.microbatch_rows). A split backward (I, W) without times of its own takes B's in the
ratio of the measured I and W. Without calibration the median measured busy time of each (stage, kind)
stands in for `full`; without the isolated times `isolated` is unknown, and so are small_gemm and
slowdown.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from runners.schedules import COMPUTE_KINDS

# One row per (stage, kind, microbatch) of the cells: its full-batch share and isolated time, ns.
REFERENCE_SCHEMA = {
    "stage": pl.Int64,
    "kind": pl.Utf8,
    "microbatch": pl.Int64,
    "full_ns": pl.Float64,
    "isolated_ns": pl.Float64,
}


@dataclass(frozen=True)
class Reference:
    """Reference durations of every compute (stage, kind, microbatch) in ns; `isolated_ns` null where
    unknown."""

    table: pl.DataFrame  # REFERENCE_SCHEMA
    calibrated: bool  # full_ns from run.json's calibration (else the measured medians)

    @property
    def isolated(self) -> bool:
        return self.table.height > 0 and self.table["isolated_ns"].null_count() == 0

    def full(self) -> dict[tuple[int, str], float]:
        """(stage, kind) -> full-batch share per microbatch (the same for every microbatch)."""
        per_kind = self.table.group_by("stage", "kind").agg(pl.col("full_ns").mean())
        return {(stage, kind): ns for stage, kind, ns in per_kind.iter_rows()}

    def isolated_medians(self) -> dict[tuple[int, str], float]:
        """(stage, kind) -> the median over its microbatches of their work timed alone."""
        per_kind = self.table.group_by("stage", "kind").agg(pl.col("isolated_ns").median())
        return {(stage, kind): ns for stage, kind, ns in per_kind.iter_rows()}


def _split_backward(times: dict, kind: str, median: float, medians: dict, stage: int) -> float | None:
    """A kind's time from `times` (a calibration entry, ms): its own, else B's split in the measured I:W ratio."""
    if f"{kind}_ms" in times:
        return times[f"{kind}_ms"]
    halves = medians.get((stage, "I"), 0.0) + medians.get((stage, "W"), 0.0)
    return None if "B_ms" not in times else times["B_ms"] * (median / halves if halves else 0.5)


def reference(cells: pl.DataFrame, config: dict | None, m: int) -> Reference:
    """Reference durations for the compute cells (with their busy_ns: analysis.attribution.parts);
    `config` is run.json (or None)."""
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
    medians = {
        (stage, kind): float(ns)
        for stage, kind, ns in compute.group_by("stage", "kind").agg(pl.col("busy_ns").median()).iter_rows()
    }
    keys = compute.select("stage", "kind", "microbatch").unique().sort("stage", "kind", "microbatch")
    rows = ((config or {}).get("dims") or {}).get("microbatch_rows")
    return reference_at(list(keys.iter_rows()), medians, config, m, rows)


def reference_at(
    keys: list[tuple[int, str, int]], medians: dict[tuple[int, str], float], config: dict | None, m: int, rows
) -> Reference:
    """Reference durations of the compute (stage, kind, microbatch) `keys` of a step of m microbatches
    whose sizes are `rows` (run.json's dims.microbatch_rows, or a prediction's); `medians`: the measured
    busy medians per (stage, kind), which stand in without calibration and split a backward into I, W."""
    config = config or {}
    calibration, by_rows = config.get("calibration") or {}, config.get("calibration_by_rows") or {}
    calibrated = bool(calibration) and all(str(stage) in calibration for stage, _ in medians)
    found = []
    for stage, kind, microbatch in keys:
        median = medians[(stage, kind)]
        full = median
        if calibrated:
            full = _split_backward(calibration[str(stage)], kind, median, medians, stage) * 1e6 / m
        isolated = None
        if calibrated and isinstance(rows, list) and microbatch < len(rows):
            entry = by_rows.get(str(stage), {}).get(str(rows[microbatch]))
            ms = None if entry is None else _split_backward(entry, kind, median, medians, stage)
            isolated = None if ms is None else ms * 1e6
        found.append((stage, kind, microbatch, full, isolated))
    return Reference(pl.DataFrame(found, schema=REFERENCE_SCHEMA, orient="row"), calibrated)
