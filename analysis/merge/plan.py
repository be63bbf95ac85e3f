"""Everything of the merged trace but its events, from the first pass over the ranks
(analysis.merge.sources.Skim): each rank's clock shift, the trace's time origin, how times are written,
what is noted, and about how large the JSON will be.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import polars as pl

from analysis.merge.analysis_tracks import applied_offsets
from analysis.merge.sources import MergeRanks, shown
from analysis.merge.tracks import exact_micros, micros
from analysis.results import Analysis
from analysis.timeline import clock
from analysis.traces.times import WHOLE_NS_LIMIT_US


@dataclass(frozen=True)
class MergePlan:
    """Where each rank's events go and what is noted; the events themselves are read rank by rank."""

    ranks: MergeRanks
    shift: dict[int, int]
    origin: int
    analysis: Analysis | None
    cells: pl.DataFrame | None
    steps: tuple[int, ...] | None
    estimate: clock.ClockEstimate | None
    notes: list[str]
    us: object = micros  # how times are written (exact_micros where a double would round them)

    @property
    def kept_bytes(self) -> int:
        """About the merged JSON's size: the kept events' share of the traces' text."""
        return sum(skim.kept_bytes for skim in self.ranks.skims.values())

    def meta(self, events: int) -> dict:
        skims = self.ranks.skims
        return {
            "clock": msgspec.to_builtins(self.estimate),
            "origin_ns": self.origin,
            "limited": _limits(self.steps, list(skims)),
            "notes": self.notes,
            "events": events,
            "sources": {str(rank): skim.path.name for rank, skim in skims.items()},
        }


def plan(
    ranks: MergeRanks, steps: tuple[int, ...] | None, analysis: Analysis | None, align: bool
) -> MergePlan:
    skims = ranks.skims
    cells, estimate = _own_clock_cells(analysis), analysis.summary.clock if analysis is not None else None
    if analysis is None and align:
        events = pl.concat(
            [skim.collectives.with_columns(rank=pl.lit(rank, pl.Int64)) for rank, skim in skims.items()]
        ).select("rank", "name", "cat", "ph", "start_ns", "end_ns")
        estimate = clock.estimate(list(skims), None, events)
    notes = [
        f"rank {rank}: none of steps {shown(steps or ())} is in the trace; rank left empty"
        for rank, skim in skims.items()
        if not skim.steps_found
    ]
    shift = {rank: estimate.offset_ns(rank) if align and estimate is not None else 0 for rank in skims}
    known = [
        (skim.first_ns + shift[rank], skim.last_ns + shift[rank])
        for rank, skim in skims.items()
        if skim.first_ns is not None
    ]
    origin = min((first for first, _ in known), default=0)
    reach_us = max((last - origin for _, last in known), default=0) / 1000
    us = exact_micros if reach_us >= WHOLE_NS_LIMIT_US else micros
    return MergePlan(ranks, shift, origin, analysis, cells, steps, estimate, notes, us)


def _own_clock_cells(analysis: Analysis | None) -> pl.DataFrame | None:
    """The analysis's cells back on each rank's own clock, where the traces' slices are."""
    if analysis is None:
        return None
    offsets = applied_offsets(analysis)
    offset = pl.col("rank").replace_strict(offsets, default=0, return_dtype=pl.Int64)
    return analysis.cells.with_columns(pl.col("start_ns", "end_ns") - offset)


def _limits(steps: tuple[int, ...] | None, ranks: list[int]) -> str:
    which = f"steps {shown(steps)}" if steps is not None else "all steps"
    return f"{which} of ranks {shown(ranks)}" + (" (limited by --steps/--ranks)" if steps is not None else "")
