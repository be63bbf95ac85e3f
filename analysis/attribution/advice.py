"""Which schedule, m and v to run at this run's p: every candidate predicted from the one run.

Each candidate (a schedule an engine runs, at an m and v it admits) is `predict`ed
(analysis.attribution.predict) from the run's measurements carried to its stages and kinds
(analysis.attribution.project), so one model answers both. Its peak activation memory per rank replays
its order's stash (runners.schedules.held): each forward holds its microbatch's rows times the bytes
per row that the run's stash peak on that stage implies. A candidate that needs what the run did not
measure says what was assumed (`caveats`) and is `extrapolated`; one whose interval reaches beyond
PROMISED_STEP_ERROR of its step says that too. A run whose levels cannot be trusted (contended, noisy,
no calibration) still lists every candidate, with `ranked` false and why. A run
made with --calibrate-advice (run.json advice_calibration) has its chunks, I and W timed and its stash
per row measured at every advised v: those replace the layer shares and the unit-time split.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from itertools import accumulate

from analysis.attribution.predict import Unpredictable, predict, rows_at, run_concurrency, run_levels
from analysis.attribution.project import projection, stage_shares
from analysis.attribution.reference import reference
from analysis.results import Analysis
from analysis.schema import Advice, Candidate
from runners.engines.torch_classes import TORCH_CLASSES, TORCH_ONLY
from runners.presets import PRESETS, calibration_rows, preset_problem
from runners.schedules import Kind, Schedule, ScheduleError, build, held
from runners.schedules.generate import check_request

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}  # run.json dtype -> bytes an element
UNCALIBRATED = (
    "no calibration in run.json: every stage's time taken as its measured busy time, linear in rows"
)
# The step error a prediction is offered within (the bench checks it: bench/advice.py); a candidate whose
# interval, from the run's own spread, reaches further says so in its caveats
PROMISED_STEP_ERROR = 0.10
TORCH_ZB = f"torch runs zb as {TORCH_CLASSES['zb']}, whose W order differs from the one replayed here"


def admitted(engine: str, p: int, config: dict, schedules, ms, vs) -> list[tuple[str, str, int, int]]:
    """(engine, schedule, m, v) of every request the engines would accept at p: a schedule only the
    torch engine runs goes there, every other stays on the run's engine."""
    preset = PRESETS.get(config.get("preset") or "")
    found = []
    for name in schedules:
        for m in ms:
            for v in vs:
                try:
                    check_request(name, p, m, v)
                except ScheduleError:
                    continue
                rows = replace(preset, rows=sum(rows_at(config, m))) if preset else None
                if rows and preset_problem(rows, m, v if config.get("model") is None else 1):
                    continue
                found.append(("torch" if name in TORCH_ONLY else engine, name, m, v))
    return found


def linear_calibration(analysis: Analysis, config: dict) -> dict:
    """run.json given a calibration from the run's measured busy times, each taken as linear in rows
    (for a run that has none: no small-GEMM effect, no slowdown; UNCALIBRATED says so)."""
    own_rows = statistics.mean(rows_at(config, analysis.schedule.m))
    total = sum(rows_at(config, analysis.schedule.m))
    per_stage: dict[str, dict[str, float]] = {}
    for (stage, kind), ns in analysis.model.busy.items():
        per_stage.setdefault(str(stage), {})[f"{kind}_ms"] = ns / 1e6 / own_rows
    by_rows = {
        stage: {
            str(r): {k: ms * r for k, ms in kinds.items()}
            for r in calibration_rows(total, analysis.schedule.m)
        }
        for stage, kinds in per_stage.items()
    }
    whole = {stage: {k: ms * total for k, ms in kinds.items()} for stage, kinds in per_stage.items()}
    return config | {
        "calibration": whole,
        "calibration_by_rows": by_rows,
        "calibration_by_rows_samples_ms": {},
    }


def stash_bytes_per_row(schedule: Schedule, config: dict, peaks: list[int | None]) -> dict[int, float] | None:
    """Per stage of the run, the bytes one row of a microbatch holds there: each rank's measured stash
    peak over the most rows its order holds at once; None where a rank's peak is unknown."""
    if any(peak is None for peak in peaks):
        return None
    rows = rows_at(config, schedule.m)
    most = [max(rank, default=0) for rank in held(schedule, lambda a: rows[a.microbatch])]
    return {
        stage: peaks[r] / most[r] for r in range(schedule.p) for stage in schedule.stages_of(r) if most[r]
    }


def peak_bytes(
    target: Schedule,
    config: dict,
    per_row: dict[int, float] | None,
    n_source: int,
    timed: tuple | None = None,
    kept_row_bytes: float = 0.0,
) -> int | None:
    """The largest rank's predicted stash peak: each forward holds its rows times its stage's bytes per
    row, carried as the stage's time is (its share of the run's stages), or where the runner measured
    the stash per row on both geometries (`timed`: advice_calibration at the run's v and the target's)
    as the run's bytes per row times the target stage's measured over its shares' measured. On the torch
    engine (`kept_row_bytes`: output_row_bytes) the last stage's rank also holds each forward's output
    there until the step ends: torch's schedules return them."""
    if per_row is None:
        return None
    shares = stage_shares(n_source, target.n_stages)
    per_stage = {c: sum(float(share) * per_row[s] for s, share in parts) for c, parts in shares.items()}
    if timed is not None:
        source, chunks = (entry["stash_bytes_per_row"] for entry in timed)
        for c, parts in shares.items():
            per_stage[c] *= chunks[str(c)] / sum(float(share) * source[str(s)] for s, share in parts)
    rows = rows_at(config, target.m)
    live = held(target, lambda a: rows[a.microbatch] * per_stage[a.stage])
    last = target.n_stages - 1
    kept = [  # the last stage's outputs a torch schedule keeps from their forward to the step's end
        accumulate(
            rows[a.microbatch] * kept_row_bytes if (a.kind, a.stage) == (Kind.F, last) else 0.0 for a in order
        )
        for order in target.orders
    ]
    return round(max(max(map(sum, zip(rank, more)), default=0.0) for rank, more in zip(live, kept)))


def output_row_bytes(config: dict) -> float:
    """The bytes of one row of a stage's output (its input's shape, run.json dims.sample_shape, and
    dtype); 0 where the dtype is not one of DTYPE_BYTES."""
    dims = config.get("dims") or {}
    return math.prod(dims.get("sample_shape") or [0]) * DTYPE_BYTES.get(config.get("dtype") or "", 0)


def run_caveats(analysis: Analysis, calibrated: bool) -> list[str]:
    """Why the run's level cannot be trusted: its flags' notes, and no calibration."""
    notes = list(analysis.summary.notes) or [f"run flagged {flag}" for flag in analysis.summary.flags]
    return notes + ([] if calibrated else [UNCALIBRATED])


def spread_caveat(step_ms: float, low_ms: float, high_ms: float) -> list[str]:
    """Where the interval reaches beyond PROMISED_STEP_ERROR of the point: the run's own spread (its cells',
    its steps' levels) allows a larger error than the one advice is checked against."""
    if low_ms >= step_ms * (1 - PROMISED_STEP_ERROR) and high_ms <= step_ms * (1 + PROMISED_STEP_ERROR):
        return []
    return [
        f"its interval ({low_ms:.1f}-{high_ms:.1f} ms) reaches beyond {PROMISED_STEP_ERROR:.0%} of the "
        "predicted step: the run's own spread allows a larger error"
    ]


def timed_pair(config: dict, source: Schedule, v: int) -> tuple[dict, dict] | None:
    """run.json advice_calibration (runners.advice_calibration) at the run's v and at v, where the
    runner timed both (--calibrate-advice)."""
    timed = config.get("advice_calibration") or {}
    pair = timed.get(str(source.v)), timed.get(str(v))
    return None if None in pair else pair


def candidate_caveats(
    analysis: Analysis, engine: str, target: Schedule, calibrated: bool, timed: bool
) -> list[str]:
    """What a candidate assumes beyond the run's measurements (`timed`: its stages', I's and W's times
    and stash per row calibrated by the runner)."""
    source = analysis.schedule
    measured_kinds = {kind for _, kind in analysis.model.kinds}
    caveats = []
    if target.n_stages != source.n_stages and not timed:
        caveats.append(
            f"stage times at v={target.v} taken as shares of the layers of the run's stages at v={source.v}, "
            "host time per stage likewise; its stash per microbatch too"
        )
    if target.split_backward and Kind.I.value not in measured_kinds and not timed:
        caveats.append(
            "B split into I and W in their unit-time ratio 1:1; the run measured no I or W "
            "(a run with --calibrate-advice times them)"
        )
    if engine != analysis.summary.engine:
        caveats.append(
            f"runs on the {engine} engine; predicted from the {analysis.summary.engine} run's host times and stash"
        )
    if engine == "torch" and target.name == "zb":
        caveats.append(TORCH_ZB)
    if not calibrated:
        caveats.append(UNCALIBRATED)
    return caveats


def advise(
    analysis: Analysis, config: dict, requests, memory_limit_bytes: int | None, where
) -> tuple[Advice, dict]:
    """Every requested (engine, schedule, m, v) predicted, best first, and why each skipped one could not be."""
    source = analysis.schedule
    calibrated = bool(config.get("calibration_by_rows"))
    config = config if calibrated else linear_calibration(analysis, config)
    ref = reference(analysis.cells, config, source.m)
    levels, drift = run_levels(analysis, config)
    drift = drift if calibrated else 1.0  # a calibration made of the busy times themselves drifted with them
    per_row = stash_bytes_per_row(source, config, [r.peak_activation_bytes for r in analysis.summary.ranks])
    own_rows = rows_at(config, source.m)[0]
    share = run_concurrency(source, analysis.model)  # what its slowdown was measured at
    carried = {}  # v -> the run carried to p * v stages: (model, own, config)
    for v in sorted({v for *_, v in requests}):
        moved = projection(analysis.model.kinds, source.n_stages, source.p * v)
        timed = timed_pair(config, source, v)
        if timed is not None:
            moved = moved.calibrated(*(entry["calibration_by_rows"] for entry in timed), own_rows)
        carried[v] = (
            moved.model(analysis.model),
            moved.own(analysis.own, analysis.model),
            moved.config(config, None if timed is None else timed[1]),
        )
    found, skipped = [], {}
    for engine, name, m, v in requests:
        model, own, moved_config = carried[v]
        try:
            guess = predict(source, model, own, ref, moved_config, m, where, levels, name, v, share, drift)
        except Unpredictable as why:
            skipped[(engine, name, m, v)] = str(why)
            continue
        target = build(name, source.p, m, v)
        timed = timed_pair(config, source, v)
        kept = output_row_bytes(config) if engine == "torch" != analysis.summary.engine else 0.0
        peak = peak_bytes(target, config, per_row, source.n_stages, timed, kept)
        assumed = candidate_caveats(analysis, engine, target, calibrated, timed is not None)
        fits = memory_limit_bytes is None or peak is None or peak <= memory_limit_bytes
        times = (guess.step_time_ms, guess.step_time_low_ms, guess.step_time_high_ms, guess.bubble_formula)
        caveats = assumed + spread_caveat(*times[:3])
        found.append(Candidate(engine, name, m, v, *times, peak, fits, bool(assumed), caveats))
    found.sort(key=lambda c: (not c.fits, c.step_time_ms))
    caveats = run_caveats(analysis, calibrated)
    s = analysis.summary
    origin = {key: getattr(s, key) for key in ("engine", "schedule", "p", "m", "v", "step_time_ms")}
    return Advice(not caveats, caveats, memory_limit_bytes, origin, found), skipped
