"""The loader's own figures: MB/s of uncompressed JSON on one core, and peak
memory over the uncompressed size. Targets: at least 100 MB/s, under 3x.

Each sample loads one trace file with analysis.traces.load.read_trace in a fresh process with
POLARS_MAX_THREADS=1. Speed is CPU time (time.process_time, every thread of the process counted), not
wall time: the machine is shared, and wall time would measure the neighbours. Memory is the process's
high-water RSS minus its RSS just before the load (the interpreter and imports), over the uncompressed
size; the whole high-water mark over the size is reported beside it.

    python -m bench.load FILE... [--repeats 5]
Bench files of realistic shape: bench.traceset.replicate_run (e.g. a real trace from
tests/data/real-traces replicated to 84 MB and 500 MB).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.child import status_kib
from bench.stats import stats, verdict

MB = 1_000_000
TARGET_MB_PER_S = 100.0
TARGET_MEMORY_RATIO = 3.0


def rss_kib() -> int:
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def sample(path: Path) -> dict:
    """One timed load in this process (call it in a fresh one: the high-water mark is per process)."""
    from analysis.traces.load import read_trace

    before_kib = rss_kib()
    began = time.process_time()
    trace = read_trace(path)
    cpu_s = time.process_time() - began
    peak_kib = status_kib("VmHWM")
    data = path.read_bytes()
    size = len(gzip.decompress(data)) if data[:2] == b"\x1f\x8b" else len(data)
    return {
        "cpu_s": cpu_s,
        "bytes": size,
        "events": trace.frame.height,
        "added_kib": peak_kib - before_kib,
        "peak_kib": peak_kib,
    }


def _child(path: Path) -> dict:
    env = os.environ | {"POLARS_MAX_THREADS": "1"}
    command = [sys.executable, "-m", "bench.load", "--sample", str(path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{path}: load failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_load(path: Path, repeats: int = 5) -> dict:
    """MB/s and memory ratios of `repeats` fresh-process loads of one file: median, range, verdict."""
    samples = [_child(path) for _ in range(repeats)]
    size = samples[0]["bytes"]
    speed = stats([size / MB / s["cpu_s"] for s in samples])
    added = stats([s["added_kib"] * 1024 / size for s in samples])
    whole = stats([s["peak_kib"] * 1024 / size for s in samples])
    return {
        "file": str(path),
        "mb": size / MB,
        "events": samples[0]["events"],
        "cpu_s": stats([s["cpu_s"] for s in samples]).to_json(),
        "mb_per_s": speed.to_json()
        | {"target": TARGET_MB_PER_S, "verdict": verdict(speed, TARGET_MB_PER_S, lower_is_better=False)},
        "memory_ratio": added.to_json()
        | {"target": TARGET_MEMORY_RATIO, "verdict": verdict(added, TARGET_MEMORY_RATIO)},
        "memory_ratio_with_interpreter": whole.to_json(),
        "load_average": os.getloadavg(),
    }


def _line(figures: dict) -> str:
    speed, memory = figures["mb_per_s"], figures["memory_ratio"]
    return (
        f"{figures['file']}: {figures['mb']:.1f} MB, {figures['events']} events; "
        f"{speed['median']:.1f} MB/s ({speed['min']:.1f}-{speed['max']:.1f}, {speed['verdict']}); "
        f"peak memory {memory['median']:.2f}x ({memory['min']:.2f}-{memory['max']:.2f}, {memory['verdict']}), "
        f"{figures['memory_ratio_with_interpreter']['median']:.2f}x with the interpreter; "
        f"load average {figures['load_average'][0]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sample", action="store_true", help="(internal) one load in this process, as JSON")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.sample:
        print(json.dumps(sample(args.files[0])))
        return 0
    for path in args.files:
        figures = measure_load(path, args.repeats)
        print(json.dumps(figures) if args.json else _line(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
