"""What the analysis keeps of one rank's trace: small tables, computed from that rank's frame alone.

`rank_input` is a pure function of one loaded trace (analysis.traces.load.RawTrace): its cells, the
waits and the device timeline inside them (analysis.cells), the collective events the clock alignment
reads (analysis.timeline.clock), its memory events placed in its steps (analysis.traces.memory), its
run-queue samples (analysis.traces.runqueue), its process groups and data-parallel collectives (for a
job of several pipelines: analysis.traces.layout, analysis.timeline.dp_sync), where nothing else will
say which ranks form the pipelines, its p2p peers (analysis.traces.comms), and how sound its trace is
(analysis.traces.integrity: what a viewer or the analysis cannot take as written, counted). The event
frame is not kept: it is the bulk of a trace's memory, and nothing across ranks needs it, so a run's
ranks can be read one at a time or in separate processes (analysis.ranks.pool) and only these tables
meet in analysis.job.measure.analyze_pipeline.

Every table carries its rank in a `rank` column; `renumbered` moves all of them to another rank number
(a pipeline of a bigger job read as ranks 0..p-1). Groups and peers name global ranks and stay so.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import msgspec
import polars as pl

from analysis.cells.inferred import cells_of
from analysis.cells.labelled import RankCells, rank_events
from analysis.timeline.clock import collective_events
from analysis.timeline.dp_sync import collectives, is_collective
from analysis.traces.comms import comm_groups, p2p_peers
from analysis.traces.integrity import Integrity, integrity_of
from analysis.traces.kineto import RECORD_PARAM_COMMS
from analysis.traces.layout import Group, groups_of, is_dp_group, is_pipeline_group
from analysis.traces.load import RawTrace
from analysis.traces.memory import memory_events, with_steps
from analysis.traces.runqueue import run_queue_samples
from analysis.trust.evidence import CommCensus, census_of


@dataclass(frozen=True)
class RankInput:
    rank: int
    source: Path  # the trace file, named in warnings and errors
    cells: RankCells
    collectives: pl.DataFrame  # its collective events (analysis.timeline.clock.collective_events)
    on_gpu: bool  # the trace holds kernels
    memory: pl.DataFrame  # analysis.traces.memory.EVENT_SCHEMA + step: the memory events in its steps
    samples: pl.DataFrame  # analysis.traces.runqueue.SAMPLE_SCHEMA
    integrity: Integrity  # its trace's integrity problems, counted (analysis.traces.integrity)
    groups: tuple[Group, ...]  # its process groups (distributedInfo.pg_config)
    group_collectives: (
        pl.DataFrame
    )  # its collectives with their groups (analysis.timeline.dp_sync.collectives)
    peers: frozenset[int]  # global ranks its p2p ops name; empty where they were not wanted
    census: CommCensus  # its p2p calls, kernels, labels and collectives: is the job a pipeline
    # its cells were inferred from the op stream or read from phase labels (analysis.cells.phases), which
    # take a rank's one stage to be its rank number
    stage_is_rank: bool = False

    def renumbered(self, rank: int) -> RankInput:
        """The same rank's tables under the rank number `rank`."""
        number = pl.lit(rank, dtype=pl.Int64).alias("rank")
        tables = {
            f.name: getattr(self, f.name).with_columns(number)
            for f in fields(self)
            if isinstance(getattr(self, f.name), pl.DataFrame)
        }

        def moved(frame: pl.DataFrame) -> pl.DataFrame:
            if "rank" in frame.columns:
                frame = frame.with_columns(number)
            if self.stage_is_rank and "stage" in frame.columns:  # the inference's stage is the rank's
                frame = frame.with_columns(
                    pl.col("stage").replace_strict({self.rank: rank}, default=pl.col("stage"))
                )
            return frame

        return replace(self, rank=rank, cells=self.cells.map(moved), **tables)


def pipelines_said(config: dict | None, alone: bool) -> bool:
    """The pipelines are known without the trace: run.json's pipelines say them, and so does its dp
    of 1 (1 when absent), or the trace is the run's only one."""
    return alone or (config is not None and ("pipelines" in config or config.get("dp", 1) == 1))


def _wants_peers(trace: RawTrace, config: dict | None, alone: bool) -> bool:
    if pipelines_said(config, alone):
        return False
    groups = groups_of(trace.header.get("distributedInfo"))
    return not any(is_pipeline_group(g.name) or is_dp_group(g.name) for g in groups)


def one_pipeline(config: dict | None, alone: bool) -> bool:
    """The run is one pipeline: its only trace, or run.json's dp of 1 with no pipelines listed. Else its
    record_param_comms args are read (read_trace's `comms`), for the groups and maybe the peers."""
    return alone or (config is not None and config.get("dp", 1) == 1 and "pipelines" not in config)


def _wants_groups(frame: pl.DataFrame, config: dict | None, alone: bool) -> bool:
    """A trace of a job that may have several pipelines, with collectives and record_param_comms."""
    if one_pipeline(config, alone):
        return False
    said = pl.col("name") == RECORD_PARAM_COMMS
    return frame.select(said.any() & is_collective(pl.col("name")).any()).item()


def without_events(trace: RawTrace) -> RawTrace:
    """The trace without its JSON text (the largest part of it after the frame), its frame and its
    counter table: what crosses processes once the tables are made (load_run checks the rest)."""
    return replace(
        trace,
        events_json=msgspec.Raw(),
        metadata={},
        frame=trace.frame.clear(),
        counters=trace.counters.clear(),
    )


def rank_input(trace: RawTrace, config: dict | None = None, alone: bool = True) -> RankInput:
    """One rank's tables from its loaded trace (whose rank is known), in a run of run.json `config`,
    `alone` when it is the run's only trace. Its record_param_comms ops give the p2p peers where the
    pipelines are not said otherwise, and the groups of its collectives where it may have several."""
    frame = trace.frame
    peers = p2p_peers(trace.comms, trace.rank) if _wants_peers(trace, config, alone) else set()
    said = comm_groups(trace.comms) if _wants_groups(frame, config, alone) else None
    groups = groups_of(trace.header.get("distributedInfo"))
    events = rank_events(frame)
    cells = cells_of(frame, trace.path, events)
    return RankInput(
        rank=trace.rank,
        source=trace.path,
        cells=cells,
        collectives=collective_events(frame),
        on_gpu=events.device is not None,
        memory=with_steps(memory_events(trace), events.steps),
        samples=run_queue_samples(trace),
        integrity=integrity_of(trace),
        groups=groups,
        group_collectives=collectives(frame, said, groups),
        peers=frozenset(peers),
        census=census_of(frame, cells),
        # PP labels name their stages; phase labels and the op-stream inference (every cell inferred) do not
        stage_is_rank=cells.phase_labels or (cells.cells.height > 0 and bool(cells.cells["inferred"].all())),
    )
