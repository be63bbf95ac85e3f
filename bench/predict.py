"""Part `predict`: `python -m analysis predict`'s step time at other m, from one run, against runs made there.

Each repeat runs every schedule once at SOURCE_M, predicts its profiled step at each other m
(analysis.cli.predict.predictions, what `predict RUN --ms ...` writes to RUN/predict.json), then runs
it at each of those m; repeats alternate the configurations, and each prediction is compared with the
run of its own repeat. A configuration's error is its median prediction against the median of its
runs; its interval holds when the median of the runs lies between a prediction's step_time_low_ms and
step_time_high_ms, counted over the repeats. An m a schedule cannot run (1f1b at m < p) is not run.
"""

from __future__ import annotations

from collections.abc import Callable

from analysis.cli.predict import predictions
from analysis.job.measure import analyze_run
from analysis.job.run_dir import read_run
from bench.runs import P, RunPlan, request
from bench.stats import stats, verdict
from runners.launch import LaunchError, launch

SOURCE_M = 4
SCHEDULES = ("gpipe", "1f1b")
PREDICT_TARGET = 0.10  # abs(predicted / measured - 1) of the profiled step
COVERAGE_TARGET = 0.8  # of the predictions, the share whose interval holds the measured median


def accuracy(
    schedule: str, m: int, predicted: list[float], measured: list[float], intervals: list[tuple[float, float]]
) -> dict:
    """One (schedule, m): the repeats' predicted and measured step times (ms, pair i from repeat i), the
    error of the median prediction against the median run, and how many intervals hold that median."""
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
    }


def prediction_accuracy(
    plan: RunPlan, ms: tuple[int, ...], repeats: int, progress: Callable[[str], None]
) -> dict:
    """Every schedule's SOURCE_M run predicted at `ms` and measured there, `repeats` times; a repeat whose
    run fails is left out of its schedule's figures and named."""
    predicted: dict[tuple[str, int], list[float]] = {(s, m): [] for s in SCHEDULES for m in ms}
    measured: dict[tuple[str, int], list[float]] = {key: [] for key in predicted}
    intervals: dict[tuple[str, int], list[tuple[float, float]]] = {key: [] for key in predicted}
    source_error: dict[str, list[float]] = {schedule: [] for schedule in SCHEDULES}
    failed = []
    for repeat in range(1, repeats + 1):
        for schedule in SCHEDULES:
            try:
                source, found = predictions(
                    launch(request(plan, schedule, P, SOURCE_M), plan.traces), list(ms)
                )
                steps = {
                    m: analyze_run(
                        read_run(launch(request(plan, schedule, P, m), plan.traces))
                    ).summary.step_time_ms
                    for m in sorted({guess.m for guess in found})
                }
            except LaunchError as error:  # one failed run must not cost the other schedule's
                failed.append(f"{schedule} repeat {repeat}: {error}")
                progress(f"  {schedule} repeat {repeat}: failed: {error}")
                continue
            source_error[schedule].append(source.simulated_step_time_ms / source.step_time_ms - 1)
            for guess in found:
                predicted[(schedule, guess.m)].append(guess.step_time_ms)
                measured[(schedule, guess.m)].append(steps[guess.m])
                intervals[(schedule, guess.m)].append((guess.step_time_low_ms, guess.step_time_high_ms))
            progress(
                f"  [{repeat}/{repeats}] {schedule}: "
                + ", ".join(
                    f"m={p.m} predicted {p.step_time_ms:.1f} ms, measured {steps[p.m]:.1f}" for p in found
                )
            )
    configs = [
        accuracy(schedule, m, guesses, measured[(schedule, m)], intervals[(schedule, m)])
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
        "source_simulated_error": {s: stats(e).to_json() for s, e in source_error.items() if e},
        "failed": failed,
    }
