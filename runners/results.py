"""`python -m runners.results RUN_DIR...`: a small markdown table from run.json files (torch- and polars-free,
so it runs on the GPU machine, which has neither polars nor network).

Per run: the formula bubble (the schedule's order at unit times: runners.schedules.bubble_formula), the
unprofiled step time, and the busiest rank's full-batch
compute (the calibrated F+B of the stages the schedule places on it: the seed's m*t_slot at full-batch
efficiency), whose complement `1 - compute / step` is the seed experiment's measured bubble; it includes
the small-GEMM slowdown, which analysis/ then separates out (its summary.json's bubble_measured is added
when present).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runners.rundir import is_complete
from runners.schedules import Schedule, bubble_formula, build

COLUMNS = (
    "run",
    "device",
    "schedule",
    "p",
    "m",
    "v",
    "rows/mb",
    "step ms",
    "full-batch compute ms",
    "bubble formula",
    "1 - compute/step",
    "analysis bubble",
    "run s",
)


def busiest_rank_compute_ms(calibration: dict[str, dict[str, float]], schedule: Schedule) -> float:
    """Max over ranks of the sum of its stages' full-batch F+B, each stage on the rank the schedule's
    placement gives it (stage s on rank s % p, or in a V for zbv and dualpipev)."""
    per_rank = [0.0] * schedule.p
    for stage, times in calibration.items():
        per_rank[schedule.rank_of(int(stage))] += times["F_ms"] + times["B_ms"]
    return max(per_rank)


def row(run_dir: Path) -> dict:
    config = json.loads((run_dir / "run.json").read_text())
    p, m, v = config["p"], config["m"], config["v"]
    step_ms = config["step_time_unprofiled_ms"]
    schedule = build(config["schedule"], p, m, v)
    compute_ms = busiest_rank_compute_ms(config["calibration"], schedule)
    summary_path = run_dir / "analysis" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {
        "run": run_dir.name,
        "device": config["host"].get("gpu", config["device"]),
        "schedule": config["schedule"],
        "p": p,
        "m": m,
        "v": v,
        "rows/mb": config["dims"]["microbatch_rows"][0],
        "step ms": step_ms,
        "full-batch compute ms": compute_ms,
        "bubble formula": bubble_formula(schedule),
        "1 - compute/step": 1 - compute_ms / step_ms,
        "analysis bubble": summary.get("bubble_measured"),
        "run s": sum(config.get("phases_s", {}).values()),
    }


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def markdown_table(columns: tuple[str, ...], rows: list[dict]) -> str:
    """A markdown table of `columns` (missing values shown as -); the benchmark report uses it too."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def table(rows: list[dict]) -> str:
    return markdown_table(COLUMNS, rows)


def main(argv: list[str]) -> int:
    complete = []
    for path in dict.fromkeys(Path(arg).resolve() for arg in argv):  # traces/latest repeats a run
        if is_complete(path):
            complete.append(path)
        else:
            print(f"skipped {path}: no complete run.json", file=sys.stderr)
    rows = sorted((row(path) for path in complete), key=lambda r: (r["schedule"], r["p"], r["v"], r["m"]))
    sys.stdout.write(table(rows))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
