"""Holistic Trace Analysis's figures of a run (analysis.hta.run, kept in RUN/hta.json by
analysis.hta.figures) beside ours: `python -m analysis hta RUN` and the run page.

The two views cover different windows and count different things, so they are compared where they can
be made to measure the same: HTA reads every kernel launched up to the end of the last ProfilerStep
(include_last_profiler_step: by default it drops the last step, which we analyse); ours are summed over
the analysed steps and, for idle, clipped to the compute stream's first-to-last compute kernel, which is
HTA's per-stream window (`ours_beside`). `QUANTITIES` pairs the figures, each with why they may differ;
`verdict` says in one line where they agree and where not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from analysis.hta.figures import IDLE_CATEGORIES, HtaFigures, HtaRank
from analysis.results import Analysis
from analysis.schema import GAP_CLASSES
from analysis.vocabulary import GapClass
from runners.schedules import COMPUTE_KINDS

RESOLUTION_NS = 1  # ours are whole nanoseconds, HTA's floats of microseconds
WINDOWS = (
    "HTA: every kernel launched up to the end of the last ProfilerStep, the whole trace where it has fewer "
    "than two; ours: the analysed steps, idle on the compute stream between its first and last compute kernel"
)


@dataclass(frozen=True)
class OursRank:
    """Ours over the analysed steps: busy time, and the idle gaps by class clipped to the compute stream's
    first-to-last compute kernel (HTA's window for a stream), ms."""

    busy_ms: float
    idle_ms: dict[str, float]  # GAP_CLASSES -> ms

    @property
    def idle_total_ms(self) -> float:
        return sum(self.idle_ms.values())


@dataclass(frozen=True)
class Field:
    """One column of the side-by-side table: header (unit in brackets), meaning, and its value."""

    header: str
    meaning: str
    value: Callable


def _idle_of(category: str) -> Callable[[HtaRank], float | None]:
    def value(rank: HtaRank) -> float | None:
        stream = rank.compute_stream_idle
        return None if stream is None else getattr(stream, f"{category}_ms")

    return value


HTA_FIELDS = (
    Field("HTA span (ms)", "HTA's kernel time: first to last kernel on any stream", lambda r: r.span_ms),
    Field("HTA idle (ms)", "no kernel running on any stream (temporal breakdown)", lambda r: r.idle_ms),
    Field("HTA idle (%)", "idle / span", lambda r: r.percent(r.idle_ms)),
    Field("HTA compute (ms)", "compute kernels (all but NCCL and memory) running", lambda r: r.compute_ms),
    Field("HTA compute (%)", "compute / span", lambda r: r.percent(r.compute_ms)),
    Field(
        "HTA non-compute (ms)",
        "only NCCL or memory kernels running: a receive waiting for its peer is here, not idle",
        lambda r: r.non_compute_ms,
    ),
    Field("HTA non-compute (%)", "non-compute / span", lambda r: r.percent(r.non_compute_ms)),
    Field(
        "HTA overlap (%)",
        "communication kernel time with a compute kernel running (— = no communication kernels)",
        lambda r: r.overlap_pct,
    ),
    Field("compute stream", "the stream that ran the most non-NCCL kernel time", lambda r: r.compute_stream),
    *(
        Field(
            f"HTA {category} (ms)",
            f"HTA's idle-time breakdown of the compute stream: {meaning}",
            _idle_of(category),
        )
        for category, meaning in zip(
            IDLE_CATEGORIES,
            (
                "the next kernel's launch call began after the stream went idle",
                "a gap shorter than HTA's consecutive_kernel_delay (30 us)",
                "the next kernel was launched but waited (an event, a peer)",
            ),
        )
    ),
)
OURS_FIELDS = (
    Field(
        "ours busy (ms)",
        "compute kernels of the schedule's compute cells running, summed over the analysed steps",
        lambda o: o.busy_ms,
    ),
    *(
        Field(
            f"ours {kind} (ms)",
            f"our {kind} on the compute stream between its first and last compute kernel, analysed steps",
            lambda o, kind=kind: o.idle_ms[kind],
        )
        for kind in GAP_CLASSES
    ),
)


@dataclass(frozen=True)
class Quantity:
    """A figure both sides measure over the same window, and why their numbers may still differ."""

    name: str
    hta: Callable[[HtaRank], float | None]
    ours: Callable[[OursRank], float]
    differs_because: str


def _compute_stream_idle(rank: HtaRank) -> float | None:
    stream = rank.compute_stream_idle
    return None if stream is None else stream.total_ms


QUANTITIES = (
    Quantity(
        "compute (HTA) vs busy (ours)",
        lambda r: r.compute_ms,
        lambda o: o.busy_ms,
        "HTA counts every kernel it keeps but NCCL and memory copies as compute (gpu_user_annotation too "
        "where it carries a stream); we count the compute kernels inside the schedule's F/B/I/W cells of the "
        "analysed steps (the optimizer's and any other work outside the schedule are our other)",
    ),
    Quantity(
        "idle on the compute stream",
        _compute_stream_idle,
        lambda o: o.idle_total_ms,
        "HTA's is every gap between consecutive kernels from the stream's first kernel it keeps to its last, "
        "whatever they run; ours runs from the first to the last compute cell's kernel and counts the stream "
        "not running a compute cell's kernel, so work outside the schedule is busy to HTA, idle (other) to us",
    ),
    Quantity(
        "host_wait (HTA) vs launch_overhead (ours)",
        _idle_of("host_wait"),
        lambda o: o.idle_ms[GapClass.LAUNCH_OVERHEAD],
        "HTA calls a whole gap host wait when the next kernel's launch call began after the stream went "
        "idle; we end it at the launch call's end (the rest is queued: analysis.timeline.classify."
        "device_idle), and idle while a receive waits is bubble or p2p_wait to us, whatever the host did",
    ),
)


@dataclass(frozen=True)
class Pair:
    quantity: Quantity
    rank: int
    hta_ms: float
    ours_ms: float
    tolerance_ms: float

    @property
    def agrees(self) -> bool:
        return abs(self.hta_ms - self.ours_ms) <= self.tolerance_ms


def pairs(figures: HtaFigures, ours: dict[int, OursRank]) -> list[Pair]:
    """Every quantity on every rank both sides have, with HTA's rounding as the tolerance."""
    found = []
    for rank in figures.ranks:
        if rank.rank not in ours:
            continue
        tolerance = rank.rounding_ms + RESOLUTION_NS / 1e6
        for quantity in QUANTITIES:
            theirs = quantity.hta(rank)
            if theirs is not None:
                found.append(Pair(quantity, rank.rank, theirs, quantity.ours(ours[rank.rank]), tolerance))
    return found


def comparable(figures: HtaFigures, ours: dict[int, OursRank]) -> bool:
    """Whether a rank number names the same trace on both sides (HTA reads one trace per rank)."""
    return {rank.rank for rank in figures.ranks} | set(figures.ranks_without_kernels) == set(ours)


def verdict(figures: HtaFigures, ours: dict[int, OursRank]) -> str:
    """One line: the quantities that agree on every rank, and for the others the largest difference and why."""
    if not comparable(figures, ours):
        return (
            f"Not compared: HTA read {len(figures.ranks) + len(figures.ranks_without_kernels)} rank trace(s), "
            f"our analysis has {len(ours)} rank(s), so a rank number does not name the same process on both sides."
        )
    found = pairs(figures, ours)
    agree, differ = [], []
    for quantity in QUANTITIES:
        mine = [pair for pair in found if pair.quantity is quantity]
        if not mine:
            continue
        if all(pair.agrees for pair in mine):
            agree.append(quantity.name)
            continue
        worst = max(mine, key=lambda pair: abs(pair.hta_ms - pair.ours_ms))
        differ.append(
            f"{quantity.name} on {sum(not pair.agrees for pair in mine)} of {len(mine)} ranks (most on rank "
            f"{worst.rank}: HTA {worst.hta_ms:.3f} ms, ours {worst.ours_ms:.3f} ms): {quantity.differs_because}"
        )
    line = []
    if agree:
        line.append(
            "Agree on every rank, within what HTA's rounding of kernel times to whole microseconds can move "
            f"(at most {max(rank.rounding_ms for rank in figures.ranks):.3f} ms a rank): {', '.join(agree)}."
        )
    if differ:
        line.append(f"Differ: {'; '.join(differ)}.")
    return " ".join(line) or "No rank has figures on both sides."


def ours_beside(analysis: Analysis) -> dict[int, OursRank]:
    """Our figures per rank over HTA's windows: busy summed over the analysed steps, idle by class clipped
    to the rank's first-to-last compute kernel (a compute cell's span on GPU is its kernels')."""
    spans = (
        analysis.cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
        .group_by("rank")
        .agg(first=pl.col("start_ns").min(), last=pl.col("end_ns").max())
    )
    inside = pl.min_horizontal("end_ns", "last") - pl.max_horizontal("start_ns", "first")
    idle = (
        analysis.gaps.join(spans, on="rank")
        .group_by("rank", "class")
        .agg(ms=inside.clip(lower_bound=0).sum() / 1e6)
    )
    by_class: dict[int, dict[str, float]] = {}
    for rank, kind, ms in idle.iter_rows():
        by_class.setdefault(rank, dict.fromkeys(GAP_CLASSES, 0.0))[kind] = ms
    busy = analysis.parts.group_by("rank").agg(pl.col("busy_ms").sum())
    return {
        rank: OursRank(ms, by_class.get(rank, dict.fromkeys(GAP_CLASSES, 0.0)))
        for rank, ms in busy.iter_rows()
    }


def shown(value: float | int | None) -> str:
    """A table cell: ms and % to three decimals, stream numbers as they are, — for none."""
    if value is None:
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
