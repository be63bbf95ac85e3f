"""The analysis of a PP x DP job at scale: a synthetic job (synthetic.data_parallel, one slower replica
and an exposed gradient sync) analysed end to end in fresh processes (`python -m bench.child analyze`),
its time and peak RSS, and whether it recovered the straggler and every rank's dp_sync exactly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from bench.process import run_child
from bench.stats import stats
from runners.schedules import build
from synthetic.data_parallel import write_job

SLOW_FACTOR, SYNC_US = 1.2, 500.0
TIMEOUT_S = 600.0


def dp_scale(
    workdir: Path, p: int, dp: int, m: int, shape: str, repeats: int, repo: Path, say: Callable[[str], None]
) -> dict:
    directory = workdir / f"dp-{shape}-p{p}-dp{dp}-m{m}"
    slow = dp // 2
    job = write_job(
        directory,
        build("1f1b", p, m),
        dp,
        slow_pipeline=slow,
        slow_factor=SLOW_FACTOR,
        sync_us=SYNC_US,
        shape=shape,
        p2p_latency_us=50,
        launch_gap_us=10,
    )
    say(f"dp: analysing {p * dp} ranks (p={p} x dp={dp}, m={m}, {shape}), {repeats} times")
    runs = [run_child("analyze", [str(directory)], TIMEOUT_S, repo) for _ in range(repeats)]
    done = [run for run in runs if run.status == "ok"]
    result = {
        "p": p,
        "dp": dp,
        "m": m,
        "shape": shape,
        "trace_mb": sum(f.stat().st_size for f in directory.glob("rank*.json.gz")) / 2**20,
        "runs": [run.to_json() for run in runs],
    }
    if not done:
        return result
    summary = json.loads((directory / "analysis" / "summary.json").read_text())
    error_ms = max(
        abs(entry[f"{part}_ms"] - getattr(job.truth[entry["rank"]], f"{part}_ns") / 1e6)
        for entry in summary["ranks"]
        for part in ("dp_sync", "dp_skew")
    )
    return result | {
        "work_s": stats([run.work_s for run in done]).to_json(),
        "wall_s": stats([run.wall_s for run in done]).to_json(),
        "peak_rss_mb": stats([run.peak_rss_mb for run in done]).to_json(),
        "straggler_found": summary["straggler"]["pipeline"] == slow,
        "dp_sync_max_error_ms": error_ms,
    }
