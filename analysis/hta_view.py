"""Holistic Trace Analysis's figures of a run beside ours: `python -m analysis hta RUN` and the run page.

`run_hta` runs HTA (package hta, the `[hta]` extra) on the run's rank traces and keeps, per rank, the
numbers HTA users know: the temporal breakdown (idle, compute, non-compute), the comm/compute overlap,
the idle-time breakdown per stream (host_wait, kernel_wait, other) and the top kernels. They go to
RUN/hta.json (`write`, `read`), so the report shows them without running HTA. hta is imported inside
`run_hta` only: it takes seconds to import and reconfigures logging, which no other command should pay.

The two views cover different windows and count different things, so they are compared where they can
be made to measure the same: HTA reads every kernel launched up to the end of the last ProfilerStep
(include_last_profiler_step: by default it drops the last step, which we analyse); ours are summed over
the analysed steps and, for idle, clipped to the compute stream's first-to-last compute kernel, which is
HTA's per-stream window (`ours_beside`). `QUANTITIES` pairs the figures, each with why they may differ;
`verdict` says in one line where they agree and where not.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import msgspec
import polars as pl

from analysis.cells.labelled import device_events, is_gpu
from analysis.errors import InputError, printable
from analysis.files import write_atomically
from analysis.results import Analysis
from analysis.schema import GAP_CLASSES
from analysis.traces import limits
from analysis.traces.run import load_run
from analysis.traces.run_files import HTA_FILE
from analysis.traces.source import read_text
from analysis.traces.toplevel import NESTED_TOO_DEEPLY
from runners.schedules import COMPUTE_KINDS

TOP_KERNELS = 5
KERNEL_NAME_CHARS = 80  # kernel names are C++ signatures of hundreds of characters
RESOLUTION_NS = 1  # ours are whole nanoseconds, HTA's floats of microseconds
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")  # HTA's, as get_idle_time_breakdown names them
INSTALL_HINT = "pip install -e '.[hta]'"
WINDOWS = (
    "HTA: every kernel launched up to the end of the last ProfilerStep, the whole trace where it has fewer "
    "than two; ours: the analysed steps, idle on the compute stream between its first and last compute kernel"
)


class StreamIdle(msgspec.Struct):
    """HTA's idle-time breakdown of one stream: the gaps between its consecutive kernels, ms."""

    stream: int
    host_wait_ms: float
    kernel_wait_ms: float
    other_ms: float

    @property
    def total_ms(self) -> float:
        return self.host_wait_ms + self.kernel_wait_ms + self.other_ms


class Kernel(msgspec.Struct):
    name: str
    kernel_type: str  # HTA's: COMPUTATION, COMMUNICATION, MEMORY
    total_ms: float


class HtaRank(msgspec.Struct):
    """One rank as HTA sees it. span: first to last kernel on any stream; idle: no kernel on any stream;
    compute: HTA's compute kernels (all but NCCL and memory) running; non-compute: the rest of the span."""

    rank: int
    rounding_ms: float  # the most HTA's rounding of this trace's kernel times can move its busy or idle
    compute_stream: int | None  # the stream that ran the most non-NCCL kernel time (ours to pick)
    span_ms: float
    idle_ms: float
    compute_ms: float
    non_compute_ms: float
    overlap_pct: float | None  # share of communication kernel time overlapped by compute; None: no comm
    streams: list[StreamIdle]
    top_kernels: list[Kernel]

    def percent(self, ms: float) -> float:
        return 100 * ms / self.span_ms if self.span_ms else 0.0

    @property
    def compute_stream_idle(self) -> StreamIdle | None:
        return next((s for s in self.streams if s.stream == self.compute_stream), None)


class HtaFigures(msgspec.Struct):
    hta_version: str
    ranks: list[HtaRank]
    ranks_without_kernels: list[int]  # left out: HTA's breakdowns need kernels


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
        lambda o: o.idle_ms["launch_overhead"],
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


def short_name(name: str) -> str:
    """A kernel's name from the trace as one short line (control characters escaped)."""
    name = printable(name)
    return name if len(name) <= KERNEL_NAME_CHARS else name[: KERNEL_NAME_CHARS - 1] + "…"


@contextmanager
def _quiet() -> Iterator[None]:
    """HTA logs every file it parses to stdout and pandas warns on its calls: neither is for the user."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


@dataclass(frozen=True)
class _RankTrace:
    path: Path
    rounding_ms: float
    compute_stream: int | None


def _rank_traces(run_dir: Path) -> tuple[dict[int, _RankTrace], list[int]]:
    """The ranks with GPU kernels (the loader says which files are rank traces), and those without."""
    with_kernels, without = {}, []
    for rank, trace in enumerate(load_run(run_dir).traces):
        if not is_gpu(trace.frame):
            without.append(rank)
            continue
        events = device_events(trace.frame)
        # HTA rounds each kernel's start up and its end down to a whole microsecond of the trace's ts (a
        # float when it has ns digits): the kernel shrinks by the two fractions, its busy union by their sum
        # at most, and the idle beside it grows by as much.
        fraction = [(pl.col(edge) - trace.base_ns) % 1000 for edge in ("start_ns", "end_ns")]
        rounding_ns = events.select(((1000 - fraction[0]) % 1000 + fraction[1]).sum()).item()
        compute = (
            events.filter(~pl.col("is_p2p"))
            .group_by("stream")
            .agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum())
            .sort("ns", "stream", descending=[True, False])
        )
        stream = compute["stream"][0] if compute.height else None
        with_kernels[rank] = _RankTrace(trace.path, rounding_ns / 1e6, stream)
    return with_kernels, without


def run_hta(run_dir: Path) -> HtaFigures:
    """HTA's breakdowns of the run's rank traces. InputError when hta is missing, the run has no GPU
    kernels (a CPU run), or HTA fails on the traces (its error, in one line)."""
    with _quiet():
        try:
            from hta.trace_analysis import TraceAnalysis
        except ModuleNotFoundError:
            raise InputError(
                None, f"python -m analysis hta needs Holistic Trace Analysis: {INSTALL_HINT}"
            ) from None
    traces, without = _rank_traces(run_dir)
    if not traces:
        raise InputError(
            run_dir,
            "no GPU kernels in the rank traces (a CPU run): HTA's temporal, idle-time and kernel "
            "breakdowns are of GPU kernels and do not apply",
        )
    version = metadata.version("holistictraceanalysis")
    with _quiet():
        try:
            # trace_files, not trace_dir: HTA would parse every *.json[.gz] there (merged.json.gz too) and
            # number ranks by its own reading; these are the loader's rank traces under our rank numbers
            analysis = TraceAnalysis(
                trace_files={rank: str(t.path.resolve()) for rank, t in traces.items()},
                include_last_profiler_step=True,
            )
            temporal = analysis.get_temporal_breakdown(visualize=False)
            overlap = analysis.get_comm_comp_overlap(visualize=False)
            idle, _ = analysis.get_idle_time_breakdown(ranks=sorted(traces), visualize=False)
            _, kernels = analysis.get_gpu_kernel_breakdown(
                visualize=False, duration_ratio=1.0, num_kernels=TOP_KERNELS, include_memory_kernels=True
            )
        except Exception as error:  # a third-party tool failing on input we read: one line, not its traceback
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
            raise InputError(
                run_dir,
                f"Holistic Trace Analysis {version} failed on the traces: {type(error).__name__}: {first}",
            ) from error
    ranks = [_hta_rank(rank, traces[rank], temporal, overlap, idle, kernels) for rank in sorted(traces)]
    return HtaFigures(version, ranks, without)


def _hta_rank(rank: int, trace: _RankTrace, temporal, overlap, idle, kernels) -> HtaRank:
    """One rank's rows of HTA's pandas frames, in ms."""
    times = temporal[temporal["rank"] == rank].iloc[0]
    overlap_pct = float(overlap[overlap["rank"] == rank]["comp_comm_overlap_pctg"].iloc[0])
    streams = []
    mine = idle[idle["rank"] == rank]
    for stream, rows in mine.groupby("stream"):
        us = dict(zip(rows["idle_category"], rows["idle_time"]))
        streams.append(StreamIdle(int(stream), *(float(us.get(c, 0.0)) / 1000 for c in IDLE_CATEGORIES)))
    top = kernels[(kernels["rank"] == rank) & (kernels["name"] != "others")].nlargest(TOP_KERNELS, "sum (us)")
    return HtaRank(
        rank=rank,
        rounding_ms=trace.rounding_ms,
        compute_stream=trace.compute_stream,
        span_ms=float(times["kernel_time(us)"]) / 1000,
        idle_ms=float(times["idle_time(us)"]) / 1000,
        compute_ms=float(times["compute_time(us)"]) / 1000,
        non_compute_ms=float(times["non_compute_time(us)"]) / 1000,
        overlap_pct=None if math.isnan(overlap_pct) else overlap_pct,  # NaN: no communication kernels
        streams=streams,
        top_kernels=[
            Kernel(str(name), str(kind), float(us) / 1000)
            for name, kind, us in zip(top["name"], top["kernel_type"], top["sum (us)"])
        ],
    )


def write(run_dir: Path, figures: HtaFigures) -> Path:
    target = Path(run_dir) / HTA_FILE
    write_atomically(target, msgspec.json.format(msgspec.json.encode(figures)) + b"\n")
    return target


def read(run_dir: Path) -> HtaFigures | None:
    """RUN/hta.json; None where `python -m analysis hta` has not written one, InputError where unreadable."""
    path = Path(run_dir) / HTA_FILE
    if not path.is_file():
        return None
    try:  # bounded as run.json is: the report reads whatever lies in a run directory
        return msgspec.json.decode(read_text(path, limits.RUN_JSON_BYTES).data, type=HtaFigures)
    except RecursionError:
        raise InputError(path, f"not readable JSON ({NESTED_TOO_DEEPLY})") from None
    except msgspec.DecodeError as error:
        raise InputError(path, f"not readable: {error}; python -m analysis hta writes it again") from None
