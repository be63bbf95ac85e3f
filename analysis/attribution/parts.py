"""Per-rank parts of the step that close exactly on the step time, and each compute cell's split.

A compute cell's busy time (its span within its step window, less the idle gaps inside it: on CPU
the time between its operators, on GPU the time no compute kernel ran) is cut the seed's way, from
the reference durations (analysis.attribution.reference): `compute`, the work at full-batch
efficiency; `small_gemm`, the same work in isolation at the cell's own microbatch size beyond that
share (m*t_slot(m) - t_slot(1), 0 at m = 1 by definition); `slowdown`, busy time beyond the isolated
work (what running inside the pipeline adds; it may be negative). Without the isolated times the last
two are unknown (null) and compute is all the busy time.

Per rank and step the step time is cut into those three and the idle time of each gap class, plus the
stretch by which this rank's window is shorter than the step's longest, classed as
analysis.timeline.classify.shortfall says. The rank's busy time is its window less its gaps (`busy`,
not a part); compute and small_gemm are its cells' sums, and slowdown is the busy time beyond the cells'
isolated work: the term that closes the split, named for what it is (with cells that do not overlap it
is the sum of their slowdowns).
"""

from __future__ import annotations

import polars as pl

from analysis.attribution.reference import Reference
from analysis.schema import GAP_CLASSES, RANK_PARTS, RankEntry
from analysis.timeline.classify import SHORTFALL, shortfall
from analysis.vocabulary import Part
from runners.schedules import COMPUTE_KINDS, Schedule

NS_PER_MS = 1e6
SUB_PARTS = ("cpu_contention", "dp_skew")  # of slowdown, of dp_sync


def idle_before(times: pl.DataFrame, gaps: pl.DataFrame) -> pl.Series:
    """Per row of `times` (rank, t_ns): the rank's idle ns before t_ns, in row order.

    Gaps of a rank are disjoint, so a running sum of their lengths and one as-of join answer it.
    """
    length = pl.col("end_ns") - pl.col("start_ns")
    running = gaps.sort("rank", "start_ns").select(
        "rank",
        t_ns="start_ns",
        gap_start="start_ns",
        gap_end="end_ns",
        before=length.cum_sum().over("rank") - length,
    )
    found = (
        times.with_row_index("row")
        .sort("t_ns")
        .join_asof(running, on="t_ns", by="rank", check_sortedness=False)
    )
    inside = pl.min_horizontal("t_ns", "gap_end") - pl.col("gap_start")
    return found.sort("row").select((pl.col("before") + inside).fill_null(0))["before"]


def with_busy(cells: pl.DataFrame, gaps: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """`cells` with busy_ns: a compute cell's span within its step window less the idle gaps inside it
    (null for transfer cells)."""
    bounds = windows.select("rank", "step", w0="start_ns", w1="end_ns")
    clipped = cells.join(bounds, on=["rank", "step"], how="left", maintain_order="left").with_columns(
        a=pl.max_horizontal("start_ns", "w0"), b=pl.min_horizontal("end_ns", "w1")
    )
    # the idle time before each cell's clipped start, then before its end: one as-of join for both
    idle_at = idle_before(pl.concat([clipped.select("rank", t_ns=end) for end in ("a", "b")]), gaps)
    idle = idle_at.slice(cells.height) - idle_at.slice(0, cells.height)
    compute = pl.col("kind").is_in(COMPUTE_KINDS)
    busy = pl.when(compute).then((pl.col("b") - pl.col("a")).clip(lower_bound=0) - idle)
    return clipped.with_columns(busy_ns=busy.cast(pl.Float64)).select(*cells.columns, "busy_ns")


def cell_parts(cells: pl.DataFrame, ref: Reference) -> pl.DataFrame:
    """`cells` (with busy_ns) with compute_ns, small_gemm_ns and slowdown_ns (null for transfer cells; the
    last two also where the isolated time is unknown)."""
    joined = cells.with_row_index("row").join(ref.table, on=["stage", "kind", "microbatch"], how="left")
    known = pl.col("kind").is_in(COMPUTE_KINDS) & pl.col("isolated_ns").is_not_null()
    return joined.sort("row").select(
        *cells.columns,
        compute_ns=pl.when(known).then("full_ns").otherwise("busy_ns"),
        small_gemm_ns=pl.when(known).then(pl.col("isolated_ns") - pl.col("full_ns")),
        slowdown_ns=pl.when(known).then(pl.col("busy_ns") - pl.col("isolated_ns")),
    )


def with_contention(cells: pl.DataFrame, samples: pl.DataFrame) -> pl.DataFrame:
    """`cells` (with busy_ns) with cpu_contention_ns: of the run-queue delay across a compute cell (its
    last run-queue sample less its first: the executor samples at each action's start and end,
    analysis.traces.runqueue), the share its busy time is of its span less blocked time, taken as spread
    evenly over the action; null on ranks without samples. `samples` on the cells' clock."""
    points = samples.sort("t_ns")
    indexed = cells.with_row_index("row")
    compute = indexed.filter(pl.col("kind").is_in(COMPUTE_KINDS))

    def sample(frame: pl.DataFrame, at: str, name: str, strategy: str) -> pl.DataFrame:
        """Each row with the rank's sample nearest `at` on the `strategy` side: `name`_t and `name`."""
        named = points.rename({"t_ns": f"{name}_t", "run_delay_ns": name})
        return frame.sort(at).join_asof(
            named, left_on=at, right_on=f"{name}_t", by="rank", strategy=strategy, check_sortedness=False
        )

    both = sample(sample(compute, "start_ns", "first", "forward"), "end_ns", "last", "backward")
    inside = (pl.col("first_t") <= pl.col("last_t")) & (pl.col("last_t") <= pl.col("end_ns"))
    occupied = pl.col("end_ns") - pl.col("start_ns") - pl.col("blocked_ns")
    share = pl.when(occupied > 0).then((pl.col("busy_ns") / occupied).clip(0.0, 1.0)).otherwise(0.0)
    sampled = samples.select("rank").unique().with_columns(sampled=pl.lit(True))
    delay = both.join(sampled, on="rank", how="left").select(
        "row",
        cpu_contention_ns=pl.when(pl.col("sampled"))
        .then(pl.when(inside).then((pl.col("last") - pl.col("first")) * share).otherwise(0.0))
        .cast(pl.Float64),
    )
    return indexed.join(delay, on="row", how="left").sort("row").drop("row")


def rank_parts(
    cells: pl.DataFrame, gaps: pl.DataFrame, windows: pl.DataFrame, skews: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Per (rank, step): step_ns, busy and the RANK_PARTS in ns, summing to step_ns (small_gemm and
    slowdown null where unknown), and the sub-parts cpu_contention and dp_skew (`skews`: rank, step,
    dp_skew; analysis.timeline.dp_sync). `cells` carry cell_parts' columns."""
    window = shortfall(windows)
    idle = gaps.group_by("rank", "step").agg(
        (pl.col("end_ns") - pl.col("start_ns")).filter(pl.col("class") == name).sum().alias(name)
        for name in GAP_CLASSES
    )
    unknown = pl.col("small_gemm_ns").is_null().any()
    work = (
        cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
        .group_by("rank", "step")
        .agg(
            full=pl.col("compute_ns").sum(),
            small_gemm=pl.when(~unknown).then(pl.col("small_gemm_ns").sum()),
            cpu_contention=pl.when(pl.col("cpu_contention_ns").is_not_null().any()).then(
                pl.col("cpu_contention_ns").sum()
            ),
        )
    )
    busy = pl.col("window_ns") - pl.sum_horizontal(GAP_CLASSES)
    parts = (
        window.join(idle, on=["rank", "step"], how="left")
        .fill_null(0)
        .join(work, on=["rank", "step"], how="left")
        .join(_skews(skews), on=["rank", "step"], how="left")
        .with_columns(
            busy=busy.cast(pl.Float64),
            **{klass: pl.col(klass) + pl.col(piece) for piece, klass in SHORTFALL.items()},
            dp_skew=pl.col("dp_skew").fill_null(0).cast(pl.Float64),
        )
        .with_columns(
            compute=pl.when(pl.col(Part.SMALL_GEMM).is_not_null()).then("full").otherwise("busy"),
            slowdown=pl.col("busy") - pl.col("full") - pl.col(Part.SMALL_GEMM),
        )
    )
    return parts.select("rank", "step", "step_ns", "busy", *SUB_PARTS, *RANK_PARTS).sort("step", "rank")


def _skews(skews: pl.DataFrame | None) -> pl.DataFrame:
    if skews is None:
        return pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "dp_skew": pl.Float64})
    return skews.select("rank", "step", pl.col("dp_skew").cast(pl.Float64))


def median_step(parts: pl.DataFrame) -> int:
    """The step whose time is the median, the lower one for an even count: a step that happened, so its
    parts close exactly."""
    per_step = parts.group_by("step").agg(pl.col("step_ns").first()).sort("step_ns", "step")
    return int(per_step["step"][(per_step.height - 1) // 2])


def rank_entries(parts: pl.DataFrame, schedule: Schedule, peaks: dict[int, int]) -> list[RankEntry]:
    """One step's rows of `rank_parts` as summary entries in ms; `peaks`: rank -> peak activation bytes."""
    return [
        RankEntry(
            rank=row["rank"],
            stage_ids=list(schedule.stages_of(row["rank"])),
            peak_activation_bytes=peaks.get(row["rank"]),
            busy_ms=row["busy"] / NS_PER_MS,
            cpu_contention_ms=None if row["cpu_contention"] is None else row["cpu_contention"] / NS_PER_MS,
            dp_skew_ms=row["dp_skew"] / NS_PER_MS,
            **{f"{part}_ms": None if row[part] is None else row[part] / NS_PER_MS for part in RANK_PARTS},
        )
        for row in parts.sort("rank").iter_rows(named=True)
    ]


def in_ms(parts: pl.DataFrame) -> pl.DataFrame:
    """ranks.parquet: every analysed step's parts per rank, in ms (step_ms, <part>_ms)."""
    return parts.with_columns(pl.col("step_ns", "busy", *SUB_PARTS, *RANK_PARTS) / NS_PER_MS).rename(
        {
            "step_ns": "step_ms",
            "busy": "busy_ms",
            **{part: f"{part}_ms" for part in SUB_PARTS},
            **{part: f"{part}_ms" for part in RANK_PARTS},
        }
    )
