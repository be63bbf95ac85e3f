"""`python -m runners.seed_table RUN_DIR...`: the seed experiment's tables from run directories alone
(torch-, polars- and msgspec-free: it runs on the GPU machine, where scripts/gpu_check.sh calls it).

The seed table, one row per pipelined run (p > 1): t_slot is the busiest rank's F + B of one microbatch
timed alone at the run's microbatch size (run.json's calibration_by_rows), the step the median
unprofiled step, bubble theory the schedule's formula bubble and bubble measured the seed's
1 - m * t_slot / step (so the small-GEMM loss counts as bubble there; the analysis splits it out). The
small-GEMM curve, from a P=1 run: t_slot at every calibrated microbatch size, and m * t_slot. Each
run's CUDA allocator peak is the largest `PP cuda step peak` of its trace files (one per GPU: in mode
single_gpu one trace holds every stage).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from runners.results import busiest_rank_compute_ms, markdown_table
from runners.rundir import is_complete
from runners.schedules import bubble_formula, build
from runners.schedules.trace_names import CUDA_PEAK_COUNTER

SEED_COLUMNS = (
    "p",
    "m",
    "rows/mb",
    "t_slot ms",
    "m*t_slot ms",
    "step ms",
    "bubble theory",
    "bubble measured",
    "mode",
    "peak MiB",
)
CURVE_COLUMNS = ("rows/mb", "m", "F ms", "B ms", "t_slot ms", "m*t_slot ms")
MIB = 2**20


def t_slot_ms(config: dict, rows: int) -> float:
    """The busiest rank's F + B of one microbatch of `rows` rows, timed alone."""
    at_rows = {stage: by_rows[str(rows)] for stage, by_rows in config["calibration_by_rows"].items()}
    return busiest_rank_compute_ms(at_rows, build(config["schedule"], config["p"], config["m"], config["v"]))


def peak_mib(run_dir: Path) -> float | None:
    """The largest CUDA allocator step peak of the run's traces, MiB (None without the counter)."""
    peaks = [
        event["args"]["peak_bytes_above_step_start"]
        for path in sorted(run_dir.glob("rank*.json.gz"))
        for event in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        if event.get("ph") == "C" and event.get("name") == CUDA_PEAK_COUNTER
    ]
    return max(peaks) / MIB if peaks else None


def seed_row(run_dir: Path) -> dict:
    config = json.loads((run_dir / "run.json").read_text())
    m, rows = config["m"], config["dims"]["microbatch_rows"][0]
    slot, step = t_slot_ms(config, rows), config["step_time_unprofiled_ms"]
    return {
        "p": config["p"],
        "m": m,
        "rows/mb": rows,
        "t_slot ms": slot,
        "m*t_slot ms": m * slot,
        "step ms": step,
        "bubble theory": bubble_formula(build(config["schedule"], config["p"], m, config["v"])),
        "bubble measured": 1 - m * slot / step,
        "mode": config.get("mode"),
        "peak MiB": peak_mib(run_dir),
    }


def curve_rows(run_dir: Path) -> list[dict]:
    """A P=1 run's t_slot at every calibrated microbatch size, largest first; m is the batch's rows over
    the size (the m whose microbatches have that many rows)."""
    config = json.loads((run_dir / "run.json").read_text())
    by_rows = config["calibration_by_rows"]["0"]
    rows = []
    for size in sorted(map(int, by_rows), reverse=True):
        times, m = by_rows[str(size)], config["dims"]["rows"] // size
        slot = times["F_ms"] + times["B_ms"]
        rows.append(
            {
                "rows/mb": size,
                "m": m,
                "F ms": times["F_ms"],
                "B ms": times["B_ms"],
                "t_slot ms": slot,
                "m*t_slot ms": m * slot,
            }
        )
    return rows


def tables(run_dirs: list[Path]) -> str:
    """The seed table of the pipelined runs and the curve of each P=1 run, as markdown."""
    configs = {path: json.loads((path / "run.json").read_text()) for path in run_dirs}
    pipelined = sorted(
        (p for p, c in configs.items() if c["p"] > 1), key=lambda p: (configs[p]["p"], configs[p]["m"])
    )
    text = "## seed table\n\n" + markdown_table(SEED_COLUMNS, [seed_row(path) for path in pipelined])
    for path in (p for p, c in configs.items() if c["p"] == 1):
        text += f"\n## small-GEMM curve (P=1, {path.name})\n\n" + markdown_table(
            CURVE_COLUMNS, curve_rows(path)
        )
    return text


def main(argv: list[str]) -> int:
    complete = [path for path in dict.fromkeys(Path(arg).resolve() for arg in argv) if is_complete(path)]
    if not complete:
        print("no complete run directory among the arguments", file=sys.stderr)
        return 1
    sys.stdout.write(tables(complete))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
