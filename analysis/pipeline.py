"""One run's analysis from its traces: cells -> clock -> gaps and classes -> parts -> waterfall.

Pure apart from `read_run`, which reads the run directory. The summary is the median step's (the
lower median when the count is even, so it is a step that happened and its parts close exactly).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.timeline import clock
from analysis.cells.labelled import CELL_KEY, RankCells, is_gpu
from analysis.timeline.classify import Rules, classify, split_waits
from analysis.attribution.parts import BARS, PARTS, Reference, cell_small_gemm, rank_parts, reference, waterfall
from analysis.errors import InputError
from analysis.timeline.gaps import COMPUTE_KINDS, aligned_starts, timeline, windows
from analysis.cells.inferred import cells_of
from analysis.traces.load import TraceWarning, load_run
from analysis.traces.memory import Memory, run_memory
from analysis.cells.executed import as_executed, from_run_json, infer
from analysis.attribution.replay import measure
from runners.schedules import Schedule

NS_PER_MS = 1e6


@dataclass(frozen=True)
class RunInput:
    path: Path
    frames: dict[int, pl.DataFrame]  # rank -> loaded trace frame
    sources: dict[int, Path]  # rank -> trace file
    run_json: dict | None
    memory: Memory | None = None  # activation memory from the traces' memory events (analysis.traces.memory)


@dataclass(frozen=True)
class Analysis:
    cells: pl.DataFrame
    gaps: pl.DataFrame
    ranks: pl.DataFrame  # per (rank, step) parts in ms
    summary: dict
    memory: Memory | None = None


def read_run(path: Path) -> RunInput:
    """The traces of a run directory and its run.json (analysis.traces.load.load_run checks they form a run)."""
    run = load_run(path)
    return RunInput(run.path, {t.rank: t.frame for t in run.traces}, {t.rank: t.path for t in run.traces}, run.config,
                    run_memory(run))


def _shift(rank: RankCells, offset: int) -> RankCells:
    times = ("start_ns", "end_ns", "launch_ns", "issued_ns")

    def moved(frame: pl.DataFrame | None) -> pl.DataFrame | None:
        if frame is None:
            return None
        return frame.with_columns(pl.col(c) + offset for c in times if c in frame.columns)

    return RankCells(moved(rank.cells), moved(rank.waits), moved(rank.steps), moved(rank.kernels),
                     moved(rank.unscheduled))


def _arrived(cells: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """Cells with each RECV ending when its data arrived: torch's runtime only posts the receive inside
    the RECV label, and its wait (keyed by the RECV) ends later, inside the consumer. Causality holds
    for the arrival, not for the post."""
    arrival = waits.group_by(CELL_KEY).agg(arrival_ns=pl.col("end_ns").max())
    return (
        cells.join(arrival, on=CELL_KEY, how="left")
        .with_columns(end_ns=pl.max_horizontal("end_ns", "arrival_ns"))
        .drop("arrival_ns")
    )


def _on_one_clock(per_rank: list[RankCells], frames: dict[int, pl.DataFrame]) -> tuple[list[RankCells], dict | None]:
    """Shift ranks onto one clock, but only when causality says their clocks differ."""
    cells = _arrived(pl.concat([r.cells for r in per_rank]), pl.concat([r.waits for r in per_rank]))
    pairs = clock.transfers(cells)
    if pairs.filter(pl.col("send_start_ns") > pl.col("recv_end_ns")).height == 0:
        return per_rank, None
    found = clock.estimate(sorted(frames), cells, pl.concat(list(frames.values()), how="diagonal_relaxed"))
    shifted = [_shift(r, found.offset_ns(int(r.cells["rank"][0]))) for r in per_rank]
    return shifted, found.to_json()


def _common_steps(per_rank: list[RankCells]) -> list[RankCells]:
    """Keep the steps every rank has cells for (a step cut off on one rank cannot be compared)."""
    common = set.intersection(*(set(r.cells["step"].unique()) for r in per_rank))
    keep = pl.col("step").is_in(sorted(common))
    return [RankCells(r.cells.filter(keep), r.waits.filter(keep), r.steps.filter(keep),
                      None if r.kernels is None else r.kernels.filter(keep), r.unscheduled.filter(keep))
            for r in per_rank]


def _schedule(run: RunInput, cells: pl.DataFrame, schedule: str | None, m: int | None) -> Schedule:
    p = len(run.frames)
    if run.run_json is None or schedule is not None or m is not None:
        inferred = infer(cells, p, run.path, schedule, m)
        if run.run_json is not None and from_run_json(run.run_json, run.path, cells) != inferred:
            raise InputError(run.path / "run.json", f"says {run.run_json.get('schedule')}, the hints {inferred.name}")
        return inferred
    return as_executed(from_run_json(run.run_json, run.path, cells), cells, run.path)


def _warn_overlaps(cells: pl.DataFrame, sources: dict[int, Path]) -> None:
    """One warning per rank whose labelled compute actions overlap (slices that do not nest: a stitched or
    corrupt trace; one thread runs one action at a time). Their times are used as they are."""
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS) & ~pl.col("inferred")).sort("rank", "start_ns")
    overlapping = compute.filter(pl.col("start_ns") < pl.col("end_ns").cum_max().shift(1).over("rank"))
    for rank, group in overlapping.group_by("rank", maintain_order=True):
        first = group.row(0, named=True)
        warnings.warn(f"{sources.get(rank[0], f'rank {rank[0]}')}: {group.height} PP action(s) start before the one "
                      f"before them ends (slices that do not nest), first PP:{first['stage']}{first['kind']}"
                      f"{first['microbatch']} in step {first['step']}; analysed as they are", TraceWarning, stacklevel=2)


def analyze_run(run: RunInput, schedule: str | None = None, m: int | None = None, rules: Rules = Rules()) -> Analysis:
    per_rank = [cells_of(run.frames[r], run.sources.get(r)) for r in sorted(run.frames)]
    if any(r.cells.height == 0 for r in per_rank):
        empty = next(run.sources.get(r) for r, rc in zip(sorted(run.frames), per_rank) if rc.cells.height == 0)
        raise InputError(empty, "no PP:<action> labels inside a profiled step")
    per_rank, clocks = _on_one_clock(_common_steps(per_rank), run.frames)
    per_rank = aligned_starts(per_rank)
    cells = pl.concat([r.cells for r in per_rank])
    if cells.height == 0:
        raise InputError(run.path, "no step has labelled actions on every rank")
    _warn_overlaps(cells, run.sources)
    waits = pl.concat([r.waits for r in per_rank])
    split = split_waits(cells, waits)
    on_gpu = any(is_gpu(frame) for frame in run.frames.values())
    gaps = pl.concat([classify(timeline(r, split), rules, on_gpu) for r in per_rank])
    spans = pl.concat([windows(r) for r in per_rank])
    shape = _schedule(run, cells, schedule, m)
    ref = reference(cells, (run.run_json or {}).get("calibration"), shape.m)
    cells = cell_small_gemm(cells, gaps, spans, ref)
    parts = rank_parts(cells, gaps, spans)
    summary = _summary(run, shape, cells, waits, spans, parts, ref, on_gpu)
    summary.update(rules=rules.to_json(), clock=clocks, inferred_cells=int(cells["inferred"].sum()))
    ranks_ms = parts.with_columns(pl.col("step_ns", *PARTS) / NS_PER_MS).rename(
        {"step_ns": "step_ms", **{part: f"{part}_ms" for part in PARTS}}
    )
    return Analysis(cells.sort("rank", "start_ns"), gaps.sort("rank", "start_ns"), ranks_ms, summary, run.memory)


def _median_step(parts: pl.DataFrame) -> int:
    per_step = parts.group_by("step").agg(pl.col("step_ns").first()).sort("step_ns", "step")
    return int(per_step["step"][(per_step.height - 1) // 2])


def _summary(run: RunInput, shape: Schedule, cells, waits, spans, parts, ref: Reference, on_gpu: bool) -> dict:
    step = _median_step(parts)
    chosen = parts.filter(pl.col("step") == step).sort("rank")
    step_ns = float(chosen["step_ns"][0])
    origin = spans.filter((pl.col("step") == step) & (pl.col("rank") == shape.rank_of(0)))["start_ns"][0]
    this = pl.col("step") == step
    measured = measure(shape, cells.filter(this), waits.filter(this), origin)
    # Uncalibrated, the reference is this step's own median per (stage, kind), not other steps'.
    step_ref = ref if ref.calibrated else reference(cells.filter(this), None, shape.m)
    bars = waterfall(shape, measured, step_ref, step_ns)
    busy = chosen.select(pl.col("compute") + pl.col("small_gemm").fill_null(0)).to_series().sum()
    simulated = step_ns - bars["residual"]
    config = run.run_json or {}
    peaks = {} if run.memory is None else run.memory.peak_bytes(step)
    return {
        "schedule": shape.name,
        "engine": config.get("engine"),
        "device": config.get("device", "cuda" if on_gpu else "cpu"),
        "p": shape.p,
        "m": shape.m,
        "v": shape.v,
        "steps_analyzed": parts["step"].n_unique(),
        "median_step": step,
        "step_time_ms": step_ns / NS_PER_MS,
        "bubble_formula": (shape.p - 1) / (shape.v * shape.m + shape.p - 1),
        "bubble_measured": 1 - busy / (shape.p * step_ns),
        "simulated_step_time_ms": simulated / NS_PER_MS,
        "waterfall_ms": {bar: None if bars[bar] is None else bars[bar] / NS_PER_MS for bar in BARS},
        "ranks": [_rank_entry(row, shape, peaks.get(row["rank"])) for row in chosen.iter_rows(named=True)],
    }


def _rank_entry(row: dict, shape: Schedule, peak_activation_bytes: int | None) -> dict:
    entry = {"rank": row["rank"], "stage_ids": list(shape.stages_of(row["rank"]))}
    for part in PARTS:
        entry[f"{part}_ms"] = None if row[part] is None else row[part] / NS_PER_MS
    entry["peak_activation_bytes"] = peak_activation_bytes  # None: no memory events in the trace (unknown, not 0)
    return entry
