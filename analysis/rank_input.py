"""What the analysis keeps of one rank's trace: small tables, computed from that rank's frame alone.

`rank_input` is a pure function of one loaded trace (analysis.traces.load.RawTrace): its cells, the
waits and the device timeline inside them (analysis.cells), the collective events the clock alignment
reads (analysis.timeline.clock), its memory events placed in its steps (analysis.traces.memory) and its
run-queue samples (analysis.traces.runqueue). The event frame is not kept: it is the bulk of a trace's
memory, and nothing across ranks needs it, so a run's ranks can be read one at a time or in separate
processes (analysis.fanout) and only these tables meet in analysis.pipeline.analyze_run.

Every table carries its rank in a `rank` column; `renumbered` moves all of them to another rank number
(a pipeline of a bigger job read as ranks 0..p-1).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import msgspec
import polars as pl

from analysis.cells.inferred import cells_of
from analysis.cells.labelled import RankCells, is_gpu, step_spans
from analysis.timeline.clock import collective_events
from analysis.traces.load import RawTrace
from analysis.traces.memory import MEMORY_EVENTS, events_at, memory_events, with_steps
from analysis.traces.runqueue import RUN_QUEUE_EVENTS, run_queue_samples


@dataclass(frozen=True)
class RankInput:
    rank: int
    source: Path  # the trace file, named in warnings and errors
    cells: RankCells
    collectives: pl.DataFrame  # its collective events (analysis.timeline.clock.collective_events)
    on_gpu: bool  # the trace holds kernels
    memory: pl.DataFrame  # analysis.traces.memory.EVENT_SCHEMA + step: the memory events in its steps
    samples: pl.DataFrame  # analysis.traces.runqueue.SAMPLE_SCHEMA

    def renumbered(self, rank: int) -> RankInput:
        """The same rank's tables under the rank number `rank`."""
        number = pl.lit(rank, dtype=pl.Int64).alias("rank")
        tables = {
            f.name: getattr(self, f.name).with_columns(number)
            for f in fields(self)
            if isinstance(getattr(self, f.name), pl.DataFrame)
        }
        cells = self.cells.map(lambda frame: frame.with_columns(number) if "rank" in frame.columns else frame)
        return replace(self, rank=rank, cells=cells, **tables)


def counter_args(trace: RawTrace) -> dict[int, msgspec.Raw]:
    """The JSON of the few events whose args the memory and run-queue tables read, by index, decoded
    again in one pass (the frame keeps no args)."""
    return events_at(trace, trace.frame.filter(MEMORY_EVENTS | RUN_QUEUE_EVENTS)["index"].to_list())


def without_text(trace: RawTrace) -> RawTrace:
    """The trace without its JSON text (the largest part of it after the frame) once counter_args has
    read what the tables need of it."""
    return replace(trace, events_json=msgspec.Raw(), metadata={})


def rank_input(trace: RawTrace, raw: dict[int, msgspec.Raw] | None = None) -> RankInput:
    """One rank's tables from its loaded trace (whose rank is known); `raw`: its counter_args, where
    they were read before its text was dropped."""
    frame = trace.frame
    raw = counter_args(trace) if raw is None else raw
    return RankInput(
        rank=trace.rank,
        source=trace.path,
        cells=cells_of(frame, trace.path),
        collectives=collective_events(frame),
        on_gpu=is_gpu(frame),
        memory=with_steps(memory_events(trace, raw), step_spans(frame)),
        samples=run_queue_samples(trace, raw),
    )
