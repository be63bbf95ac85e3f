"""Some ranks of a bigger job (one rank of a Megatron job, rank 0 of DeepSeek's 64): what each present
rank shows alone, and the figures across ranks marked unknown rather than guessed
(docs/numbers.md#ranks-alone).

Each present rank is measured as `analysis.job.measure` measures a rank, on its own clock and with
its own cells only: its step windows, its idle gaps by class, its busy time and parts. A receive whose
sender is not in the traces cannot be split into bubble (the sender had not sent) and p2p_wait (the
transfer): the classes leave it `other`, and its blocked time is said as `unmatched_wait_ms`. Each
rank's own bubble (1 - busy / its step) stands beside the formula's at the job's p and m where run.json
says them. The replay, the typical step, the waterfall and the critical path run across stages: they are
UNKNOWN, each with why, and the verdict recommends nothing.
"""

from __future__ import annotations

import polars as pl

from analysis.attribution.parts import (
    NS_PER_MS,
    cell_parts,
    median_step,
    rank_parts,
    with_busy,
    with_contention,
)
from analysis.attribution.reference import reference
from analysis.errors import InputError
from analysis.job.join import integrity
from analysis.job.measure import RunInput
from analysis.ranks.tables import RankInput
from analysis.results import RanksAnalysis
from analysis.schema import RANK_PARTS, RankAlone, RanksSummary, Rules, Trust, Verdict
from analysis.timeline.classify import classify
from analysis.timeline.gaps import timeline, windows
from analysis.timeline.pairing import paired_steps
from analysis.timeline.waits import split_waits
from analysis.traces.memory import memory_of
from analysis.trust.gate import integrity_reasons
from analysis.vocabulary import Level
from runners.schedules import ScheduleError, bubble_formula, build

# The figures that need every rank of a pipeline, and why (RanksSummary.unknown).
UNKNOWN = (
    "the replay, the typical step and the waterfall: they replay every stage's cells and each hop's sender",
    "the critical path: it runs across ranks",
    "bubble against p2p_wait in a receive from a missing rank: when its sender began is not in the traces",
    "the verdict's recoverable times: they come from the replay",
)


def _alone(rank: RankInput, config: dict, rules: Rules) -> tuple[RankAlone, pl.DataFrame, pl.DataFrame]:
    """One rank's own figures at its step of median length, its cells and its gaps."""
    (own,) = paired_steps([rank.cells])
    if own.cells.height == 0:
        raise InputError(rank.source, "no pipeline actions inside a profiled step")
    on_gpu = rank.on_gpu
    split = split_waits(own.cells, own.waits, own.kernels, own.send_waits)
    spans = windows(own)
    gaps = classify(timeline(own, split, spans), rules, on_gpu)
    cells = with_busy(own.cells, gaps, spans)
    m = config.get("m") or int(cells["microbatch"].max()) + 1
    cells = with_contention(cell_parts(cells, reference(cells, config, m)), rank.samples)
    parts = rank_parts(cells, gaps, spans)
    step = median_step(parts)
    row = parts.filter(pl.col("step") == step).row(0, named=True)
    unmatched = split.filter((pl.col("layer") == "unmatched_wait") & (pl.col("step") == step))
    peak = memory_of(rank.memory).peak_bytes(step).get(rank.rank)
    entry = RankAlone(
        rank=rank.rank,
        stage_ids=sorted(cells["stage"].unique().to_list()),
        busy_ms=row["busy"] / NS_PER_MS,
        cpu_contention_ms=None if row["cpu_contention"] is None else row["cpu_contention"] / NS_PER_MS,
        peak_activation_bytes=peak,
        step=step,
        step_time_ms=row["step_ns"] / NS_PER_MS,
        bubble_measured=1 - row["busy"] / row["step_ns"],
        unmatched_wait_ms=(unmatched["end_ns"] - unmatched["start_ns"]).sum() / NS_PER_MS,
        **{f"{part}_ms": None if row[part] is None else row[part] / NS_PER_MS for part in RANK_PARTS},
    )
    return entry, cells, gaps


def _formula(config: dict) -> float | None:
    """The formula's bubble at the job's schedule, p, m and v where run.json says them."""
    try:
        return bubble_formula(build(config["schedule"], config["p"], config["m"], config.get("v", 1)))
    except (KeyError, TypeError, ScheduleError):
        return None


def _verdict(present: list[int], world_size: int, entries: list[RankAlone]) -> Verdict:
    shown = ", ".join(
        f"rank {e.rank} {e.step_time_ms:.1f} ms, {e.bubble_measured:.1%} idle" for e in entries[:4]
    )
    return Verdict(
        sentences=[
            f"The traces hold {len(present)} of the job's {world_size} ranks: {shown}.",
            "What needs the other ranks is unknown: the replay, the critical path and what any change would "
            "recover.",
            f"Nothing recommended: {world_size - len(present)} rank(s) missing.",
        ],
        recommends=False,
        findings=[],
    )


def measure_ranks(run: RunInput, world_size: int, rules: Rules = Rules()) -> RanksAnalysis:
    """The present ranks of a job of `world_size` ranks, each alone."""
    config = run.run_json or {}
    measured = [_alone(run.ranks[r], config, rules) for r in sorted(run.ranks)]
    entries = [entry for entry, _, _ in measured]
    present = sorted(run.ranks)
    cells = pl.concat([c for _, c, _ in measured], how="diagonal_relaxed")
    counted = integrity(run)
    summary = RanksSummary(
        schedule=config.get("schedule"),
        engine=config.get("engine"),
        device=config.get("device", "cuda" if any(r.on_gpu for r in run.ranks.values()) else "cpu"),
        p=config.get("p"),
        m=config.get("m"),
        v=config.get("v"),
        world_size=world_size,
        ranks_present=present,
        step_time_ms=max(e.step_time_ms for e in entries),
        bubble_formula=_formula(config),
        ranks=entries,
        unknown=list(UNKNOWN),
        inferred_cells=int(cells["inferred"].sum()),
        rules=rules,
        integrity=counted,
        trust=Trust(
            level=Level.LOW,
            reasons=[
                f"ranks missing: {world_size - len(present)} of the job's {world_size}",
                *integrity_reasons(counted, rules),
            ],
        ),
        verdict=_verdict(present, world_size, entries),
    )
    return RanksAnalysis(summary, cells, pl.concat([g for _, _, g in measured]))
