"""Part `predict`: `python -m analysis predict`'s step time at other m, from one run, against runs made there.

Each repeat runs every schedule once at SOURCE_M, predicts its profiled step at each other m
(analysis.cli.predict.predictions, what `predict RUN --ms ...` writes to RUN/predict.json), then runs
it at each of those m; repeats alternate the configurations, and each prediction is compared with the
run of its own repeat.
"""

from __future__ import annotations

from collections.abc import Callable

from analysis.cli.predict import predictions
from analysis.pipeline import analyze_run, read_run
from bench.runs import P, RunPlan, request
from bench.stats import stats, verdict
from runners.launch import LaunchError, launch

SOURCE_M = 4
SCHEDULES = ("gpipe", "1f1b")
PREDICT_TARGET = 0.10  # abs(predicted / measured - 1) of the profiled step


def accuracy(schedule: str, m: int, predicted: list[float], measured: list[float]) -> dict:
    """One (schedule, m): the repeats' predicted and measured step times (ms, pair i from repeat i) and
    abs(predicted / measured - 1) against the target."""
    error = stats([abs(guess / truth - 1) for guess, truth in zip(predicted, measured)])
    return {
        "schedule": schedule,
        "m": m,
        "predicted_ms": stats(predicted).to_json(),
        "measured_ms": stats(measured).to_json(),
        "error": error.to_json() | {"target": PREDICT_TARGET, "verdict": verdict(error, PREDICT_TARGET)},
    }


def prediction_accuracy(
    plan: RunPlan, ms: tuple[int, ...], repeats: int, progress: Callable[[str], None]
) -> dict:
    """Every schedule's SOURCE_M run predicted at `ms` and measured there, `repeats` times; a repeat whose
    run fails is left out of its schedule's figures and named."""
    predicted: dict[tuple[str, int], list[float]] = {(s, m): [] for s in SCHEDULES for m in ms}
    measured: dict[tuple[str, int], list[float]] = {key: [] for key in predicted}
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
                    for m in ms
                }
            except LaunchError as error:  # one failed run must not cost the other schedule's
                failed.append(f"{schedule} repeat {repeat}: {error}")
                progress(f"  {schedule} repeat {repeat}: failed: {error}")
                continue
            source_error[schedule].append(source.simulated_step_time_ms / source.step_time_ms - 1)
            for guess in found:
                predicted[(schedule, guess.m)].append(guess.step_time_ms)
                measured[(schedule, guess.m)].append(steps[guess.m])
            progress(
                f"  [{repeat}/{repeats}] {schedule}: "
                + ", ".join(
                    f"m={p.m} predicted {p.step_time_ms:.1f} ms, measured {steps[p.m]:.1f}" for p in found
                )
            )
    return {
        "source_m": SOURCE_M,
        "repeats": repeats,
        "configs": [
            accuracy(s, m, predicted[(s, m)], measured[(s, m)]) for (s, m) in predicted if predicted[(s, m)]
        ],
        # the source run's own step as its model replays it: the waterfall's residual, which predict inherits
        "source_simulated_error": {s: stats(e).to_json() for s, e in source_error.items() if e},
        "failed": failed,
    }
