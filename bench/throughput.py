"""Part 1: analysis throughput on a large trace set: ours vs HTA vs plain typed decoding (the floor).

For each size the set is generated once (bench.traceset), then decode and analyze alternate
in fresh processes `repeats` times (so load drifts hit both alike) and HTA loads it once, capped by a
timeout: it is slow. Ratios pair each analyze with the decode next to it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.process import ChildRun, run_child
from bench.stats import stats, verdict
from bench.traceset import TraceSet, replicate_run

MB = 1_000_000
TARGETS = {"hta_over_ours": 20.0, "ours_over_decode": 2.0, "rss_over_size": 3.0}


@dataclass(frozen=True)
class ThroughputPlan:
    source: Path  # a run directory with PP labels to replicate
    sizes_mb: tuple[float, ...]  # smallest first; growth is read from the first to the last
    repeats: int
    hta_timeout_s: float
    workdir: Path  # generated sets live here and are deleted after their size is measured
    repo: Path  # where the children run (the analysis package must import)


def _hints(source: Path) -> list[str]:
    """The source's schedule and m, so analyze need not infer them (HTA would read run.json as a trace)."""
    try:
        config = json.loads((source / "run.json").read_text())
    except (OSError, ValueError):
        return []
    return ["--schedule", config["schedule"], "--m", str(config["m"])]


def _ok(runs: list[ChildRun]) -> list[ChildRun]:
    return [run for run in runs if run.status == "ok"]


def _task_figures(runs: list[ChildRun]) -> dict:
    done = _ok(runs)
    figures = {"runs": [run.to_json() for run in runs], "status": runs[0].status if not done else "ok"}
    if done:
        figures |= {
            "work_s": stats([r.work_s for r in done]).to_json(),
            "wall_s": stats([r.wall_s for r in done]).to_json(),
            "peak_rss_mb": stats([r.peak_rss_mb for r in done]).to_json(),
            "tree_rss_mb": stats([r.tree_rss_mb for r in done]).to_json(),
        }
    else:
        figures["detail"] = runs[0].detail
        figures["tree_rss_mb_at_stop"] = runs[0].tree_rss_mb
    return figures


def _ratios(trace_set: TraceSet, runs: dict[str, list[ChildRun]]) -> dict:
    ours, floor, hta = _ok(runs["analyze"]), _ok(runs["decode"]), _ok(runs["hta"])
    ratios = {}
    if ours and floor:
        ratios["ours_over_decode"] = stats([a.work_s / d.work_s for a, d in zip(ours, floor)])
    if ours:
        ratios["rss_over_size"] = stats([a.peak_rss_mb * 2**20 / trace_set.bytes for a in ours])
    if ours and hta:
        ratios["hta_over_ours"] = stats([h.work_s / a.work_s for h in hta for a in ours])
    lower = {"hta_over_ours": False}
    return {
        name: figure.to_json()
        | {"target": TARGETS[name], "verdict": verdict(figure, TARGETS[name], lower.get(name, True))}
        for name, figure in ratios.items()
    }


def measure_size(plan: ThroughputPlan, trace_set: TraceSet, progress: Callable[[str], None]) -> dict:
    target = trace_set.path
    progress(
        f"throughput: {trace_set.bytes / MB:.0f} MB over {trace_set.ranks} ranks "
        f"({trace_set.steps_per_rank} steps per rank)"
    )
    runs: dict[str, list[ChildRun]] = {"decode": [], "analyze": [], "hta": []}
    try:
        for repeat in range(plan.repeats):
            for task, arguments in (("decode", []), ("analyze", _hints(plan.source))):
                runs[task].append(run_child(task, [str(target), *arguments], plan.hta_timeout_s, plan.repo))
                progress(f"  {task} #{repeat + 1}: {_line(runs[task][-1])}")
        runs["hta"].append(run_child("hta", [str(target)], plan.hta_timeout_s, plan.repo))
        progress(f"  hta: {_line(runs['hta'][-1])}")
    finally:
        shutil.rmtree(target, ignore_errors=True)
    return {
        "mb": trace_set.bytes / MB,
        "ranks": trace_set.ranks,
        "copies": trace_set.copies,
        "steps_per_rank": trace_set.steps_per_rank,
        "tasks": {task: _task_figures(task_runs) for task, task_runs in runs.items()},
        "ratios": _ratios(trace_set, runs),
    }


def _line(run: ChildRun) -> str:
    if run.status != "ok":
        return f"{run.status} ({run.detail}), {run.tree_rss_mb:.0f} MiB with workers when stopped"
    return (
        f"{run.work_s:.2f} s work, {run.wall_s:.2f} s wall, peak {run.peak_rss_mb:.0f} MiB "
        f"({run.tree_rss_mb:.0f} MiB with workers)"
    )


def growth(small: dict, large: dict) -> dict:
    """Time and memory growth from the smallest to the largest set, against the growth in size."""
    size = large["mb"] / small["mb"]
    result = {"size_ratio": size}
    for task in ("analyze", "decode", "hta"):
        a, b = small["tasks"][task], large["tasks"][task]
        if "work_s" in a and "work_s" in b:
            result[task] = {
                "time_ratio": b["work_s"]["median"] / a["work_s"]["median"],
                "rss_ratio": b["peak_rss_mb"]["median"] / a["peak_rss_mb"]["median"],
            }
    return result


def throughput(plan: ThroughputPlan, progress: Callable[[str], None]) -> dict:
    sizes, copies = [], set()
    for size_mb in plan.sizes_mb:
        trace_set = replicate_run(plan.source, plan.workdir / f"set-{size_mb:g}mb", round(size_mb * MB))
        if trace_set.copies in copies:  # sizes below one copy give the same set: measure it once
            shutil.rmtree(trace_set.path, ignore_errors=True)
            continue
        copies.add(trace_set.copies)
        sizes.append(measure_size(plan, trace_set, progress))
    return {
        "source": str(plan.source),
        "repeats": plan.repeats,
        "hta_timeout_s": plan.hta_timeout_s,
        "sizes": sizes,
        "growth": growth(sizes[0], sizes[-1]) if len(sizes) > 1 else None,
    }
