"""One pipeline's measurement from its ranks' tables: cells -> clock -> gaps and classes -> parts -> waterfall.

`analyze_pipeline` is pure: one pipeline's loaded traces in, an `analysis.results.Analysis` out;
`measure_pipeline` is its work over every analysed step, before the summary's step is chosen (a job's
pipelines report the job's step: analysis.job.join). Reading a run directory and writing its analysis are
analysis.job.run_dir's. The summary is the median step's (the lower median when the count is even, so
it is a step that happened and its parts close exactly).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.attribution.critical import composition, critical_table, with_slack
from analysis.attribution.model import StepModel, fit
from analysis.attribution.own_step import OwnSteps, measure
from analysis.attribution.parts import (
    cell_parts,
    in_ms,
    median_step,
    rank_entries,
    rank_parts,
    with_busy,
    with_contention,
)
from analysis.attribution.reference import Reference, reference
from analysis.attribution.replay import Replayed, replay_all
from analysis.attribution.waterfall import Ladder, ideal_frame, ladder
from analysis.caveats import flags, noise
from analysis.cells.executed import as_executed, check_causality, from_run_json, infer
from analysis.cells.labelled import RankCells
from analysis.errors import InputError, TraceWarning
from analysis.ranks.tables import RankInput
from analysis.results import Analysis
from analysis.schema import RANK_PARTS, ClockEstimate, Rules, StepReplay, Summary
from analysis.timeline.classify import classify, with_collectives
from analysis.timeline.clock import on_one_clock, shifted_like_cells
from analysis.timeline.dp_sync import skew_ns
from analysis.timeline.gaps import aligned_starts, timeline, windows
from analysis.timeline.pairing import paired_steps
from analysis.timeline.waits import split_waits
from analysis.traces.layout import Group
from analysis.traces.memory import Memory, memory_of
from analysis.vocabulary import Part
from runners.schedules import COMPUTE_KINDS, Schedule, bubble_formula
from runners.schedules.trace_names import LABEL_PREFIX


@dataclass(frozen=True)
class RunInput:
    """A run directory's loaded traces: the whole job's ranks as read, or one pipeline's ranks of it (cut
    by analysis.job.join, whose pipelines are each measured here)."""

    path: Path
    ranks: dict[int, RankInput]  # rank -> what the analysis reads of its trace (analysis.ranks.tables)
    run_json: dict | None
    # the collectives of a pipeline's ranks with their groups' scopes and start skews
    # (analysis.timeline.dp_sync.with_skew); None at dp = 1
    group_collectives: pl.DataFrame | None = None
    world_size: int | None = None  # the job's ranks, where the run may hold only some of them

    @property
    def partial(self) -> bool:
        """The traces hold some of the job's ranks only (analysis.job.partial measures each alone)."""
        return self.world_size is not None and self.world_size > len(self.ranks)

    @property
    def sources(self) -> dict[int, Path]:
        return {rank: one.source for rank, one in self.ranks.items()}

    @property
    def memory(self) -> Memory:
        """Activation memory from the traces' memory events (analysis.traces.memory)."""
        return memory_of(pl.concat([one.memory for one in self.ranks.values()]))

    @property
    def run_queue(self) -> pl.DataFrame:
        """The executor's run-queue samples (analysis.traces.runqueue)."""
        return pl.concat([one.samples for one in self.ranks.values()])

    @property
    def groups(self) -> dict[int, tuple[Group, ...]]:
        """rank -> its process groups (analysis.traces.layout)."""
        return {rank: one.groups for rank, one in self.ranks.items()}

    @property
    def peers(self) -> dict[int, set[int]]:
        """rank -> its p2p peers, read only where nothing else says which ranks form the pipelines."""
        return {rank: set(one.peers) for rank, one in self.ranks.items() if one.peers}


def _common_steps(per_rank: list[RankCells]) -> list[RankCells]:
    """Keep the steps every rank has cells for (a step cut off on one rank cannot be compared), once each
    rank's steps are numbered as the steps they ran with (analysis.timeline.pairing)."""
    per_rank = paired_steps(per_rank)
    common = set.intersection(*(set(r.cells["step"].unique()) for r in per_rank))
    keep = pl.col("step").is_in(sorted(common))
    return [r.map(lambda frame: frame.filter(keep)) for r in per_rank]


def _schedule(
    run: RunInput, cells: pl.DataFrame, schedule: str | None, m: int | None
) -> tuple[Schedule, str | None]:
    """The executed schedule and, when it is custom, the nearest named one (analysis.cells.executed)."""
    p = len(run.ranks)
    named = None if run.run_json is None else from_run_json(run.run_json, run.path, cells)
    if named is None or schedule is not None or m is not None:
        inferred, nearest = infer(cells, p, run.path, schedule, m)
        if named is not None and named.name != inferred.name:
            raise InputError(run.path / "run.json", f"says {named.name}, the hints {inferred.name}")
        return inferred, nearest
    return as_executed(named, cells, run.path), None


def _warn_overlaps(cells: pl.DataFrame, sources: dict[int, Path]) -> None:
    """One warning per rank whose labelled compute actions overlap (slices that do not nest: a stitched or
    corrupt trace; one thread runs one action at a time). Their times are used as they are."""
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS) & ~pl.col("inferred")).sort("rank", "start_ns")
    overlapping = compute.filter(pl.col("start_ns") < pl.col("end_ns").cum_max().shift(1).over("rank"))
    for rank, group in overlapping.group_by("rank", maintain_order=True):
        first = group.row(0, named=True)
        warnings.warn(
            f"{sources.get(rank[0], f'rank {rank[0]}')}: {group.height} PP action(s) start before the one "
            f"before them ends (slices that do not nest), first {LABEL_PREFIX}{first['stage']}{first['kind']}"
            f"{first['microbatch']} in step {first['step']}; analysed as they are",
            TraceWarning,
            stacklevel=2,
        )


def analyze_pipeline(
    run: RunInput, schedule: str | None = None, m: int | None = None, rules: Rules = Rules()
) -> Analysis:
    """The pipeline's analysis; its summary is the step of median length's."""
    return measure_pipeline(run, schedule, m, rules).analysis()


@dataclass(frozen=True)
class Measured:
    """A run measured over every analysed step, its summary's step not yet chosen: a job's pipelines
    are measured once each and all report the job's step (analysis.job.join)."""

    config: dict  # run.json, {} where the run has none
    shape: Schedule
    nearest: str | None  # the nearest named schedule where the executed one is custom
    cells: pl.DataFrame  # with their parts (analysis.attribution.parts), in order of rank and start
    gaps: pl.DataFrame  # in order of rank and start
    parts: pl.DataFrame  # every analysed step's rank_parts, ns
    spans: pl.DataFrame  # the ranks' step windows
    ref: Reference
    own: OwnSteps  # every analysed step's own inputs (analysis.attribution.own_step)
    replays: dict[int, Replayed]  # each analysed step replayed from them
    origins: dict[int, int]  # each step's origin on the cells' clock: its first stage's window start
    model: StepModel
    memory: Memory
    clock: ClockEstimate | None
    on_gpu: bool
    rules: Rules

    def analysis(self, step: int | None = None) -> Analysis:
        """The Analysis whose summary is `step`'s where it is one of the analysed steps, else the step
        of median length's."""
        if step is None or step not in self.parts["step"]:
            step = median_step(self.parts)
        chosen = self.parts.filter(pl.col("step") == step)
        step_ns = float(chosen["step_ns"][0])
        rungs = ladder(self.shape, self.model, self.ref, step_ns, self.replays[step].makespan)
        return Analysis(
            self._summary(chosen, step, step_ns, rungs),
            self.shape,
            self.cells,
            self.gaps,
            in_ms(self.parts),
            ideal_frame(rungs.ideal, self.shape, step, self.origins[step]),
            self.model,
            critical_table(self.replays, self.origins),
            self.own,
            self.memory,
        )

    def _summary(self, chosen: pl.DataFrame, step: int, step_ns: float, rungs: Ladder) -> Summary:
        shape, parts, config = self.shape, self.parts, self.config
        found = noise(
            parts.group_by("step").agg(pl.col("step_ns").first() / 1e6)["step_ns"].to_list(), config
        )
        raised, notes = flags(config, found, self.rules)
        unprofiled = config.get("step_time_unprofiled_ms")
        return Summary(
            schedule=shape.name,
            nearest_schedule=self.nearest,
            engine=config.get("engine"),
            device=config.get("device", "cuda" if self.on_gpu else "cpu"),
            p=shape.p,
            m=shape.m,
            v=shape.v,
            steps_analyzed=parts["step"].n_unique(),
            median_step=step,
            step_time_ms=step_ns / 1e6,
            step_time_unprofiled_ms=unprofiled if isinstance(unprofiled, (int, float)) else None,
            bubble_formula=bubble_formula(shape),
            bubble_measured=1 - chosen["busy"].sum() / (shape.p * step_ns),
            bubble_seed=_seed_bubble(chosen, shape.p, step_ns),
            typical_step_ms=rungs.typical_ns / 1e6,
            waterfall_ms=rungs.waterfall,
            waterfall_shapley_ms=rungs.shapley,
            replayed_steps=self._replayed_steps(),
            critical_path=composition(self.replays[step]),
            parts=tuple(f"{part}_ms" for part in RANK_PARTS),
            ranks=rank_entries(chosen, shape, self.memory.peak_bytes(step)),
            rules=self.rules,
            clock=self.clock,
            inferred_cells=int(self.cells["inferred"].sum()),
            noise=found,
            flags=raised,
            notes=notes,
        )

    def _replayed_steps(self) -> list[StepReplay]:
        ends = self.own.tails.group_by("step").agg(
            opened=pl.col("w_start").max() - pl.col("w_start").min(),
            active_end=pl.col("active_end").max(),
            labelled_end=pl.col("labelled_end").any(),
        )
        steps = (
            self.parts.group_by("step")
            .agg(pl.col("step_ns").first())
            .join(self.spans.group_by("step").agg(pl.col("end_ns").max()), on="step")
            .join(ends, on="step")
            .sort("step")
        )
        return [
            StepReplay(
                step=step,
                step_time_ms=step_ns / 1e6,
                replay_ms=self.replays[step].makespan / 1e6,
                residual_ms=(step_ns - self.replays[step].makespan) / 1e6,
                opened_late_ms=opened / 1e6,
                ran_on_ms=max(0, end_ns - active_end) / 1e6,
                step_end_barrier=labelled_end,
            )
            for step, step_ns, end_ns, opened, active_end, labelled_end in steps.select(
                "step", "step_ns", "end_ns", "opened", "active_end", "labelled_end"
            ).iter_rows()
        ]


def measure_pipeline(
    run: RunInput, schedule: str | None = None, m: int | None = None, rules: Rules = Rules()
) -> Measured:
    """The pipeline measured over every step all its ranks have cells for."""
    ranks = [run.ranks[r] for r in sorted(run.ranks)]
    empty = next((r.source for r in ranks if r.cells.cells.height == 0), None)
    if empty is not None:
        raise InputError(empty, f"no {LABEL_PREFIX}<action> labels inside a profiled step")
    collectives = pl.concat([r.collectives for r in ranks])
    per_rank, clock = on_one_clock(_common_steps([r.cells for r in ranks]), sorted(run.ranks), collectives)
    per_rank = aligned_starts(per_rank)
    cells = pl.concat([r.cells for r in per_rank])
    if cells.height == 0:
        raise InputError(run.path, "no step has labelled actions on every rank")
    _warn_overlaps(cells, run.sources)
    on_gpu = any(r.on_gpu for r in ranks)
    waits, gaps, spans, skews = _gaps(run, per_rank, cells, clock, rules, on_gpu)
    shape, nearest = _schedule(run, cells, schedule, m)
    check_causality(shape, cells, run.sources)
    cells = with_busy(cells, gaps, spans)
    ref = reference(cells, run.run_json, shape.m)
    cells = with_contention(cell_parts(cells, ref), shifted_like_cells(run.run_queue, clock, ("t_ns",)))
    parts = rank_parts(cells, gaps, spans, skews)
    own = measure(
        shape,
        cells,
        waits,
        gaps,
        spans,
        on_gpu,
        _every_rank(per_rank, "barriers"),
        _every_rank(per_rank, "sends"),
    )
    steps = parts["step"].unique().sort().to_list()
    replays = dict(zip(steps, replay_all(shape, own.steps(steps, shape.p))))
    model = fit(own, median_step(parts), shape.p)
    first_stage = spans.filter(pl.col("rank") == shape.rank_of(0))
    origins = dict(first_stage.select("step", "start_ns").iter_rows())
    cells = with_slack(cells, replays).sort("rank", "start_ns")
    gaps = gaps.sort("rank", "start_ns")
    config = run.run_json or {}
    return Measured(
        config,
        shape,
        nearest,
        cells,
        gaps,
        parts,
        spans,
        ref,
        own,
        replays,
        origins,
        model,
        run.memory,
        clock,
        on_gpu,
        rules,
    )


def _every_rank(per_rank: list[RankCells], frame: str) -> pl.DataFrame | None:
    """One optional frame of RankCells (`frame`: its name) over the ranks that have it; None where none does."""
    found = [getattr(r, frame) for r in per_rank if getattr(r, frame) is not None]
    return pl.concat(found) if found else None


def _gaps(
    run: RunInput,
    per_rank: list[RankCells],
    cells: pl.DataFrame,
    clock: ClockEstimate | None,
    rules: Rules,
    on_gpu: bool,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame | None]:
    """Every rank's waits, its classified gaps (with dp_sync where the run has DP collectives), its step
    windows, and the DP skews (None at dp = 1); `cells` are every rank's, on one clock."""
    waits = pl.concat([r.waits for r in per_rank])
    split = split_waits(cells, waits, _every_rank(per_rank, "kernels"), _every_rank(per_rank, "send_waits"))
    steps = [windows(r) for r in per_rank]
    gaps = pl.concat([classify(timeline(r, split, w), rules, on_gpu) for r, w in zip(per_rank, steps)])
    skews = None
    if run.group_collectives is not None:
        synced = shifted_like_cells(
            run.group_collectives, clock, ("start_ns", "end_ns", "ready_ns", "skew_end_ns")
        )
        gaps = with_collectives(gaps, synced)
        skews = skew_ns(gaps, synced)
    return waits, gaps, pl.concat(steps), skews


def _seed_bubble(chosen: pl.DataFrame, p: int, step_ns: float) -> float | None:
    """The seed's 1 - m*t_slot/step, t_slot timed alone: 1 - the ranks' isolated work / (p * step)."""
    if chosen[Part.SMALL_GEMM].null_count():
        return None
    return 1 - (chosen[Part.COMPUTE].sum() + chosen[Part.SMALL_GEMM].sum()) / (p * step_ns)
