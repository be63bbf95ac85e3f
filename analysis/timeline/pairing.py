"""Which steps of different ranks ran together: paired by time and checked by their transfers, not taken
from the ProfilerStep numbers alone.

Each rank numbers its own steps: a profiler started a step later on one rank (or a restarted job)
makes its `ProfilerStep#N` another rank's `#N+1`, and pairing by number compares different steps
without a sign of it. A pipeline step of neighbouring ranks spans most of the same stretch of time
(they exchange activations and gradients within it, and loops end it together), so a rank's step is
paired with the step of the rank before it (itself paired, back to rank 0) that it overlaps most, by
at least half the shorter of the two.
Clocks of different hosts may disagree by a fraction of a step, so the numbers stand wherever
same-numbered steps overlap that much, and wherever time cannot tell (no step overlaps well: clocks
apart by more than half a step). Where time pairs steps the numbers did not, and the pipeline's
transfers (a receive cannot end before its send began) agree no worse than with the numbers, the rank's
steps are renumbered as the reference's and one warning line says so; where the transfers contradict
the times, the run is refused: which steps ran together cannot be told.
"""

from __future__ import annotations

import warnings

import polars as pl

from analysis.cells.labelled import RankCells
from analysis.errors import InputError, TraceWarning
from analysis.timeline.clock import transfers

MIN_OVERLAP = 0.5  # of the shorter step: same step; adjacent steps overlap by little or nothing


def _spans(cells: RankCells) -> pl.DataFrame:
    """The rank's steps that hold cells: step, start_ns, end_ns."""
    having = cells.cells.select("step").unique()
    return cells.steps.join(having, on="step").select("step", "start_ns", "end_ns").sort("start_ns")


def _fraction(start: str, end: str) -> pl.Expr:
    """How much of the shorter of this step and the partner in (start, end) the two share."""
    shorter = pl.min_horizontal(pl.col("end_ns") - pl.col("start_ns"), pl.col(end) - pl.col(start))
    common = (pl.min_horizontal("end_ns", end) - pl.max_horizontal("start_ns", start)).clip(lower_bound=0)
    partnered = pl.col(start).is_not_null() & (shorter > 0)  # min/max_horizontal would skip a null
    return pl.when(partnered).then(common / shorter).otherwise(0.0)


def _partners(theirs: pl.DataFrame) -> pl.DataFrame:
    """`theirs`'s steps under the names _fraction compares against (step_r, start_r, end_r)."""
    return theirs.select(step_r="step", start_r="start_ns", end_r="end_ns")


def _same(mine: pl.DataFrame, theirs: pl.DataFrame) -> pl.Series:
    """Per step of `mine`: the fraction of the shorter it shares with `theirs`'s step of the same number."""
    same = mine.join(_partners(theirs), left_on="step", right_on="step_r", how="left", maintain_order="left")
    return same.select(_fraction("start_r", "end_r")).to_series()


def _best(mine: pl.DataFrame, theirs: pl.DataFrame) -> pl.DataFrame:
    """Per step of `mine`: the step of `theirs` it overlaps most (theirs_step) and by what fraction of
    the shorter (best). A rank's steps follow each other, so the best is the last of theirs that starts
    before this one or the next."""
    other = _partners(theirs)
    before = mine.join_asof(other, left_on="start_ns", right_on="start_r", strategy="backward")
    after = mine.join_asof(other, left_on="start_ns", right_on="start_r", strategy="forward")
    scored = pl.DataFrame(
        {
            "step": mine["step"],
            "before": before.select(_fraction("start_r", "end_r")).to_series(),
            "before_step": before["step_r"],
            "after": after.select(_fraction("start_r", "end_r")).to_series(),
            "after_step": after["step_r"],
        }
    )
    earlier = pl.col("before") >= pl.col("after")
    return scored.select(
        "step",
        best=pl.max_horizontal("before", "after"),
        theirs_step=pl.when(earlier).then("before_step").otherwise("after_step"),
    )


def _renumbering(mine: pl.DataFrame, theirs: pl.DataFrame) -> dict[int, int] | None:
    """step -> the reference's step it ran with, where time says it is another number; None when the
    numbers stand. Steps with no partner in time keep their number (they drop out as not common)."""
    if mine.height == 0 or theirs.height == 0:
        return None
    same = _same(mine, theirs)
    if (same >= MIN_OVERLAP).sum() * 2 >= mine.height:
        return None  # same-numbered steps overlap: the numbers are right (clocks may differ a little)
    scored = _best(mine, theirs).with_columns(same=same)
    moved = scored.filter((pl.col("best") >= MIN_OVERLAP) & (pl.col("same") < MIN_OVERLAP))
    if moved.height * 2 < scored.height:
        return None  # time cannot tell: too few steps overlap any step of the reference well
    mapping = dict(moved.select("step", "theirs_step").iter_rows())
    if len(set(mapping.values())) < len(mapping):
        return {}  # two steps with one partner: no pairing step by step
    return mapping


def _violations(per_rank: list[RankCells]) -> int:
    """Transfers whose receive ended before its send began (on the ranks' clocks as they are)."""
    pairs = transfers(pl.concat([r.cells for r in per_rank]))
    return pairs.filter(pl.col("recv_end_ns") < pl.col("send_start_ns")).height


def _mapped(mapping: dict[int, int]) -> pl.Expr:
    """`step` numbered as `mapping` says; steps not in it get numbers no other rank has (they ran with
    no step of the reference): negative, never a ProfilerStep number, so never common."""
    return pl.col("step").replace_strict(mapping, default=-1 - pl.col("step"), return_dtype=pl.Int64)


def _renumbered(cells: RankCells, mapping: dict[int, int]) -> RankCells:
    """The rank's tables with its steps numbered as `mapping` says."""
    return cells.map(lambda frame: frame.with_columns(step=_mapped(mapping)))


def paired_steps(per_rank: list[RankCells]) -> list[RankCells]:
    """Every rank's steps numbered as rank 0's steps they ran with (analysis.job.measure keeps the steps all
    ranks then share); unchanged when the numbers already pair them. Each rank is paired with the rank
    before it (already numbered as rank 0's): neighbours in a pipeline start their steps a stage apart,
    so their steps overlap most, where rank 0's and the last rank's may overlap by half or less."""
    if len(per_rank) < 2:
        return per_rank
    first = int(per_rank[0].cells["rank"][0])
    reference, out, changes = _spans(per_rank[0]), [per_rank[0]], {}
    for index in range(1, len(per_rank)):
        spans = _spans(per_rank[index])
        mapping = _renumbering(spans, reference)
        rank = int(per_rank[index].cells["rank"][0])
        if mapping == {}:
            raise InputError(
                None,
                f"rank {rank}'s steps cannot be paired with rank {first}'s: two of them ran during one step "
                "of the rank before it, and the ProfilerStep numbers disagree with the times",
            )
        if mapping is None:
            out.append(per_rank[index])
            reference = spans
            continue
        changes[rank] = mapping
        out.append(_renumbered(per_rank[index], mapping))
        reference = spans.with_columns(step=_mapped(mapping))
    if not changes:
        return per_rank
    if _violations(out) > _violations(per_rank):
        raise InputError(
            None,
            f"which steps ran together cannot be told: rank {next(iter(changes))}'s ProfilerStep numbers "
            f"pair it with rank {first}'s steps at other times, and pairing by time makes receives end "
            "before their sends began",
        )
    examples = []
    for rank, mapping in changes.items():
        step, partner = next(iter(sorted(mapping.items())))
        examples.append(f"rank {rank}'s #{step} ran with rank {first}'s #{partner}")
    shown = ", ".join(str(rank) for rank in changes)
    warnings.warn(
        f"rank{'s' if len(changes) > 1 else ''} {shown}: ProfilerStep numbers disagree with rank {first}'s "
        f"for the steps that ran together ({'; '.join(examples[:3])}); paired by time and numbered as "
        f"rank {first}'s",
        TraceWarning,
        stacklevel=3,
    )
    return out
