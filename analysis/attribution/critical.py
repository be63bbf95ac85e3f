"""The critical path of each analysed step, from its own replay (analysis.attribution.replay), and each
compute cell's slack.

The path is the chain of inputs that sets the replayed step: cells' work, host time, transfers and
tails, across ranks (a receive whose partner posted last hands the path to the sender's rank). Its
segments tile the replay from the step's origin to its end, so their total is the own replay's
makespan: the measured step less the completeness residual. A cell's work is one segment, part
`compute` (its split into compute, small_gemm and slowdown is in cells.parquet); a transfer is `hop`;
host time is `launch_overhead`; a tail's parts keep their names.
"""

from __future__ import annotations

from collections import defaultdict

import polars as pl

from analysis.attribution.replay import Replayed
from analysis.schema import CriticalShare

CRITICAL_SCHEMA = {
    "step": pl.Int64,
    "rank": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "part": pl.Utf8,
    "stage": pl.Int64,
    "kind": pl.Utf8,
    "microbatch": pl.Int64,
}


def critical_table(replays: dict[int, Replayed], origins: dict[int, int]) -> pl.DataFrame:
    """critical.parquet: one row per segment of each step's path, on the cells' clock (`origins`: each
    step's origin, where its replay starts)."""
    rows = [
        (
            step,
            segment.rank,
            origins[step] + round(segment.start),
            origins[step] + round(segment.end),
            segment.part,
            *(
                (None, None, None)
                if segment.action is None
                else (segment.action.stage, segment.action.kind.value, segment.action.microbatch)
            ),
        )
        for step, replayed in sorted(replays.items())
        for segment in replayed.path
    ]
    return pl.DataFrame(rows, schema=CRITICAL_SCHEMA, orient="row")


def composition(replayed: Replayed) -> list[CriticalShare]:
    """The path's ms per (part, stage), largest first."""
    totals: dict[tuple[str, int | None], float] = defaultdict(float)
    for segment in replayed.path:
        stage = None if segment.action is None else segment.action.stage
        totals[(segment.part, stage)] += segment.end - segment.start
    shares = [CriticalShare(part=part, stage=stage, ms=ns / 1e6) for (part, stage), ns in totals.items()]
    return sorted(shares, key=lambda share: -share.ms)


def with_slack(cells: pl.DataFrame, replays: dict[int, Replayed]) -> pl.DataFrame:
    """`cells` with slack_ns: how much a compute cell's work could grow before its step's own replay
    grows (null for transfer cells and steps not replayed)."""
    rows = [
        (step, a.stage, a.kind.value, a.microbatch, ns)
        for step, replayed in replays.items()
        for a, ns in replayed.slack.items()
    ]
    slack = pl.DataFrame(
        rows,
        schema={
            "step": pl.Int64,
            "stage": pl.Int64,
            "kind": pl.Utf8,
            "microbatch": pl.Int64,
            "slack_ns": pl.Float64,
        },
        orient="row",
    )
    return cells.join(slack, on=["step", "stage", "kind", "microbatch"], how="left", maintain_order="left")
