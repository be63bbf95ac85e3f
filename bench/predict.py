"""Part `predict`: `python -m analysis predict`'s step time at other m, from one run, against runs made there.

Each repeat runs every schedule once at SOURCE_M, predicts its profiled step at each other m
(analysis.cli.predict.predictions, what `predict RUN --ms ...` writes to RUN/predict.json), then runs
it at each of those m; repeats alternate the configurations, and each prediction is compared with the
run of its own repeat. A configuration's error is its median prediction against the median of its
runs; its interval holds when the median of the runs lies between a prediction's step_time_low_ms and
step_time_high_ms, counted over the repeats. An m a schedule cannot run (1f1b at m < p) is not run.

What moves the machine between two runs is measured beside the errors: every run calibrates every
microbatch size one rank at a time (run.json calibration_by_rows), so the target run's isolated times over
its source's at the same sizes are the machine's level between them (`machine_level`), and the spread of
repeats of one configuration is its drift. The 1-minute load average is recorded at each repeat's start.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

from analysis.cli.predict import predictions
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from bench.runs import P, RunPlan, request
from bench.stats import stats, verdict
from runners.launch import LaunchError, launch

SOURCE_M = 4
SCHEDULES = ("gpipe", "1f1b")
PREDICT_TARGET = 0.10  # abs(predicted / measured - 1) of the profiled step
COVERAGE_TARGET = 0.8  # of the predictions, the share whose interval holds the measured median


def machine_level(source: dict, target: dict) -> float:
    """The median over every (stage, rows, kind) both run.json's calibration_by_rows hold of the target's
    isolated time over the source's: how much slower the machine ran the target."""
    ratios = [
        times[kind] / source["calibration_by_rows"][stage][rows][kind]
        for stage, sizes in target["calibration_by_rows"].items()
        for rows, times in sizes.items()
        for kind in times
        if kind in source["calibration_by_rows"].get(stage, {}).get(rows, {})
    ]
    return statistics.median(ratios)


def _config(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def accuracy(
    schedule: str,
    m: int,
    predicted: list[float],
    measured: list[float],
    intervals: list[tuple[float, float]],
    levels: list[float] | None = None,
) -> dict:
    """One (schedule, m): the repeats' predicted and measured step times (ms, pair i from repeat i), the
    error of the median prediction against the median run, how many intervals hold that median, and
    the machine's level of each target run against its source (machine_level)."""
    error = stats([abs(guess / truth - 1) for guess, truth in zip(predicted, measured)])
    median_error = abs(stats(predicted).median / stats(measured).median - 1)
    truth = stats(measured).median
    held = sum(low <= truth <= high for low, high in intervals)
    return {
        "schedule": schedule,
        "m": m,
        "predicted_ms": stats(predicted).to_json(),
        "measured_ms": stats(measured).to_json(),
        "error": error.to_json() | {"target": PREDICT_TARGET, "verdict": verdict(error, PREDICT_TARGET)},
        "median_error": median_error,
        "median_verdict": "meets" if median_error <= PREDICT_TARGET else "misses",
        "intervals_ms": [list(pair) for pair in intervals],
        "intervals_holding_the_median": held,
        "machine_level": stats(levels).to_json() if levels else None,
    }


def prediction_accuracy(
    plan: RunPlan, ms: tuple[int, ...], repeats: int, progress: Callable[[str], None]
) -> dict:
    """Every schedule's SOURCE_M run predicted at `ms` and measured there, `repeats` times; a repeat whose
    run fails is left out of its schedule's figures and named."""
    predicted: dict[tuple[str, int], list[float]] = {(s, m): [] for s in SCHEDULES for m in ms}
    measured: dict[tuple[str, int], list[float]] = {key: [] for key in predicted}
    intervals: dict[tuple[str, int], list[tuple[float, float]]] = {key: [] for key in predicted}
    levels: dict[tuple[str, int], list[float]] = {key: [] for key in predicted}
    source_error: dict[str, list[float]] = {schedule: [] for schedule in SCHEDULES}
    source_steps: dict[str, list[float]] = {schedule: [] for schedule in SCHEDULES}
    failed, loads = [], []
    for repeat in range(1, repeats + 1):
        loads.append(os.getloadavg()[0])
        for schedule in SCHEDULES:
            try:
                source_dir = launch(request(plan, schedule, P, SOURCE_M), plan.traces)
                source, found = predictions(source_dir, list(ms))
                targets = {
                    m: launch(request(plan, schedule, P, m), plan.traces)
                    for m in sorted({g.m for g in found})
                }
            except LaunchError as error:  # one failed run must not cost the other schedule's
                failed.append(f"{schedule} repeat {repeat}: {error}")
                progress(f"  {schedule} repeat {repeat}: failed: {error}")
                continue
            steps = {
                m: analyze_pipeline(read_run(run_dir)).summary.step_time_ms for m, run_dir in targets.items()
            }
            source_error[schedule].append(source.typical_step_ms / source.step_time_ms - 1)
            source_steps[schedule].append(source.step_time_ms)
            for guess in found:
                predicted[(schedule, guess.m)].append(guess.step_time_ms)
                measured[(schedule, guess.m)].append(steps[guess.m])
                intervals[(schedule, guess.m)].append((guess.step_time_low_ms, guess.step_time_high_ms))
                levels[(schedule, guess.m)].append(
                    machine_level(_config(source_dir), _config(targets[guess.m]))
                )
            progress(
                f"  [{repeat}/{repeats}] {schedule}: "
                + ", ".join(
                    f"m={p.m} predicted {p.step_time_ms:.1f} ms, measured {steps[p.m]:.1f}" for p in found
                )
            )
    configs = [
        accuracy(
            schedule, m, guesses, measured[(schedule, m)], intervals[(schedule, m)], levels[(schedule, m)]
        )
        for (schedule, m), guesses in predicted.items()
        if guesses
    ]
    held = sum(c["intervals_holding_the_median"] for c in configs)
    total = sum(len(c["intervals_ms"]) for c in configs)
    return {
        "source_m": SOURCE_M,
        "repeats": repeats,
        "configs": configs,
        "coverage": {"held": held, "of": total, "target": COVERAGE_TARGET},
        # the source run's own step as its model replays it: the waterfall's residual, which predict inherits
        "source_typical_error": {s: stats(e).to_json() for s, e in source_error.items() if e},
        # the drift between repeats of one configuration: the source runs' measured steps
        "source_step_ms": {s: stats(steps).to_json() for s, steps in source_steps.items() if steps},
        "load_average": loads,
        "failed": failed,
    }
