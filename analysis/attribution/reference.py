"""The one rule for reference durations: how long each (stage, kind) takes per microbatch at full-batch
efficiency. The per-cell small-GEMM excess, the waterfall and the ideal timeline all use it.

Calibrated (run.json `calibration`, each stage's forward and backward timed on the whole batch in one
piece): that time divided by m. A split backward (I, W) without its own calibration takes the
calibrated B in the ratio of the measured I and W. Uncalibrated: the median measured duration of the
(stage, kind), blocked time excluded, stands in, and the small-GEMM term is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from runners.schedules import COMPUTE_KINDS


@dataclass(frozen=True)
class Reference:
    """Per (stage, kind) duration of one microbatch in ns at reference efficiency."""

    ns: dict[tuple[int, str], float]
    calibrated: bool


def busy_ns() -> pl.Expr:
    """A cell's measured duration: its span less the time it was blocked on a peer."""
    return pl.col("end_ns") - pl.col("start_ns") - pl.col("blocked_ns")


def reference(cells: pl.DataFrame, calibration: dict | None, m: int) -> Reference:
    """Reference durations for the (stage, kind) pairs the cells hold."""
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
    medians = {
        (stage, kind): float(ns)
        for stage, kind, ns in compute.group_by("stage", "kind").agg(busy_ns().median()).iter_rows()
    }
    stages = {stage for stage, _ in medians}
    if not calibration or any(str(stage) not in calibration for stage in stages):
        return Reference(medians, calibrated=False)
    ns = {}
    for (stage, kind), median in medians.items():
        calibrated = calibration[str(stage)]
        if f"{kind}_ms" in calibrated:
            ns[(stage, kind)] = calibrated[f"{kind}_ms"] * 1e6 / m
        else:
            halves = medians.get((stage, "I"), 0.0) + medians.get((stage, "W"), 0.0)
            ns[(stage, kind)] = calibrated["B_ms"] * 1e6 / m * (median / halves if halves else 0.5)
    return Reference(ns, calibrated=True)
