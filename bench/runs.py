"""Parts 2-6 from real CPU runs (runners' launcher, then our analysis of each run's traces).

A sweep row carries the seed experiment's columns (p, m, slot_ms, step_ms, bubble_theory,
bubble_measured: slot_ms is stage 0's F+B per microbatch as profiled, step_ms the unprofiled median,
bubble_measured = 1 - m * slot_ms / step_ms as the seed computes it) beside our decomposition
(summary.json's bubble, waterfall and typical step), the profiler ratio and the typical model's error.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.errors import InputError
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.vocabulary import RUNGS
from bench.cold import cold_passes
from bench.stats import stats, verdict
from runners.inject import parse_injections
from runners.launch import LaunchError, launch
from runners.request import RequestError, RunRequest, resolve

P = 2  # ranks of the inject and predict parts' runs: one per core of a 2-core machine
PROFILER_TARGET = 1.10  # profiled / unprofiled step time
SIM_TARGET = 0.05  # |typical / measured - 1| on every run
EXECUTOR_TARGET = 1.0  # native / torch step time
BUBBLE_TARGET = 0.02  # |bubble_measured - 1/2| of gpipe p=2 m=1 on every run (the seed got 0.009 of it)
SLOWDOWN_TARGET = 0.05  # |slowdown| / busy of each rank at gpipe p=2 m=1: the isolated work is the cells' own
COLD_PAIRS = 10  # warm and cold pass pairs beside the m=1 runs


@dataclass(frozen=True)
class RunPlan:
    traces: Path  # where run directories go
    preset: str
    steps: int  # profiled steps per run
    timed_steps: int  # unprofiled steps per run


def request(
    plan: RunPlan,
    schedule: str,
    p: int,
    m: int,
    engine: str = "native",
    inject: str = "",
    v: int = 1,
    calibrate_advice: bool = False,
):
    """The resolved CPU request with v chunks per rank, with the delays an --inject text names (raises
    RequestError, e.g. for an engine not registered yet)."""
    injections = parse_injections(inject)
    wanted = RunRequest(
        schedule,
        p,
        m,
        v,
        engine,
        plan.preset,
        plan.steps,
        "cpu",
        plan.timed_steps,
        injections=injections,
        calibrate_advice=calibrate_advice,
    )
    return resolve(wanted, lambda: 0)  # device cpu: the GPU count is never asked


def slot_ms(cells: pl.DataFrame, step: int) -> float:
    """Median over microbatches of stage 0's F + B time (blocked time excluded), in ms."""
    per_microbatch = (
        cells.filter((pl.col("step") == step) & (pl.col("stage") == 0) & pl.col("kind").is_in(["F", "B"]))
        .group_by("microbatch")
        .agg((pl.col("end_ns") - pl.col("start_ns") - pl.col("blocked_ns")).sum().alias("ns"))
    )
    return float(per_microbatch["ns"].median()) / 1e6


def sweep_row(run_dir: Path) -> dict:
    config = json.loads((run_dir / "run.json").read_text())
    result = analyze_pipeline(read_run(run_dir))
    summary = result.summary
    p, m = summary.p, summary.m
    step, samples = config["step_time_unprofiled_ms"], config["step_times_unprofiled_ms"]
    slot = slot_ms(result.cells, summary.median_step)
    profiled, typical = summary.step_time_ms, summary.typical_step_ms
    return {
        "run": run_dir.name,
        "schedule": summary.schedule,
        "p": p,
        "m": m,
        "slot_ms": slot,
        "step_ms": step,
        "step_ms_min": min(samples),
        "step_ms_max": max(samples),
        "bubble_theory": summary.bubble_formula,
        "bubble_measured": 1 - m * slot / step,
        "analysis_bubble": summary.bubble_measured,
        "profiled_step_ms": profiled,
        "typical_step_ms": typical,
        "typical_error": typical / profiled - 1,
        "profiler_ratio": profiled / step,
        **{f"{term}_ms": getattr(summary.waterfall_ms, term) for term in RUNGS},
    }


def _requests(
    plan: RunPlan, schedules: tuple[str, ...], p: int, ms: tuple[int, ...]
) -> tuple[list, list[str]]:
    """Every request checked before the first run starts; those a schedule refuses (1f1b needs m >= p) are
    skipped with the reason, any other refusal is bad input."""
    requests, skipped = [], []
    for schedule in schedules:
        for m in ms:
            try:
                requests.append(request(plan, schedule, p, m))
            except RequestError as error:
                if not str(error).startswith(f"{schedule}:"):
                    raise InputError(None, str(error)) from None
                skipped.append(f"{schedule} p={p} m={m}: {error}")
    return requests, skipped


def sweep(
    plan: RunPlan, schedules: tuple[str, ...], p: int, ms: tuple[int, ...], progress: Callable[[str], None]
) -> tuple[list[dict], list[str]]:
    """One run per (schedule, m); returns the rows and the combinations skipped."""
    requests, skipped = _requests(plan, schedules, p, ms)
    for reason in skipped:
        progress(f"  skipped {reason}")
    rows = []
    for done, resolved in enumerate(requests, start=1):
        try:
            row = sweep_row(launch(resolved, plan.traces))
        except LaunchError as error:  # one failed run must not cost the others
            skipped.append(f"{resolved.request.schedule} p={p} m={resolved.request.m}: failed: {error}")
            progress(f"  [{done}/{len(requests)}] failed: {error}")
            continue
        rows.append(row)
        progress(
            f"  [{done}/{len(requests)}] {row['schedule']} p={p} m={row['m']}: step {row['step_ms']:.1f} ms, "
            f"profiled {row['profiled_step_ms']:.1f}, typical {row['typical_step_ms']:.1f}"
        )
    return rows, skipped


def profiler_overhead(rows: list[dict]) -> dict:
    figure = stats([row["profiler_ratio"] for row in rows])
    return figure.to_json() | {"target": PROFILER_TARGET, "verdict": verdict(figure, PROFILER_TARGET)}


def typical_step_accuracy(rows: list[dict]) -> dict:
    errors = [abs(row["typical_error"]) for row in rows]
    figure = stats(errors)
    within = sum(error <= SIM_TARGET for error in errors)
    return figure.to_json() | {
        "target": SIM_TARGET,
        "runs_within": within,
        "runs": len(errors),
        "verdict": "meets" if within == len(errors) else "misses",
    }


def pass_noise(config: dict, stages_of_ranks: list[list[int]]) -> list[float]:
    """Per rank and calibration round: the round's passes of the rank's stages at the run's microbatch
    size over the median of the other rounds' passes, less 1. What slowdown / busy would read of a step
    whose cells were isolated passes themselves: the machine's own noise between two timings of the same
    work, the floor under the slowdown of a single step."""
    rows = str(config["dims"]["microbatch_rows"][0])
    samples = config["calibration_by_rows_samples_ms"]
    shares = []
    for stages in stages_of_ranks:
        kinds = [samples[str(stage)][rows][kind] for stage in stages for kind in samples[str(stage)][rows]]
        for held_out in range(min(len(times) for times in kinds)):
            others = [statistics.median(times[:held_out] + times[held_out + 1 :]) for times in kinds]
            shares.append(sum(times[held_out] for times in kinds) / sum(others) - 1)
    return shares


def m1_bubble(plan: RunPlan, runs: int, progress: Callable[[str], None]) -> dict:
    """GPipe p=2 m=1 `runs` times: the measured bubble against the formula's 1/2, and each rank's
    slowdown (busy time beyond the isolated calibration: at m=1 every cell is the calibration's own
    whole-batch work) as a share of its busy time, whole and less its measured wait for a core
    (cpu_contention), beside the same share of a calibration pass against the others (pass_noise) and
    what the idle before a pass costs it on this machine (bench.cold)."""
    resolved = request(plan, "gpipe", 2, 1)
    bubbles, slowdowns, on_cpu, noise, failed = [], [], [], [], []
    for done in range(1, runs + 1):
        try:
            run_dir = launch(resolved, plan.traces)
            summary = analyze_pipeline(read_run(run_dir)).summary
        except LaunchError as error:  # one failed run must not cost the others
            failed.append(str(error))
            progress(f"  [{done}/{runs}] failed: {error}")
            continue
        bubbles.append(summary.bubble_measured)
        config = json.loads((run_dir / "run.json").read_text())
        noise += pass_noise(config, [rank.stage_ids for rank in summary.ranks])
        slowdowns += [rank.slowdown_ms / rank.busy_ms for rank in summary.ranks]
        # beyond waiting for a core: what a loaded machine adds is cpu_contention, not the pipeline's
        on_cpu += [
            (rank.slowdown_ms - (rank.cpu_contention_ms or 0.0)) / rank.busy_ms for rank in summary.ranks
        ]
        progress(
            f"  [{done}/{runs}] bubble {summary.bubble_measured:.4f}, slowdown / busy "
            + ", ".join(f"{rank.slowdown_ms / rank.busy_ms:+.3f}" for rank in summary.ranks)
            + ", without cpu_contention "
            + ", ".join(f"{share:+.3f}" for share in on_cpu[-len(summary.ranks) :])
        )
    if not bubbles:
        return {"runs": runs, "failed": failed}
    deviation = stats([abs(bubble - 0.5) for bubble in bubbles])
    slowdown = stats([abs(share) for share in slowdowns])
    beyond_contention = stats([abs(share) for share in on_cpu])
    return {
        "runs": runs,
        "failed": failed,
        "bubbles": bubbles,
        "deviation": deviation.to_json()
        | {"target": BUBBLE_TARGET, "verdict": verdict(deviation, BUBBLE_TARGET)},
        "slowdown_shares": slowdowns,
        "slowdown": slowdown.to_json()
        | {"target": SLOWDOWN_TARGET, "verdict": verdict(slowdown, SLOWDOWN_TARGET)},
        "beyond_contention_shares": on_cpu,
        "beyond_contention": beyond_contention.to_json()
        | {"target": SLOWDOWN_TARGET, "verdict": verdict(beyond_contention, SLOWDOWN_TARGET)},
        "pass_noise_shares": noise,
        "pass_noise": stats([abs(share) for share in noise]).to_json() | {"target": SLOWDOWN_TARGET},
        "cold": cold_passes(plan.preset, COLD_PAIRS),
    }


def seed_optimum(rows: list[dict]) -> dict[str, int]:
    """Per (schedule, p): the m with the lowest unprofiled step time (the U-curve's bottom)."""
    best: dict[str, dict] = {}
    for row in rows:
        key = f"{row['schedule']} p={row['p']}"
        if key not in best or row["step_ms"] < best[key]["step_ms"]:
            best[key] = row
    return {key: row["m"] for key, row in best.items()}


def executor_overhead(
    plan: RunPlan, configs: tuple[tuple[str, int], ...], repeats: int, progress: Callable[[str], None]
) -> dict:
    """native vs torch at p=2, interleaved A B A B; the ratio pairs each native run with the next torch one."""
    try:
        request(plan, configs[0][0], 2, configs[0][1], "torch")
    except RequestError as error:
        return {"available": False, "reason": f"torch engine not available: {error}"}
    results = []
    for schedule, m in configs:
        samples: dict[str, list[float]] = {"native": [], "torch": []}
        try:
            for _ in range(repeats):
                for engine in samples:
                    run_dir = launch(request(plan, schedule, 2, m, engine), plan.traces)
                    samples[engine].append(
                        json.loads((run_dir / "run.json").read_text())["step_time_unprofiled_ms"]
                    )
        except LaunchError as error:
            results.append({"schedule": schedule, "m": m, "failed": str(error)})
            progress(f"  {schedule} m={m}: failed: {error}")
            continue
        ratio = stats([n / t for n, t in zip(samples["native"], samples["torch"])])
        results.append(
            {
                "schedule": schedule,
                "m": m,
                "native_ms": stats(samples["native"]).to_json(),
                "torch_ms": stats(samples["torch"]).to_json(),
                "native_over_torch": ratio.to_json(),
                "verdict": verdict(ratio, EXECUTOR_TARGET),
            }
        )
        progress(f"  {schedule} m={m}: native/torch {ratio.text()}")
    return {"available": True, "repeats": repeats, "configs": results}
