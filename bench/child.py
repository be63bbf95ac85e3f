"""`python -m bench.child TASK DIR`: one timed load of a trace set, in its own process.

Each task runs in a fresh process so its peak RSS is its own (the parent reads it from wait4). The
time printed is the work alone, after the imports; the parent also records the whole process's wall.
    analyze   our `analyze` end to end: traces -> cells, gaps, summary.json and parquet on disk
    hta       Holistic Trace Analysis: TraceAnalysis(trace_dir=DIR), its load alone
    decode    the floor: read the bytes and decode them into typed structs (analysis.traces.kineto)
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path


def analyze(directory: Path, schedule: str | None, m: int | None) -> tuple[float, int]:
    from analysis.job import analyze_job
    from analysis.pipeline import read_run
    from analysis.results import write

    began = time.perf_counter()
    result = analyze_job(read_run(directory), schedule=schedule, m=m)
    write(directory, result)
    return began, result.cells.height


def hta(directory: Path, _schedule: str | None, _m: int | None) -> tuple[float, int]:
    from hta.trace_analysis import TraceAnalysis

    began = time.perf_counter()
    loaded = TraceAnalysis(trace_dir=str(directory))
    return began, sum(len(frame) for frame in loaded.t.traces.values())


def decode(directory: Path, _schedule: str | None, _m: int | None) -> tuple[float, int]:
    from analysis.traces import kineto
    from analysis.traces.load import trace_files

    began = time.perf_counter()
    gc.disable()  # as the loader does: decoded JSON has no cycles to collect
    count = 0
    for path in trace_files(directory):
        top = kineto.TOP_LEVEL.decode(path.read_bytes())
        count += len(kineto.EVENTS.decode(top["traceEvents"]))
    return began, count


def high_water_kib() -> int:
    """This process's peak RSS since exec (ru_maxrss would include the forking parent's)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


TASKS = {"analyze": analyze, "hta": hta, "decode": decode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.child", description=__doc__)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--schedule")
    parser.add_argument("--m", type=int)
    args = parser.parse_args(argv)
    began, rows = TASKS[args.task](args.directory, args.schedule, args.m)
    seconds = time.perf_counter() - began
    print(
        json.dumps({"task": args.task, "seconds": seconds, "rows": rows, "rss_mb": high_water_kib() / 1024})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
