"""Part `advice`: `python -m analysis advise`'s candidates from one run, checked by running them.

One run (the preset, p=2, gpipe, m=4, with --calibrate-advice: its chunks, I and W timed) is advised;
the top TOP candidates and the starting configuration then run `repeats` times each, the configurations
alternating within a repeat. Each is compared by its median of repeats: the profiled step (summary.json
step_time_ms) against the predicted one, and the largest rank's measured peak activation memory (the
stash counter, on either engine) against the predicted one. The top pick is measured best, or within
PICK_TARGET of the best, among the configurations run.
"""

from __future__ import annotations

from collections.abc import Callable

from analysis.attribution.advice import PROMISED_STEP_ERROR
from analysis.cli.advise import advice
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.schema import Candidate
from bench.runs import P, RunPlan, request
from bench.stats import stats
from runners.launch import LaunchError, launch
from runners.presets import ADVISED_VS, CALIBRATED_MS
from runners.schedules import SCHEDULES

SOURCE = ("native", "gpipe", 4, 1)  # engine, schedule, m, v
TOP = 3
STEP_TARGET = PROMISED_STEP_ERROR  # abs(predicted / measured - 1), median of the repeats
PICK_TARGET = 0.05  # the top pick's measured step / the measured best - 1
MEMORY_TARGET = 0.10  # abs(predicted / measured peak activation bytes - 1)


def _key(c: Candidate) -> tuple[str, str, int, int]:
    return (c.engine, c.schedule, c.m, c.v)


def _measure(plan: RunPlan, key: tuple[str, str, int, int]) -> tuple[float, int | None]:
    """One run of (engine, schedule, m, v): its profiled step (ms) and largest rank's peak activations."""
    engine, name, m, v = key
    summary = analyze_pipeline(read_run(launch(request(plan, name, P, m, engine, v=v), plan.traces))).summary
    peaks = [r.peak_activation_bytes for r in summary.ranks if r.peak_activation_bytes is not None]
    return summary.step_time_ms, max(peaks, default=None)


def _relative(guess: float | None, truth: float | None) -> float | None:
    return None if guess is None or not truth else guess / truth - 1


def _config(candidate: Candidate, rank: int, steps: list[float], peaks: list[int]) -> dict:
    """One checked configuration: its prediction beside the median of its runs."""
    step = stats(steps).median if steps else None
    peak = stats(peaks).median if peaks else None
    return {
        "engine": candidate.engine,
        "schedule": candidate.schedule,
        "m": candidate.m,
        "v": candidate.v,
        "rank": rank,
        "predicted_ms": candidate.step_time_ms,
        "interval_ms": [candidate.step_time_low_ms, candidate.step_time_high_ms],
        "measured_ms": stats(steps).to_json() if steps else None,
        "step_error": _relative(candidate.step_time_ms, step),
        "predicted_peak_bytes": candidate.peak_activation_bytes,
        "measured_peak_bytes": stats(peaks).to_json() if peaks else None,
        "peak_error": _relative(candidate.peak_activation_bytes, peak),
        "extrapolated": candidate.extrapolated,
        "caveats": candidate.caveats,
        "assumptions": candidate.assumptions,
    }


def advice_check(plan: RunPlan, repeats: int, progress: Callable[[str], None]) -> dict:
    """The SOURCE run advised, its top TOP candidates and itself run `repeats` times each; a run that
    fails is left out of its configuration's figures and named."""
    engine, name, m, v = SOURCE
    source = launch(request(plan, name, P, m, engine, v=v, calibrate_advice=True), plan.traces)
    found = advice(source, list(SCHEDULES), list(CALIBRATED_MS), list(ADVISED_VS), None)
    order = [_key(c) for c in found.candidates]
    checked = order[:TOP] + ([SOURCE] if SOURCE not in order[:TOP] else [])
    progress("  advised: " + ", ".join(f"{k[1]} m={k[2]} v={k[3]} ({k[0]})" for k in checked))
    steps: dict = {key: [] for key in checked}
    peaks: dict = {key: [] for key in checked}
    failed = []
    for repeat in range(1, repeats + 1):
        for key in checked:
            try:
                step, peak = _measure(plan, key)
            except LaunchError as error:
                failed.append(f"{key} repeat {repeat}: {error}")
                continue
            steps[key].append(step)
            peaks[key] += [] if peak is None else [peak]
            progress(f"  [{repeat}/{repeats}] {key[1]} m={key[2]} v={key[3]} ({key[0]}): {step:.1f} ms")
    measured = {key: stats(times).median for key, times in steps.items() if times}
    top, best = measured.get(checked[0]), min(measured.values(), default=None)
    return {
        "source": found.source,
        "ranked": found.ranked,
        "run_caveats": found.caveats,
        "repeats": repeats,
        "configs": [
            _config(found.candidates[order.index(key)], order.index(key) + 1, steps[key], peaks[key])
            for key in checked
        ],
        "top_pick_over_best": None if top is None or best is None else top / best - 1,
        "targets": {"step": STEP_TARGET, "pick": PICK_TARGET, "memory": MEMORY_TARGET},
        "failed": failed,
    }
