"""A job of one or more pipelines (PP x DP): each pipeline analysed as a run of its own, then joined.

The pipelines come from analysis.traces.layout; each one's ranks are renumbered 0..p-1 (their stage order)
and measured by analysis.job.measure.measure_pipeline, with the collectives of its ranks, their groups' scopes
and their waits across the groups (analysis.timeline.dp_sync), and the results are mapped back to global
ranks. The job's summary is the slowest pipeline's, with every rank's entry (closing on its pipeline's
step_time_ms), `dp`, `pipelines` and the `straggler` (analysis.schema.Summary). Every pipeline reports
the job's step of median length (each is measured once, then summarised at that step), so the ranks
of all of them are compared in one step. The slowest is the one whose step alone (its step less
the longest wait of one of its ranks for a slower replica, its largest dp_skew) is longest: the
gradient sync makes every pipeline's step as long as the slowest's, and this is what tells them apart.
The rank that waits longest is the one whose own work ended earliest against the slowest replica's:
with every stage of a replica slowed alike, the last stage to finish, whose end plus the sync's
transfer is the pipeline's step alone.
"""

from __future__ import annotations

from dataclasses import replace

import msgspec
import polars as pl

from analysis.attribution.parts import median_step
from analysis.errors import InputError
from analysis.job.measure import RunInput, measure_pipeline
from analysis.ranks.tables import RankInput
from analysis.results import Analysis
from analysis.schema import ClockEstimate, PipelineEntry, RankIntegrity, Rules, Straggler
from analysis.timeline.dp_sync import with_skew
from analysis.traces.layout import DP, find_pipelines, to_global, to_local
from analysis.traces.memory import Memory
from analysis.trust.gate import pipeline_evidence
from analysis.verdict.verdict import assessed


def analyze_job(
    run: RunInput, schedule: str | None = None, m: int | None = None, rules: Rules = Rules()
) -> Analysis:
    """Every pipeline of the run analysed, joined into one Analysis on global ranks."""
    pipeline_evidence(run.path, {rank: one.census for rank, one in run.ranks.items()})
    pipelines = find_pipelines(len(run.ranks), run.run_json, run.groups, run.peers, run.path)
    said = 1 if run.run_json is None else run.run_json.get("dp", 1)
    if run.run_json is not None and len(pipelines) != said:
        raise InputError(run.path / "run.json", f"says dp={said!r:.20} but lists {len(pipelines)} pipelines")
    instances = _instances(run, pipelines) if len(pipelines) > 1 else None
    inputs = [_pipeline_input(run, ranks, instances) for ranks in pipelines]
    measured = [measure_pipeline(one, schedule, m, rules) for one in inputs]
    step = _job_step([one.parts for one in measured])
    joined = _joined([one.analysis(step) for one in measured], pipelines, _unsynced(run, instances))
    summary = msgspec.structs.replace(joined.summary, integrity=integrity(run))
    return assessed(replace(joined, summary=summary), run.run_json or {}, run.path)


def integrity(run: RunInput) -> list[RankIntegrity]:
    """Every rank's trace integrity counts, by global rank."""
    return [
        RankIntegrity(rank=rank, **msgspec.structs.asdict(run.ranks[rank].integrity))
        for rank in sorted(run.ranks)
    ]


def _unsynced(run: RunInput, instances: pl.DataFrame | None) -> list[str]:
    """A note for ranks of a job of several pipelines where no DP collective was found."""
    if instances is None:
        return []
    synced = instances.filter(pl.col("scope") == DP)["rank"].unique().to_list()
    missing = sorted(set(run.ranks) - set(synced))
    if not missing:
        return []
    return [
        f"rank(s) {', '.join(map(str, missing))}: no data-parallel collective found (c10d::allreduce_ and "
        "its gloo run, or NCCL AllReduce/ReduceScatter/AllGather kernels), so their dp_sync is 0"
    ]


def _job_step(parts: list[pl.DataFrame]) -> int:
    """The job's step of median length (the lower median), a step being as long as its longest pipeline's
    (the gradient sync binds them): every pipeline reports it, so their ranks are compared in one step.
    `parts`: each pipeline's rank_parts."""
    steps = pl.concat([one.select("step", "step_ns") for one in parts])
    return median_step(steps.group_by("step").agg(pl.col("step_ns").max()))


def _instances(run: RunInput, pipelines: list[list[int]]) -> pl.DataFrame:
    """Every rank's collectives with their groups' scopes and their start skews."""
    found = pl.concat([run.ranks[rank].group_collectives for rank in sorted(run.ranks)])
    cells = pl.concat([_done(run.ranks[rank]) for rank in sorted(run.ranks)])
    return with_skew(found, pipelines, cells)


def _done(rank: RankInput) -> pl.DataFrame:
    """A rank's cells (rank, step, start_ns) with done_ns, when each stopped holding the rank: its end, a
    GPU SEND's too (the compute stream waits for the sends to drain before the all-reduce). The executor's
    wait for its sends after its last action (CPU) holds the rank too: a replica is not at its all-reduce
    before it ends."""
    cells = rank.cells.cells.select("rank", "step", "start_ns", done_ns="end_ns")
    waits = rank.cells.send_waits
    if waits is None:
        return cells
    return pl.concat([cells, waits.select("rank", "step", "start_ns", done_ns="end_ns")])


def _pipeline_input(run: RunInput, ranks: list[int], instances: pl.DataFrame | None) -> RunInput:
    """The pipeline's ranks (global, in stage order) as a run of ranks 0..p-1."""
    renumbered = {local: run.ranks[rank].renumbered(local) for local, rank in enumerate(ranks)}
    return RunInput(run.path, renumbered, run.run_json, to_local(instances, ranks))


def _entry(analysis: Analysis, ranks: list[int]) -> PipelineEntry:
    summary = analysis.summary
    alone = summary.step_time_ms - max(entry.dp_skew_ms for entry in summary.ranks)
    return PipelineEntry(
        ranks=ranks,
        median_step=summary.median_step,
        step_time_ms=summary.step_time_ms,
        step_time_alone_ms=alone,
        bubble_measured=summary.bubble_measured,
    )


def _joined(analyses: list[Analysis], pipelines: list[list[int]], notes: list[str]) -> Analysis:
    entries = [_entry(analysis, ranks) for analysis, ranks in zip(analyses, pipelines)]
    times = [entry.step_time_alone_ms for entry in entries]
    slowest = times.index(max(times))
    straggler = None
    if len(entries) > 1:
        fastest = min(times)
        straggler = Straggler(
            pipeline=slowest, slower_ms=times[slowest] - fastest, slower_fraction=times[slowest] / fastest - 1
        )
    rank_entries = sorted(
        (
            msgspec.structs.replace(entry, rank=pipeline[entry.rank], pipeline=j)
            for j, (analysis, pipeline) in enumerate(zip(analyses, pipelines))
            for entry in analysis.summary.ranks
        ),
        key=lambda entry: entry.rank,
    )
    chosen = analyses[slowest]
    summary = msgspec.structs.replace(
        chosen.summary,
        ranks=rank_entries,
        dp=len(pipelines),
        pipelines=entries,
        straggler=straggler,
        clock=_clock([a.summary.clock for a in analyses], pipelines, slowest),
        inferred_cells=sum(a.summary.inferred_cells for a in analyses),
        notes=chosen.summary.notes + notes,
    )

    def every(table: str) -> pl.DataFrame:
        return pl.concat([to_global(getattr(a, table), ranks) for a, ranks in zip(analyses, pipelines)])

    memories = [(a.memory, ranks) for a, ranks in zip(analyses, pipelines) if a.memory is not None]
    memory = None
    if memories:
        memory = Memory(
            pl.concat([to_global(m.stash, r) for m, r in memories]),
            pl.concat([to_global(m.peaks, r) for m, r in memories]),
        )
    return replace(
        chosen,
        summary=summary,
        cells=every("cells").sort("rank", "start_ns"),
        gaps=every("gaps").sort("rank", "start_ns"),
        parts=every("parts").sort("step", "rank"),
        ideal=every("ideal"),
        critical=every("critical"),
        memory=memory,
    )


def _clock(
    clocks: list[ClockEstimate | None], pipelines: list[list[int]], slowest: int
) -> ClockEstimate | None:
    """Each pipeline's offsets on global ranks (each pipeline's own reference: across pipelines the
    ranks are taken to share a clock); None when no pipeline needed any."""
    if all(clock is None for clock in clocks):
        return None
    known = [(clock, ranks) for clock, ranks in zip(clocks, pipelines) if clock is not None]
    reference = clocks[slowest] or known[0][0]
    reference_ranks = pipelines[slowest] if clocks[slowest] is not None else known[0][1]
    return replace(
        reference,
        reference_rank=reference_ranks[reference.reference_rank],
        ranks=tuple(replace(r, rank=ranks[r.rank]) for clock, ranks in known for r in clock.ranks),
        transfers=sum(clock.transfers for clock, _ in known),
        collectives=sum(clock.collectives for clock, _ in known),
        inconsistent_pairs=tuple(
            (ranks[a], ranks[b]) for clock, ranks in known for a, b in clock.inconsistent_pairs
        ),
    )
