"""`python -m bench.child TASK DIR`: one timed load of a trace set, in its own process.

Each task runs in a fresh process so its peak RSS is its own (the parent reads it from wait4). The
time printed is the work alone, after the imports; the parent also records the whole process's wall.
    analyze   our `analyze` end to end: traces -> cells, gaps, summary.json and parquet on disk, its
              ranks read by `--jobs` processes at most (analysis.ranks.workers: default one per core),
              or on `--cluster` (analysis.ranks.cluster: no processes of this one's are said); also the
              seconds of it spent in every step's own replay and critical path (REPLAY_CALLS)
    hta       Holistic Trace Analysis: TraceAnalysis(trace_dir=DIR), its load alone (its own pool)
    decode    the floor: every file decoded into typed structs of ph, name, cat, ts, dur, pid, tid, id
              (args raw), a gzip file inflated first by the analysis's codec, one process per core
    merge     our `merge`: DIR/analysis/ (written by analyze) and the traces -> DIR/merged.json.gz
Each prints the processes it read the ranks with; the limits are the defaults (they follow the memory
available, per file: analysis.traces.limits), so a set they refuse is a failed run.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec


@dataclass(frozen=True)
class Started:
    """When a task's work began (after its imports), this process's CPU time then, and the RSS it began with
    (the interpreter and the imports: the fixed part of its peak)."""

    seconds: float
    cpu_seconds: float
    rss_kib: int


def started() -> Started:
    return Started(time.perf_counter(), time.process_time(), status_kib("VmRSS"))


# analysis.job.measure's calls that replay every step from its own inputs and read its critical path
# (the slack and critical.parquet): timed by wrapping them here, so analyze itself carries no timing code
REPLAY_CALLS = ("replay_all", "with_slack", "critical_table")


def timed(module, names: tuple[str, ...]) -> list[float]:
    """Wrap `module`'s functions `names` so that the seconds spent in them add up in the list returned."""
    spent = [0.0]

    def wrapped(function):
        def call(*args, **kwargs):
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - began

        return call

    for name in names:
        setattr(module, name, wrapped(getattr(module, name)))
    return spent


def analyze(args: argparse.Namespace) -> tuple[Started, int, int | None]:
    from analysis.job import measure
    from analysis.job.join import analyze_job
    from analysis.job.run_dir import read_run
    from analysis.ranks import cluster, workers
    from analysis.results import write
    from analysis.traces.run_files import trace_files

    replay = timed(measure, REPLAY_CALLS)
    began = started()
    with workers.applied(args.jobs), cluster.applied(args.cluster):
        processes = None if args.cluster else workers.pool_size(trace_files(args.directory))
        result = analyze_job(read_run(args.directory), schedule=args.schedule, m=args.m)
    write(args.directory, result)
    EXTRA["replay_seconds"] = replay[0]
    return began, result.cells.height, processes


def hta(args: argparse.Namespace) -> tuple[Started, int, int]:
    import multiprocessing.pool

    from hta.trace_analysis import TraceAnalysis

    sizes = [1]  # the processes of the pool HTA parses the ranks in (none: this one)
    start = multiprocessing.pool.Pool.__init__

    def counted(pool, processes=None, *rest, **named):
        sizes.append(processes or 1)
        start(pool, processes, *rest, **named)

    multiprocessing.pool.Pool.__init__ = counted
    began = started()
    loaded = TraceAnalysis(trace_dir=str(args.directory))
    return began, sum(len(frame) for frame in loaded.t.traces.values()), max(sizes)


class FloorEvent(msgspec.Struct, gc=False):
    """What the floor decodes of every event, typed as the loader types it (analysis.traces.kineto);
    args stay raw."""

    ph: str
    name: str = ""
    cat: str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: msgspec.Raw = msgspec.Raw()


_FLOOR_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
_FLOOR_EVENTS = msgspec.json.Decoder(list[FloorEvent])


def _floor_file(path: Path) -> int:
    """One file's events decoded as the floor decodes them: their count. A gzip file is inflated first, in
    one call, by the codec the analysis inflates with (analysis.traces.source: isal's, else zlib), so the
    floor and ours pay the same for it."""
    from analysis.traces.source import GZIP_MAGIC, gzip_member

    gc.disable()  # as the loader does: decoded JSON has no cycles to collect
    data = path.read_bytes()
    if data[:2] == GZIP_MAGIC:
        data = gzip_member().decompress(data)  # (one member: the sets bench.traceset writes)
    return len(_FLOOR_EVENTS.decode(_FLOOR_TOP_LEVEL.decode(data)["traceEvents"]))


def decode(args: argparse.Namespace) -> tuple[Started, int, int]:
    """The floor: every file decoded into typed structs of ph, name, cat, ts, dur, pid, tid, id (args
    raw), the files spread over one process per core as ours are (a forkserver pool, largest first)."""
    import multiprocessing
    import os

    from analysis.traces.run_files import trace_files

    began = started()
    files = sorted(trace_files(args.directory), key=lambda path: path.stat().st_size, reverse=True)
    processes = max(1, min(len(files), len(os.sched_getaffinity(0))))
    with multiprocessing.get_context("forkserver").Pool(processes) as pool:
        count = sum(pool.imap_unordered(_floor_file, files, chunksize=1))
    return began, count, processes


def merge(args: argparse.Namespace) -> tuple[Started, int, int]:
    from analysis.cli import main as cli

    began = started()
    out = args.directory / "merged.json.gz"
    if cli(["merge", str(args.directory), "--out", str(out)]) != 0:
        raise SystemExit("merge failed")
    return began, out.stat().st_size, 1


def status_kib(key: str) -> int:
    """A memory figure of this process (VmHWM: its peak RSS since exec, which ru_maxrss is not: it
    includes the forking parent's; VmRSS: now)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith(f"{key}:"))


EXTRA: dict[str, float] = {}  # figures a task reports besides the common ones

TASKS = {"analyze": analyze, "hta": hta, "decode": decode, "merge": merge}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.child", description=__doc__)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--schedule")
    parser.add_argument("--m", type=int)
    parser.add_argument("--jobs", type=int, help="analyze: processes at most (default: one per core)")
    parser.add_argument("--cluster", help="analyze: on a Dask cluster (local:N or a scheduler's address)")
    args = parser.parse_args(argv)

    began, rows, processes = TASKS[args.task](args)
    seconds = time.perf_counter() - began.seconds
    print(
        json.dumps(
            {
                "task": args.task,
                "seconds": seconds,
                "cpu_seconds": time.process_time() - began.cpu_seconds,
                "rows": rows,
                "rss_mb": status_kib("VmHWM") / 1024,
                "started_rss_mb": began.rss_kib / 1024,
                "processes": processes,
            }
            | EXTRA
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
