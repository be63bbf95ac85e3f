"""From the trace alone (no run.json, or one without the runner's calibration: torchtitan's, Megatron's, a
synthetic GPU run) `from_trace` fills in what is missing and names what that assumes
(vocabulary.Assumption, each figure carrying the names it rests on): without microbatch rows the batch is
split evenly at every m (ROWS_EVEN); without the isolated calibration each (stage, kind)'s measured busy
time per row stands for its time at every size (TIME_PER_ROW), so no slowdown is separated and none is
carried with concurrency (CELLS_AS_MEASURED). At the run's own m on its own orders neither moves the
replay; another schedule or v at the run's m reorders the same cells (CELLS_AS_MEASURED only); at another
m the rows change, and the interval is widened by SIZE_BAND_PER_HALVING per halving or doubling of a
cell's rows, a band whose only source is the seed experiment's published efficiency loss.
"""

from __future__ import annotations

import math
import statistics

from analysis.results import Analysis
from analysis.vocabulary import Assumption
from runners.presets import calibration_rows, microbatch_rows

NS_PER_MS = 1e6
# The size-efficiency band around TIME_PER_ROW. Its source: the seed experiment's published point, its
# GEMMs at 256 rows a microbatch ran about 35% less efficiently than at 8192 (five halvings), taken as a
# factor on a cell's time per row for each halving of its rows, and its inverse for each doubling (the
# band is two-sided: on CPUs smaller microbatches can run faster per row, from cache).
SEED_EFFICIENCY_LOSS, SEED_HALVINGS = 0.35, 5
SIZE_BAND_PER_HALVING = (1 / (1 - SEED_EFFICIENCY_LOSS)) ** (1 / SEED_HALVINGS)  # 1.090
NOMINAL_ROWS = 2**20  # a microbatch's rows at the run's own m where run.json gives none: ratios alone matter


def rows_at(config: dict, m: int) -> list[int]:
    """The rows of each of m microbatches: the run's batch split m ways, or its fixed microbatch size."""
    dims = config.get("dims") or {}
    fixed = config.get("rows_per_microbatch")
    if fixed:
        return [int(fixed)] * m
    return microbatch_rows(sum(dims["microbatch_rows"]), m)


def linear_calibration(analysis: Analysis, config: dict, ms) -> dict:
    """run.json given an isolated calibration made of the run's measured busy times, each linear in rows,
    at the rows of every m of `ms` and the run's own (TIME_PER_ROW, CELLS_AS_MEASURED: no small-GEMM
    effect, no slowdown)."""
    own_m = analysis.schedule.m
    own_rows = statistics.mean(rows_at(config, own_m))
    total = sum(rows_at(config, own_m))
    sizes = {*calibration_rows(total, own_m), *(r for m in ms for r in rows_at(config, m))}
    per_stage: dict[str, dict[str, float]] = {}
    for (stage, kind), ns in analysis.model.busy.items():
        per_stage.setdefault(str(stage), {})[f"{kind}_ms"] = ns / NS_PER_MS / own_rows
    by_rows = {
        stage: {str(r): {k: ms * r for k, ms in kinds.items()} for r in sorted(sizes, reverse=True)}
        for stage, kinds in per_stage.items()
    }
    whole = {stage: {k: ms * total for k, ms in kinds.items()} for stage, kinds in per_stage.items()}
    return config | {
        "calibration": whole,
        "calibration_by_rows": by_rows,
        "calibration_by_rows_samples_ms": {},
    }


def from_trace(analysis: Analysis, config: dict | None, ms) -> tuple[dict, tuple[Assumption, ...]]:
    """run.json (None: there is none) with what the trace alone cannot give filled in, for predictions at
    each of `ms`, and the assumptions that fill it: NOMINAL_ROWS a microbatch at the run's m where it
    names no rows (ROWS_EVEN), linear_calibration where it has no isolated calibration (TIME_PER_ROW,
    CELLS_AS_MEASURED)."""
    config = dict(config or {})
    assumed: list[Assumption] = []
    dims = config.get("dims") or {}
    if not dims.get("microbatch_rows"):  # the run's own: its fixed microbatch size, else NOMINAL_ROWS
        fixed = config.get("rows_per_microbatch")
        config["dims"] = dims | {"microbatch_rows": [fixed or NOMINAL_ROWS] * analysis.schedule.m}
        assumed += [] if fixed else [Assumption.ROWS_EVEN]
    if not config.get("calibration_by_rows"):
        config = linear_calibration(analysis, config, ms)
        assumed += [Assumption.TIME_PER_ROW, Assumption.CELLS_AS_MEASURED]
    return config, tuple(assumed)


def size_band(factor: float) -> float:
    """A cell's time per row at the far end of the size-efficiency band, over its time per row as
    measured, where its rows change by `factor`: SIZE_BAND_PER_HALVING per halving or doubling."""
    return SIZE_BAND_PER_HALVING ** abs(math.log2(factor)) if factor > 0 else 1.0


def rests_on(assumed, executed: bool, own_m: bool, resized: bool) -> list[str]:
    """The names of `assumed` (from_trace's) that a prediction's figures rest on: ROWS_EVEN at another m,
    TIME_PER_ROW where a cell's rows change, CELLS_AS_MEASURED on any order but the executed one."""
    needed = {
        Assumption.ROWS_EVEN: not own_m,
        Assumption.TIME_PER_ROW: resized,
        Assumption.CELLS_AS_MEASURED: not executed,
    }
    return [str(a) for a in assumed if needed.get(a, True)]
