"""The step at other microbatch counts, predicted from one run's typical step (analysis.attribution.model).

At m' the executed schedule is rebuilt (runners.schedules.build: same name, p, v), lowered (its SEND and
RECV placed as runners.schedules.lower places them; at the run's own m the executed orders are kept)
and replayed (analysis.attribution.replay) with one change of size: each (stage, kind)'s work is its
isolated time at the m' microbatch's rows (run.json calibration_by_rows) times its slowdown (mean busy
time over isolated time at the run's own m); its host time, its transfers and each rank's tail stay as
measured. The slowdown's excess over 1 is carried in proportion to concurrency: the share of the
step's compute during which another rank computes too (`concurrency`, from the replay), at m' over
the run's own. The calibration times one rank at a time, so what ranks computing together cost each
other (cores and caches shared: at P=2 on 2 cores any third runnable thread takes a core from one of
them) is in the run's slowdown only as far as its ranks overlapped: gpipe at m=1 never overlaps them,
at m=2 less than at m=4. As m' changes that share the replay is repeated with the slowdown it implies
(CONCURRENCY_ROUNDS times: on CPU runs a further three moved no step by 0.1%). A run whose ranks never
overlapped carries its slowdown as it is. The slowdown is first taken back to the calibration's
machine: the calibration's rounds run between the unprofiled steps (runners.worker), the cells were
measured in the profiled steps after them, and the machine's speed moves between the two; a slowdown
measured across that move would carry it to every m as if the pipeline caused it. So busy time is
divided by the run's drift, its profiled steps' median over its unprofiled steps' (`calibration_drift`;
over 27 quiet p=2 runs a run's mean slowdown followed it with a correlation of 0.88). Both kinds of step
run the same pipeline, so what ranks computing together cost each other stays in the slowdown. The
microbatch sizes at m' split the same batch (runners.presets.microbatch_rows), or keep the run's size
where it fixed one (`--rows-per-mb`).

The interval resamples the run's own measurements. Each of SAMPLES replays draws every action's inputs
from one measured cell of its (stage, kind) (its work scaled the same way), every rank's tail from one
analysed step, and the calibration's medians from a resample of its samples (the scale's own
uncertainty); its step is then multiplied by the level of one whole step the run timed, a profiled or
an unprofiled one over the median of its kind. That last factor is the machine's speed, which moves
every cell of a step together: independent draws per cell average it away, and it is what moves one
run's level against another's. The interval is the middle COVERAGE of those steps. It does not model
latency growing with message size, nor a slowdown that changes with m for other reasons than
concurrency (more microbatches in flight, more memory; the cost of a cell that follows an idle stretch).
That last is measured: on the CPU preset at p=2 the cells of m=16 runs take 10-22% longer than their
isolated passes (0.4-0.9 ms a cell, little of it waiting for a core), those of m=4 runs 0-7%, so a
prediction from m=4 comes out 13-15% short at m=16 (bench section 8). The excess is no time per cell
either: carried as one (or as its run-queue share by ratio and the rest per cell), the same five pairs of
runs still came out 8-14% short at m=16, and under a competing load at least 5 of the 7 sizes missed by more
than 10% where the ratio misses 3, so the ratio stays.

From the trace alone (no run.json, or one without the runner's calibration) `from_trace` fills in
what is missing and names what that assumes (analysis.attribution.from_trace).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import polars as pl

from analysis.attribution.from_trace import NS_PER_MS, from_trace, rests_on, rows_at, size_band
from analysis.attribution.model import StepModel
from analysis.attribution.own_step import INPUT_COLUMNS, TAIL_COLUMNS, OwnSteps
from analysis.attribution.reference import Reference, reference, reference_at
from analysis.attribution.replay import Deadlock, Inputs, Replayed, Step, Tail, replay, replay_all
from analysis.errors import InputError
from analysis.results import Analysis
from analysis.schema import Prediction
from analysis.vocabulary import Assumption
from runners.presets import CALIBRATED_MS
from runners.schedules import Action, Kind, Schedule, ScheduleError, bubble_formula, build, lower

SAMPLES = 64  # resampled replays per m
COVERAGE = 0.9  # of them, the middle share the interval holds
CONCURRENCY_ROUNDS = 3  # replays that settle the slowdown at m' on the concurrency it implies


class Unpredictable(Exception):
    """This m cannot be predicted from the run (the schedule cannot run it, or no calibration at its rows)."""


def _own_isolated(model: StepModel, config: dict, own_m: int) -> dict:
    """(stage, kind) -> its isolated time at the run's own microbatch rows (`config`'s calibration_by_rows)."""
    own_rows = (config.get("dims") or {}).get("microbatch_rows")
    own_keys = [(stage, kind, mb) for stage, kind in sorted(model.busy) for mb in range(own_m)]
    return reference_at(own_keys, model.busy, config, own_m, own_rows).isolated_medians()


def _scale(model: StepModel, config: dict, own_m: int, target: Schedule) -> dict:
    """Each compute action of `target` -> the factor from its (stage, kind)'s isolated time at the run's
    own m to its own isolated time at its microbatch's rows (`config`'s calibration_by_rows);
    Unpredictable without those rows."""
    at_m = reference_at(_compute_keys(target.orders), model.busy, config, target.m, rows_at(config, target.m))
    if not at_m.isolated:
        rows = sorted(set(rows_at(config, target.m)))
        raise Unpredictable(
            f"run.json calibration_by_rows has no entry for m={target.m}'s microbatch rows {rows}"
        )
    own = _own_isolated(model, config, own_m)
    return {
        Action(stage, Kind(kind), mb): ns / own[(stage, kind)] if own.get((stage, kind)) else 1.0
        for stage, kind, mb, ns in at_m.table.select("stage", "kind", "microbatch", "isolated_ns").iter_rows()
    }


def concurrency(replayed: Replayed, orders) -> float:
    """The share of the replayed step's compute time during which another rank computes too."""
    events = sorted(  # at one instant an end before a start: touching cells do not overlap
        (time, change)
        for order in orders
        for action in order
        if action.kind.is_compute
        for time, change in zip(replayed.spans[action], (1, -1))
    )
    together = total = 0.0
    running, last = 0, 0.0
    for time, change in events:
        total += (time - last) * running
        together += (time - last) * running if running > 1 else 0.0
        running, last = running + change, time
    return float(together / total) if total else 0.0


def run_concurrency(schedule: Schedule, model: StepModel) -> float:
    """`concurrency` of the run's typical step on its executed orders: the overlap its slowdown was measured at."""
    return concurrency(replay(schedule, model.step()), model.orders)


def calibration_drift(replayed_ms: list[float], config: dict) -> float:
    """The median of the run's profiled steps (`replayed_ms`) over that of run.json's unprofiled ones, which
    run between the calibration's rounds: how much slower the machine ran the cells than the calibration
    (1 where either is missing)."""
    unprofiled = config.get("step_times_unprofiled_ms") or []
    if not replayed_ms or not unprofiled:
        return 1.0
    return statistics.median(replayed_ms) / statistics.median(unprofiled)


def _carried(slowdowns: dict, ratio: float, drift: float) -> dict:
    """(stage, kind) -> the factor on its measured busy time that carries its slowdown s (busy / drift /
    isolated) to `ratio` times the run's concurrency: (1 + (s - 1) * ratio) / (s * drift)."""
    return {key: (1 + (s - 1) * ratio) / (s * drift) for key, s in slowdowns.items()}


def _compute_keys(orders) -> list[tuple[int, str, int]]:
    return sorted(
        {(a.stage, a.kind.value, a.microbatch) for order in orders for a in order if a.kind.is_compute}
    )


def _resampled(config: dict, rng: random.Random) -> dict:
    """run.json with each calibrated size's medians taken again over a resample of its samples (the
    samples as they are where the run kept none)."""
    samples = config.get("calibration_by_rows_samples_ms")
    if not samples:
        return config
    redrawn = {
        stage: {
            rows: {
                kind: statistics.median(rng.choices(values, k=len(values))) for kind, values in kinds.items()
            }
            for rows, kinds in sizes.items()
        }
        for stage, sizes in samples.items()
    }
    return config | {"calibration_by_rows": redrawn}


def step_levels(replayed_ms: list[float], config: dict) -> list[float]:
    """Every whole step the run timed over the median of its kind: the profiled ones (`replayed_ms`)
    and run.json's unprofiled ones. The machine's speed as it moved during the run."""
    unprofiled = config.get("step_times_unprofiled_ms") or []
    return [time / statistics.median(times) for times in (replayed_ms, unprofiled) if times for time in times]


def run_levels(analysis: Analysis, config: dict, assumed=()) -> tuple[list[float], float]:
    """The analysed run's step_levels and calibration_drift, from its replayed steps and run.json (no drift
    where from_trace `assumed` TIME_PER_ROW: a calibration made of the busy times drifted with them)."""
    replayed_ms = [s.step_time_ms for s in analysis.summary.replayed_steps]
    drift = 1.0 if Assumption.TIME_PER_ROW in assumed else calibration_drift(replayed_ms, config)
    return step_levels(replayed_ms, config), drift


class _Pools:
    """The run's own inputs to draw from: every measured cell's per (stage, kind), every step's tails."""

    def __init__(self, own: OwnSteps, p: int) -> None:
        cells = own.actions.group_by("stage", "kind").agg(pl.col(c) for c in INPUT_COLUMNS)
        self.cells = {(stage, kind): list(zip(*values)) for stage, kind, *values in cells.iter_rows()}
        self.tails: dict[int, list[Tail]] = {}
        for step, rank, *values in own.tails.select("step", "rank", *TAIL_COLUMNS).iter_rows():
            self.tails.setdefault(step, [Tail()] * p)[rank] = Tail(*values)
        self.transport = (own.blocking_sends, own.eager_receives, own.posted_receives)

    def step(self, orders, scale: dict, rng: random.Random) -> Step:
        """One step whose every action takes the inputs of a random measured cell of its (stage, kind)
        and whose ranks take the tails of a random analysed step."""
        inputs = {}
        for order in orders:
            for action in order:
                values = rng.choice(self.cells.get((action.stage, action.kind.value), [(0.0,) * 5]))
                drawn = Inputs(*(0.0 if value is None else value for value in values))
                inputs[action] = replace(drawn, work=drawn.work * scale.get(action, 1.0))
        tails = self.tails[rng.choice(sorted(self.tails))] if self.tails else []
        return Step(orders, inputs, tails, *self.transport)


def _replayed(target: Schedule, typical: Step, work: dict) -> tuple[Replayed, dict]:
    """`typical` replayed on `target` with each action's work times its factor in `work`, and its inputs."""
    scaled = {a: replace(i, work=i.work * work.get(a, 1.0)) for a, i in typical.inputs.items()}
    try:
        return replay(target, replace(typical, inputs=scaled)), scaled
    except Deadlock:  # the run's sends block (as measured), and this order needs them not to
        raise Unpredictable(
            f"{target.name} m={target.m} v={target.v} deadlocks with the run's blocking sends"
        ) from None


def predict(
    schedule: Schedule,
    model: StepModel,
    own: OwnSteps,
    ref: Reference,
    config: dict,
    m: int,
    where,
    levels: list[float] | None = None,
    name: str | None = None,
    v: int | None = None,
    source_concurrency: float | None = None,
    drift: float = 1.0,
    assumed: tuple[Assumption, ...] = (),
) -> Prediction:
    """The step of `schedule` rebuilt at m microbatches (as schedule `name` with v chunks per rank where
    given: `model`, `own` and `config` then carried to its stages by analysis.attribution.project, and
    `source_concurrency` the run's own, run_concurrency of its unprojected model); `ref` is the run's
    own (isolated times at its m), `config` its run.json, `levels` its steps' levels (step_levels;
    none: the interval leaves the level out), `drift` its calibration_drift, `assumed` what from_trace
    filled `config` with (with TIME_PER_ROW the interval takes in size_band); InputError naming `where`
    when the run cannot predict at all, Unpredictable when this m cannot be."""
    if not ref.isolated:
        raise InputError(where, "predict needs the isolated calibration (run.json calibration_by_rows)")
    name, v = name or schedule.name, v or schedule.v
    try:
        target = build(name, schedule.p, m, v)
    except ScheduleError as error:
        raise Unpredictable(f"{name} cannot run m={m}: {str(error).splitlines()[0]}") from None
    scale = _scale(model, config, schedule.m, target)
    executed = (name, m, v) == (schedule.name, schedule.m, schedule.v)
    orders = model.orders if executed else lower(target).orders
    typical = model.step(orders)
    own_share = run_concurrency(schedule, model) if source_concurrency is None else source_concurrency
    isolated = _own_isolated(model, config, schedule.m)
    slowdowns = {key: busy / drift / isolated[key] for key, busy in model.busy.items() if isolated.get(key)}
    # (stage, kind) -> its slowdown carried to m's concurrency, on its busy time; first at the run's own
    carried = _carried(slowdowns, 1.0, drift)

    def with_carried(factors: dict) -> dict:
        return {a: f * carried.get((a.stage, a.kind.value), 1.0) for a, f in factors.items()}

    for _ in range(CONCURRENCY_ROUNDS + 1):
        work = with_carried(scale)
        replayed, scaled = _replayed(target, typical, work)
        if own_share:
            carried = _carried(slowdowns, concurrency(replayed, orders) / own_share, drift)
    step_ns = replayed.makespan
    rng = random.Random(m)  # the same interval on every call
    pools = _Pools(own, schedule.p)
    drawn = [
        pools.step(orders, with_carried(_scale(model, _resampled(config, rng), schedule.m, target)), rng)
        for _ in range(SAMPLES)
    ]
    samples = sorted(r.makespan * rng.choice(levels or [1.0]) for r in replay_all(target, drawn))
    cut = round(SAMPLES * (1 - COVERAGE) / 2)
    low_ns, high_ns = min(samples[cut], step_ns), max(samples[-1 - cut], step_ns)
    resized = any(not math.isclose(f, 1.0) for f in scale.values())
    names = rests_on(assumed, executed, m == schedule.m, resized)
    if str(Assumption.TIME_PER_ROW) in names:  # each cell at the band's ends: the interval widened by as much
        band = {a: size_band(scale.get(a, 1.0)) for a in work}
        low_ns *= _replayed(target, typical, {a: f / band[a] for a, f in work.items()})[0].makespan / step_ns
        high_ns *= _replayed(target, typical, {a: f * band[a] for a, f in work.items()})[0].makespan / step_ns
    busy_ns = sum(i.work for a, i in scaled.items() if a.kind.is_compute)
    return Prediction(
        m=m,
        step_time_ms=step_ns / NS_PER_MS,
        step_time_low_ms=low_ns / NS_PER_MS,
        step_time_high_ms=high_ns / NS_PER_MS,
        bubble_formula=bubble_formula(target),
        bubble_predicted=1 - busy_ns / (target.p * step_ns),
        assumptions=names,
    )


def standard_predictions(analysis: Analysis, config: dict, where) -> list[Prediction] | None:
    """The run's step at every m runs calibrate (and its own): what `analyze` keeps beside its analysis
    (the verdict's m, the sweep page's curve); None where it cannot predict without assuming
    (from_trace: no calibration or no microbatch rows), which `predict` then names."""
    ms = sorted({*CALIBRATED_MS, analysis.schedule.m})
    if config is None or from_trace(analysis, config, ms)[1]:
        return None
    try:
        found, _ = predict_each(analysis, config, ms, where)
    except InputError:
        return None
    return found


def predict_each(
    analysis: Analysis, config: dict | None, ms: list[int], where
) -> tuple[list[Prediction], dict[int, str]]:
    """The analysed run's step predicted at each of `ms` that can be, and why each other cannot; from the
    trace alone where `config` (run.json) lacks the runner's calibration or rows (from_trace)."""
    config, assumed = from_trace(analysis, config, ms)
    ref = reference(analysis.cells, config, analysis.schedule.m)
    levels, drift = run_levels(analysis, config, assumed)
    found, skipped = [], {}
    for m in ms:
        try:
            model = (analysis.schedule, analysis.model, analysis.own, ref, config)
            found.append(predict(*model, m, where, levels, drift=drift, assumed=assumed))
        except Unpredictable as why:
            skipped[m] = str(why)
    return found, skipped
