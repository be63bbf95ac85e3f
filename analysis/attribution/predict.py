"""The step at other microbatch counts, predicted from one run's step model.

At m' the executed schedule is rebuilt (runners.schedules.build: same name, p, v) and the step model
(analysis.attribution.model) replayed on it with three changes of size: each (stage, kind)'s busy time
is its isolated time at the m' microbatch's rows (run.json calibration_by_rows) times the ratio of
busy to isolated measured at the run's own m (the slowdown carried over), while the host gap before
each action, the latency of each hop and the time after the last action stay as measured. The
microbatch sizes at m' split the same batch (runners.presets.microbatch_rows), or keep the run's
size where it fixed one (`--rows-per-mb`). It does not model latency growing with message size, nor
a slowdown that changes with m (more microbatches in flight, more memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.attribution.model import StepModel
from analysis.attribution.reference import Reference, reference, reference_at
from analysis.attribution.replay import Measured, replay
from analysis.errors import InputError
from analysis.results import Analysis
from runners.presets import microbatch_rows
from runners.schedules import Schedule, ScheduleError, build, formula_bubble

NS_PER_MS = 1e6


class Unpredictable(Exception):
    """This m cannot be predicted from the run (the schedule cannot run it, or no calibration at its rows)."""


@dataclass(frozen=True)
class Prediction:
    m: int
    step_time_ms: float
    bubble_formula: float
    bubble_predicted: float  # 1 - busy / (p * step), the busy-time bubble of the predicted step


def rows_at(config: dict, m: int) -> list[int]:
    """The rows of each of m microbatches: the run's batch split m ways, or its fixed microbatch size."""
    dims = config.get("dims") or {}
    fixed = config.get("rows_per_microbatch")
    if fixed:
        return [int(fixed)] * m
    return microbatch_rows(sum(dims["microbatch_rows"]), m)


def predict(schedule: Schedule, model: StepModel, ref: Reference, config: dict, m: int, where) -> Prediction:
    """The step of `schedule` rebuilt at m microbatches; `ref` is the run's own (isolated times at its m),
    `config` its run.json; InputError naming `where` when the run cannot predict at all, Unpredictable
    when this m cannot be."""
    if not ref.isolated:
        raise InputError(where, "predict needs the isolated calibration (run.json calibration_by_rows)")
    try:
        target = build(schedule.name, schedule.p, m, schedule.v)
    except ScheduleError as error:
        raise Unpredictable(f"{schedule.name} cannot run m={m}: {str(error).splitlines()[0]}") from None
    rows = rows_at(config, m)
    keys = [
        (a.stage, a.kind.value, a.microbatch) for order in target.orders for a in order if a.kind.is_compute
    ]
    at_m = reference_at(keys, model.duration, config, m, rows)
    if not at_m.isolated:
        raise Unpredictable(
            f"run.json calibration_by_rows has no entry for m={m}'s microbatch rows {sorted(set(rows))}"
        )
    own = ref.isolated_medians()
    ratio = {key: ns / own[key] if own.get(key) else 1.0 for key, ns in model.duration.items()}
    duration = {
        (stage, kind, microbatch): ns * ratio[(stage, kind)]
        for stage, kind, microbatch, ns in at_m.table.select(
            "stage", "kind", "microbatch", "isolated_ns"
        ).iter_rows()
    }
    kept = model.measured(target)  # gaps and latencies as measured
    measured = Measured(
        {a: duration[(a.stage, a.kind.value, a.microbatch)] for a in kept.duration}, kept.latency, kept.gap
    )
    step_ns = replay(target, measured).makespan + model.tail
    busy_ns = sum(measured.duration.values())
    return Prediction(
        m=m,
        step_time_ms=step_ns / NS_PER_MS,
        bubble_formula=formula_bubble(target),
        bubble_predicted=1 - busy_ns / (target.p * step_ns),
    )


def predict_each(
    analysis: Analysis, config: dict, ms: list[int], where
) -> tuple[list[Prediction], dict[int, str]]:
    """The analysed run's step predicted at each of `ms` that can be, and why each other cannot."""
    ref = reference(analysis.cells, config, analysis.schedule.m)
    found, skipped = [], {}
    for m in ms:
        try:
            found.append(predict(analysis.schedule, analysis.model, ref, config, m, where))
        except Unpredictable as why:
            skipped[m] = str(why)
    return found, skipped
