"""Part 1: analysis throughput on large trace sets: ours vs HTA vs plain typed decoding (the floor),
and the merge of the same sets.

Sets: one source run per rank count (bench.traceset replicates its steps), the smallest rank count at
every size of the ladder, the others at one size (growth with ranks). For each set, decode and analyze
alternate in fresh processes `repeats` times (so load drifts hit both alike); then analyze once more
with one process (`--jobs 1`: every rank read in turn in one process, the memory bound), HTA loads it
once, capped by a timeout (it is slow), and merge writes its merged trace once. Ratios pair each
analyze with the decode next to it. Ours and HTA read the ranks with as many processes as each picks
(ours: analysis.ranks.workers, one per core; HTA: its own pool, min(cores, ranks) up to 8 ranks): both say how
many.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.process import ChildRun, run_child
from bench.stats import WIDE_SPREAD, Stats, stats, verdict
from bench.traceset import TraceSet, replicate_run

MB = 1_000_000
TARGETS = {
    "hta_over_ours": 20.0,
    "hta_over_ours_wall": 20.0,
    "ours_over_decode": 2.0,
    "rss_over_size": 3.0,
    "one_process_rss_over_largest_file": 3.0,
    "one_process_rss_above_start_over_largest_file": 1.5,
    "replay_share": 0.10,  # every step's own replay and critical path / analyze's work
}
# Time linear in the input: from the smallest set to the largest, time per MB grows by no more than the
# spread this machine's repeats are read within
GROWTH_TARGET = 1 + WIDE_SPREAD
TASKS = ("decode", "analyze", "analyze_jobs1", "hta", "merge")
TASK_TIMEOUT_S = 3600.0  # ours and the floor: a hung child, not a slow one (HTA has its own cap)


@dataclass(frozen=True)
class ThroughputPlan:
    sources: dict[int, Path]  # rank count -> a run directory with PP labels to replicate
    sizes_mb: tuple[float, ...]  # the ladder, smallest first, for the fewest ranks
    ranks_mb: float  # the size of the other rank counts' sets
    repeats: int
    hta_timeout_s: float
    workdir: Path  # generated sets live here and are deleted after their size is measured
    repo: Path  # where the children run (the analysis package must import)
    gzipped: bool = False  # the sets' files as .json.gz (their quoted size: the JSON text's)


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
            "started_rss_mb": stats([r.started_rss_mb for r in done]).to_json(),
            "tree_rss_mb": stats([r.tree_rss_mb for r in done]).to_json(),
            "largest_rss_mb": stats([r.largest_rss_mb for r in done]).to_json(),
            "processes": done[0].processes,
            "rows": done[0].rows,
        }
    else:
        figures["detail"] = runs[0].detail
        figures["tree_rss_mb_at_stop"] = runs[0].tree_rss_mb
    return figures


def _ratios(trace_set: TraceSet, largest: int, runs: dict[str, list[ChildRun]]) -> dict:
    ours, floor, hta = _ok(runs["analyze"]), _ok(runs["decode"]), _ok(runs["hta"])
    ratios = {}
    if ours and floor:
        ratios["ours_over_decode"] = stats([a.work_s / d.work_s for a, d in zip(ours, floor)])
    if ours:
        ratios["replay_share"] = stats([a.replay_s / a.work_s for a in ours])
        ratios["rss_over_size"] = stats([a.tree_rss_mb * 2**20 / trace_set.bytes for a in ours])
    if one_process := _ok(runs["analyze_jobs1"]):
        ratios["one_process_rss_over_largest_file"] = stats(
            [a.peak_rss_mb * 2**20 / largest for a in one_process]
        )
        ratios["one_process_rss_above_start_over_largest_file"] = stats(
            [(a.peak_rss_mb - a.started_rss_mb) * 2**20 / largest for a in one_process]
        )
    if ours and hta:
        ratios["hta_over_ours"] = stats([h.work_s / a.work_s for h in hta for a in ours])
        ratios["hta_over_ours_wall"] = stats([h.wall_s / a.wall_s for h in hta for a in ours])
    lower = {"hta_over_ours": False, "hta_over_ours_wall": False}
    return {
        name: figure.to_json()
        | {"target": TARGETS[name], "verdict": verdict(figure, TARGETS[name], lower.get(name, True))}
        for name, figure in ratios.items()
    }


def measure_size(
    plan: ThroughputPlan, source: Path, trace_set: TraceSet, progress: Callable[[str], None]
) -> dict:
    target = trace_set.path
    progress(
        f"throughput: {trace_set.bytes / MB:.0f} MB over {trace_set.ranks} ranks "
        f"({trace_set.steps_per_rank} steps per rank{', gzipped' if plan.gzipped else ''})"
    )
    runs: dict[str, list[ChildRun]] = {task: [] for task in TASKS}
    hints = _hints(source)
    largest = trace_set.largest

    def measure(name: str, task: str, arguments: list[str], label: str = "") -> None:
        timeout = plan.hta_timeout_s if task == "hta" else TASK_TIMEOUT_S
        runs[name].append(run_child(task, [str(target), *arguments], timeout, plan.repo))
        progress(f"  {name}{label}: {_line(runs[name][-1])}")

    try:
        for repeat in range(plan.repeats):
            measure("decode", "decode", [], f" #{repeat + 1}")
            measure("analyze", "analyze", hints, f" #{repeat + 1}")
        measure("analyze_jobs1", "analyze", [*hints, "--jobs", "1"])
        measure("hta", "hta", [])
        measure("merge", "merge", [])  # (after analyze: it reads the analysis/ analyze wrote)
    finally:
        shutil.rmtree(target, ignore_errors=True)
    return {
        "mb": trace_set.bytes / MB,
        "gzipped": plan.gzipped,
        "ranks": trace_set.ranks,
        "copies": trace_set.copies,
        "steps_per_rank": trace_set.steps_per_rank,
        "tasks": {task: _task_figures(task_runs) for task, task_runs in runs.items()},
        "largest_file_mb": largest / MB,
        "ratios": _ratios(trace_set, largest, runs),
    }


def _line(run: ChildRun) -> str:
    if run.status != "ok":
        return f"{run.status} ({run.detail}), {run.tree_rss_mb:.0f} MiB with workers when stopped"
    return (
        f"{run.work_s:.2f} s work, {run.wall_s:.2f} s wall, peak {run.peak_rss_mb:.0f} MiB "
        f"({run.tree_rss_mb:.0f} MiB with workers, {run.processes} processes)"
    )


def growth(small: dict, large: dict, by: str) -> dict:
    """Time and memory growth from the `small` set to the `large` one, against the growth in `by`
    (mb: size; ranks: the rank count, the two sets of about one size). Against size, each task's time per
    MB on the large set over the small one's, its range from the two sets' ranges, against GROWTH_TARGET."""
    ratio = large[by] / small[by]
    result = {"by": by, "ratio": ratio, "size_ratio": large["mb"] / small["mb"]}
    for task in TASKS:
        a, b = small["tasks"][task], large["tasks"][task]
        if "work_s" in a and "work_s" in b:
            ta, tb = a["work_s"], b["work_s"]
            result[task] = {
                "time_ratio": tb["median"] / ta["median"],
                "rss_ratio": b["tree_rss_mb"]["median"] / a["tree_rss_mb"]["median"],
            }
            if by == "mb":
                per_mb = Stats(
                    tb["median"] / ta["median"] / ratio,
                    tb["min"] / ta["max"] / ratio,
                    tb["max"] / ta["min"] / ratio,
                    min(ta["n"], tb["n"]),
                )
                result[task]["time_per_mb"] = per_mb.to_json() | {
                    "target": GROWTH_TARGET,
                    "verdict": verdict(per_mb, GROWTH_TARGET),
                }
    return result


def _measured(plan: ThroughputPlan, ranks: int, size_mb: float, say: Callable[[str], None]) -> dict:
    source = plan.sources[ranks]
    name = f"set-{ranks}ranks-{size_mb:g}mb"
    trace_set = replicate_run(source, plan.workdir / name, round(size_mb * MB), plan.gzipped)
    return measure_size(plan, source, trace_set, say)


def throughput(plan: ThroughputPlan, progress: Callable[[str], None]) -> dict:
    fewest, *others = sorted(plan.sources)
    sizes = [_measured(plan, fewest, size_mb, progress) for size_mb in plan.sizes_mb]
    by_ranks = [_measured(plan, ranks, plan.ranks_mb, progress) for ranks in others]
    at_ranks_mb = min(sizes, key=lambda size: abs(size["mb"] - plan.ranks_mb))
    return {
        "sources": {
            str(ranks): path.name for ranks, path in plan.sources.items()
        },  # (names: scratch folders)
        "repeats": plan.repeats,
        "hta_timeout_s": plan.hta_timeout_s,
        "sizes": sizes + by_ranks,
        "growth": growth(sizes[0], sizes[-1], "mb") if len(sizes) > 1 else None,
        "growth_ranks": growth(at_ranks_mb, by_ranks[-1], "ranks") if by_ranks else None,
    }
