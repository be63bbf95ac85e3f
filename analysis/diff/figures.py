"""The figures of one analysed run that a diff compares, each with its value in every analysed step where
the stored tables hold one (docs/numbers.md#diff).

Per step: the step time (summary.json `replayed_steps`), bubble_measured and bubble_seed (ranks.parquet,
over the summary's pipeline), each part per rank (ranks.parquet), the critical path's ms per part and
stage (critical.parquet) and the peak activations per rank (memory_peaks.parquet). One value per run:
bubble_formula, the waterfall's rungs (fixed and Shapley), the straggler, and with the isolated
calibration each rank's compute and small_gemm (the calibration's times of its cells).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.results import Analysis
from analysis.schema import MIB, Summary
from analysis.traces.memory import best_peaks
from analysis.vocabulary import RUNGS, Part

MS, FRACTION, BYTES = "ms", "fraction", "bytes"  # a figure's unit


def shown(value: float | None, unit: str, signed: bool = False, missing: str = "-") -> str:
    """A figure's value in its unit, as the CLI, the markdown and the diff page print it."""
    if value is None:
        return missing
    sign = "+" if signed else ""
    if unit == MS:
        return f"{value:{sign}.3f} ms"
    if unit == BYTES:
        return f"{value / MIB:{sign}.2f} MiB"
    return f"{value:{sign}.4f}"


def place(rank: int | None, stage: int | None) -> str:
    """Where a figure belongs: its rank and stage, or the whole step."""
    places = [f"rank {rank}" if rank is not None else "", f"stage {stage}" if stage is not None else ""]
    return ", ".join(p for p in places if p) or "step"


STEP_TIME = "step_time"  # summary.json's step_time_ms: the names drop the unit, as a part's do
BUBBLES = ("bubble_measured", "bubble_seed")
BUBBLE_FORMULA = "bubble_formula"
PEAK = "peak_activation_bytes"
STRAGGLER = "straggler"  # summary.json straggler.slower_ms
SHAPLEY = "shapley."  # + a rung: waterfall_shapley_ms's
CRITICAL = "critical_path."  # + a part or "hop": the critical path's ms of it
HOP = "hop"  # the critical path's transfers (summary.json critical_path)
PART_NAMES = tuple(part.value for part in Part)
# Why a figure has one value per run, not one per step: nothing to measure its spread with.
ONE_VALUE = "one value per run, no steps to measure its spread"
CALIBRATED = "the run's calibration times it once per run: no steps to measure its spread"
# Every name a diff can show, for the rules that pick figures by name.
NAMES = (
    STEP_TIME,
    *BUBBLES,
    BUBBLE_FORMULA,
    *PART_NAMES,
    PEAK,
    STRAGGLER,
    *RUNGS,
    *(SHAPLEY + rung for rung in RUNGS),
    *(CRITICAL + part for part in (*PART_NAMES, HOP)),
)


def unit_of(name: str) -> str:
    return FRACTION if name in (*BUBBLES, BUBBLE_FORMULA) else BYTES if name == PEAK else MS


@dataclass(frozen=True)
class Figure:
    name: str
    rank: int | None
    stage: int | None
    unit: str
    values: tuple[float, ...]  # one per analysed step, in step order
    once: str | None = None  # why the run has one value of it, not one per step; None: per step


def pipeline_ranks(summary: Summary) -> list[int]:
    """The ranks of the pipeline whose figures summary.json holds (the slowest: its step alone is the
    longest, analysis.job.join), in stage order."""
    if not summary.pipelines:
        return [entry.rank for entry in sorted(summary.ranks, key=lambda entry: min(entry.stage_ids))]
    return max(summary.pipelines, key=lambda pipeline: pipeline.step_time_alone_ms).ranks


def whole_step(analysis: Analysis) -> list[Figure]:
    """The figures of the whole step (no rank, no stage)."""
    summary = analysis.summary
    steps = sorted(analysis.summary.replayed_steps, key=lambda replayed: replayed.step)
    found = [Figure(STEP_TIME, None, None, MS, tuple(s.step_time_ms for s in steps))]
    chosen = analysis.parts.filter(pl.col("rank").is_in(pipeline_ranks(summary)))
    work = {
        "bubble_measured": pl.col("busy_ms"),
        "bubble_seed": pl.col("compute_ms") + pl.col("small_gemm_ms"),
    }
    for name, busy in work.items():
        per_step = (
            chosen.group_by("step")
            .agg(busy=busy.sum(), step_ms=pl.col("step_ms").max(), missing=busy.is_null().any())
            .sort("step")
        )
        if not per_step.is_empty() and not per_step["missing"].any():
            bubble = 1 - per_step["busy"] / (summary.p * per_step["step_ms"])
            found.append(Figure(name, None, None, FRACTION, tuple(bubble.to_list())))
    found.append(Figure(BUBBLE_FORMULA, None, None, FRACTION, (summary.bubble_formula,), ONE_VALUE))
    if summary.straggler is not None:
        found.append(Figure(STRAGGLER, None, None, MS, (summary.straggler.slower_ms,), ONE_VALUE))
    for prefix, ladder in (("", summary.waterfall_ms), (SHAPLEY, summary.waterfall_shapley_ms)):
        for rung in RUNGS:
            value = getattr(ladder, rung)
            if value is not None:  # unknown without the isolated calibration
                found.append(Figure(prefix + rung, None, None, MS, (value,), ONE_VALUE))
    return found


def per_rank(analysis: Analysis) -> dict[int, list[Figure]]:
    """Rank -> its parts and its peak activations, per step; `stage` left for the matching to set."""
    found: dict[int, list[Figure]] = {}
    parts = analysis.parts.sort("rank", "step")
    # With the isolated calibration, compute and small_gemm are its times of the rank's cells: the same
    # in every step (without it, compute is all the busy time, measured per step).
    calibrated = not parts["small_gemm_ms"].is_null().any()
    for (rank,), rows in parts.group_by("rank", maintain_order=True):
        figures = found.setdefault(rank, [])
        for part in PART_NAMES:
            column = rows[f"{part}_ms"]
            once = CALIBRATED if calibrated and part in (Part.COMPUTE, Part.SMALL_GEMM) else None
            if not column.is_null().any():  # small_gemm, slowdown: unknown without the calibration
                figures.append(Figure(part, rank, None, MS, tuple(column.to_list()), once))
    if analysis.memory is not None and not analysis.memory.peaks.is_empty():
        for (rank,), rows in best_peaks(analysis.memory.peaks).group_by("rank", maintain_order=True):
            values = tuple(float(v) for v in rows.sort("step")["peak_bytes"])
            found.setdefault(rank, []).append(Figure(PEAK, rank, None, BYTES, values))
    return found


def critical_path(analysis: Analysis, by_stage: bool) -> list[Figure]:
    """The critical path's ms of each part (and stage, `by_stage`) in every analysed step (0 in a step
    whose path has none of it)."""
    critical = analysis.critical.with_columns(ms=(pl.col("end_ns") - pl.col("start_ns")) / 1e6)
    keys = ["part", "stage"] if by_stage else ["part"]
    steps = critical.select(pl.col("step").unique().sort())
    found = []
    for key, rows in critical.group_by(keys, maintain_order=True):
        per_step = steps.join(rows.group_by("step").agg(pl.col("ms").sum()), on="step", how="left")
        values = tuple(per_step["ms"].fill_null(0.0).to_list())
        found.append(Figure(CRITICAL + str(key[0]), None, key[1] if by_stage else None, MS, values))
    return found


def none_of(figure: Figure, steps: int) -> Figure:
    """`figure` (a critical path's) in a run whose paths hold none of it: 0 in each of its `steps`."""
    return Figure(figure.name, figure.rank, figure.stage, figure.unit, (0.0,) * steps)
