"""One rank's trace integrity: how many of its events a viewer or the analysis cannot take as written, by
kind, from the loaded trace alone (its frame and what the loader kept). analysis.ranks.tables carries the
counts in RankInput; nothing here judges whether a rank can be trusted.

A slice is a complete event ("X", or a "B"/"E" pair the loader folded into one) of the file: rows the
analysis derived (analysis.cells.virtual_ranks) have no `index` and are left out. A slice's track is its
(pid, tid), as a viewer lays tracks out; a device slice whose tid is no integer (the 2021 format's
"stream 7") is on its args' stream, the same track; other slices whose pid or tid is no integer are on no
track the frame can tell, and only outside_steps counts them. Each count is of events:

- overlapping_slices: slices that start inside another slice of their track and end after it (p.start <
  s.start < p.end < s.end). The Chrome trace format wants a track's slices nested, and Perfetto drops such
  a slice as it loads the trace (google/perfetto#4280, its slice_drop_overlapping_complete_event). Device
  streams count as threads do: Perfetto lays a stream out as one track and drops a kernel there just the
  same (kernels that overlap under programmatic dependent launch vanish, janestreet/perfetto#35).
- overrunning_slices: device work (kernels, copies, memsets) whose end passes the start of the next work
  on its stream, by start. A stream runs its work one at a time, so such a duration is not as written
  (AMD-AGI/TraceLens#669: deferred completion timestamps, a kernel reported seconds long over the dozens
  after it, which a sum of durations counts again and again), unless the next kernel was launched to
  start early (programmatic dependent launch, which the count cannot tell). It counts the slice whose
  duration runs on, whether the ones after it nest in it or not; overlapping_slices counts the later
  slice a viewer drops, and only where it does not nest: a kernel that swallows its successors counts
  here alone, and of two kernels that overlap in part, the first counts here and the second there. Host
  threads have none: a call holds its callees.
- string_timestamps: events whose ts or dur the file wrote as a JSON string (RawTrace.string_times),
  read as the numbers they write: a file's count (the virtual ranks of one single-GPU file each carry it).
- outside_steps: slices wholly outside every ProfilerStep#N span of the host, where the trace has any
  (0 where it has none). A device slice is placed by its launch, the start of the runtime call with its
  correlation id: the device runs behind the host, so the kernels launched late in step N run after
  ProfilerStep#N ends, and by their own times the last step's would be outside it in every healthy GPU
  trace. A device slice without a launch in the trace (GPU-side annotations, which copy the host's) is
  not placed.
- missing_kernels: runtime launches (cudaLaunchKernel and its kin, `LAUNCHES`) whose correlation id no
  kernel, copy or memset of the trace carries: the work they issued is missing, as the first kernels of
  each profiling session are where CUPTI stamps them on another clock and they fall out of the trace
  (pytorch/pytorch#192021). A CPU trace has no launches: 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import msgspec
import numpy as np
import polars as pl

from analysis.traces.kineto import DEVICE_TRACK_CATS, DEVICE_WORK_CATS, STEP_PREFIX
from analysis.traces.load import RawTrace

# The runtime and driver calls that issue device work, as CUDA and HIP name them (Holistic Trace
# Analysis's list, with the launches it lacks: cuLaunchKernelEx, cooperative, module and graph launches).
LAUNCHES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cudaLaunchCooperativeKernel",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipMemcpyAsync",
    "hipMemsetAsync",
    "hipMemcpyWithStream",
    "cudaGraphLaunch",  # a graph's kernels carry its launch's correlation id
    "hipGraphLaunch",
)


class Integrity(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's trace integrity: counts of events a viewer or the analysis cannot take as written."""

    events: int  # the file's events, what the counts are shares of
    overlapping_slices: int
    overrunning_slices: int
    string_timestamps: int
    outside_steps: int
    missing_kernels: int

    def total(self) -> int:
        """Every event counted, once per count it is in."""
        return sum(getattr(self, name) for name in PROBLEMS)


# Integrity's counts, in its order.
PROBLEMS = ("overlapping_slices", "overrunning_slices", "string_timestamps", "outside_steps", "missing_kernels")


def integrity_of(trace: RawTrace) -> Integrity:
    """The counts of the module's docstring, for one loaded trace."""
    slices = _slices(trace.frame)
    tracks = _Tracks.of(slices)
    return Integrity(
        events=trace.frame.height,
        overlapping_slices=tracks.not_nesting(),
        overrunning_slices=tracks.of_work().overrunning(),
        string_timestamps=trace.string_times,
        outside_steps=_outside_steps(slices),
        missing_kernels=_missing_kernels(slices),
    )


def _slices(frame: pl.DataFrame) -> pl.DataFrame:
    """The file's complete events: pid, tid (a device slice's stream where its tid is no integer),
    start_ns, end_ns, name, correlation, device (on a device track), work (a kernel, copy or memset)."""
    categories = frame["cat"].unique().drop_nulls().to_list()
    device = pl.col("cat").is_in([c for c in categories if c.lower() in DEVICE_TRACK_CATS]).fill_null(False)
    work = pl.col("cat").is_in([c for c in categories if c.lower() in DEVICE_WORK_CATS]).fill_null(False)
    complete = (pl.col("ph") == "X") & pl.col("index").is_not_null()
    return (
        frame.lazy()  # (the filter then gathers only the columns selected)
        .filter(complete)
        .select(
            "pid",
            pl.when(device).then(pl.coalesce("tid", "stream")).otherwise("tid").alias("tid"),
            "start_ns",
            "end_ns",
            "name",
            "correlation",
            device=device,
            work=work,
        )
        .collect()
    )


@dataclass(frozen=True)
class _Tracks:
    """Slices on a track, as numpy arrays ordered by (pid, tid, end). numpy: polars has no search within
    groups, and its sort by (pid, tid, end) took over ten times numpy's lexsort here."""

    pid: np.ndarray
    tid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    work: np.ndarray

    @classmethod
    def of(cls, slices: pl.DataFrame) -> _Tracks:
        placed = slices.select("pid", "tid", "start_ns", "end_ns", "work").drop_nulls(["pid", "tid"])
        columns = [placed[name].to_numpy() for name in placed.columns]
        order = np.lexsort((columns[3], columns[1], columns[0]))
        return cls(*(column[order] for column in columns))

    def of_work(self) -> _Tracks:
        return _Tracks(*(getattr(self, field.name)[self.work] for field in fields(self)))

    def cuts(self) -> np.ndarray:
        """Where each track after the first begins."""
        return np.flatnonzero((self.pid[1:] != self.pid[:-1]) | (self.tid[1:] != self.tid[:-1])) + 1

    def not_nesting(self) -> int:
        """Slices s with a slice p of their track such that p.start < s.start < p.end < s.end. Of a
        track's slices by end, those that end inside s (after its start, before its end) are one run
        [lo, hi), and s nests unless one of them starts before it: a range minimum, answered for every
        slice at once from a sparse table built a power of two at a time."""
        start, end, cuts = self.start, self.end, self.cuts()
        lo = np.empty(len(end), dtype=np.int64)
        for first, last in zip(np.r_[0, cuts], np.r_[cuts, len(end)]):  # tracks, not rows
            lo[first:last] = np.searchsorted(end[first:last], start[first:last], "right") + first
        runs = np.ones(len(end), dtype=bool)  # where a track's run of one end begins: the first at it
        runs[1:] = end[1:] != end[:-1]
        runs[cuts] = True
        hi = np.maximum.accumulate(np.where(runs, np.arange(len(end)), 0))
        inside = np.flatnonzero(hi > lo)  # slices others end inside
        lo, hi, own = lo[inside], hi[inside], start[inside]
        level = np.log2(hi - lo).astype(np.int64)  # the largest power of two within each run
        by_level = np.split(np.argsort(level, kind="stable"), np.cumsum(np.bincount(level))[:-1])
        table, found = start, 0  # table[i]: the least start of the 2**k slices from i on
        for k, rows in enumerate(by_level):
            if k:
                table = np.minimum(table[: -(1 << (k - 1))], table[1 << (k - 1) :])
            least = np.minimum(table[lo[rows]], table[hi[rows] - (1 << k)])
            found += int(np.count_nonzero(least < own[rows]))
        return found

    def overrunning(self) -> int:
        """Slices that end after the next one on their track starts."""
        order = np.lexsort((self.end, self.start, self.tid, self.pid))
        pid, tid, start, end = self.pid[order], self.tid[order], self.start[order], self.end[order]
        same_track = (pid[1:] == pid[:-1]) & (tid[1:] == tid[:-1])
        return int(np.count_nonzero(same_track & (end[:-1] > start[1:])))


def _outside_steps(slices: pl.DataFrame) -> int:
    """Slices wholly outside the union of the host's ProfilerStep#N spans (0 without steps); a device
    slice at its launch (outside where one with its correlation id is), one without a launch not at all."""
    host = slices.filter(~pl.col("device"))
    steps = host.filter(pl.col("name").str.starts_with(STEP_PREFIX)).sort("start_ns")
    if steps.is_empty():
        return 0
    opens = (pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1)).fill_null(True)  # after all before it
    union = steps.group_by(opens.cum_sum().alias("window")).agg(
        pl.col("start_ns").min(), pl.col("end_ns").max()
    )
    windows = union.sort("start_ns")
    host_out = _outside(windows, host["start_ns"].to_numpy(), host["end_ns"].to_numpy())
    calls = host.filter(pl.col("correlation").is_not_null())
    launch_at = calls["start_ns"].to_numpy()
    late = calls["correlation"].filter(_outside(windows, launch_at, launch_at))
    device_out = slices.filter(pl.col("device") & pl.col("correlation").is_in(late.implode()))
    return int(np.count_nonzero(host_out)) + device_out.height


def _outside(windows: pl.DataFrame, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Whether each span [first, last] (a point where they are equal) meets none of the `windows`
    (start_ns, end_ns: sorted, disjoint)."""
    starts, ends = windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy()
    before = np.searchsorted(starts, first, "right") - 1  # the last window opened at or before it
    within = (before >= 0) & (ends[np.maximum(before, 0)] > first)
    after = before + 1  # the next window, which it may reach into
    reaches = (after < len(starts)) & (starts[np.minimum(after, len(starts) - 1)] < last)
    return ~within & ~reaches


def _missing_kernels(slices: pl.DataFrame) -> int:
    """Runtime launches whose correlation id no device work carries."""
    issued = slices.filter("work")["correlation"].drop_nulls()
    launches = slices.filter(~pl.col("device") & pl.col("name").is_in(LAUNCHES))["correlation"].drop_nulls()
    return int((~launches.is_in(issued.implode())).sum())
