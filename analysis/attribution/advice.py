"""Which schedule, m and v to run at this run's p: every candidate predicted from the one run.

Each candidate (a schedule an engine runs, at an m and v it admits) is `predict`ed
(analysis.attribution.predict) from the run's measurements carried to its stages and kinds
(analysis.attribution.project), so one model answers both. Its peak activation memory per rank replays
its order's stash (runners.schedules.held): each forward holds its microbatch's rows times the bytes
per row that the run's stash peak on that stage implies (unknown where the traces have no memory
events: the advice then names MEMORY_UNKNOWN, and its ranking ignores memory). A candidate that needs
what the run did not measure names what was assumed (`assumptions`, vocabulary.Assumption; `caveats`
for another engine) and is `extrapolated`; one whose interval reaches beyond PROMISED_STEP_ERROR of its
step says that too. A run without the runner's calibration or rows is advised from the trace alone
(analysis.attribution.from_trace), each candidate naming what that assumes. A run whose levels
cannot be trusted (contended, noisy, low trust) still lists every candidate, with `ranked` false and why. A run
made with --calibrate-advice (run.json advice_calibration) has its chunks, I and W timed and its stash
per row measured at every advised v: those replace the layer shares and the unit-time split.
"""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import accumulate

from analysis.attribution.from_trace import from_trace, rows_at
from analysis.attribution.predict import Unpredictable, predict, run_concurrency, run_levels
from analysis.attribution.project import projection, stage_shares
from analysis.attribution.reference import reference
from analysis.results import Analysis
from analysis.schema import Advice, Candidate
from analysis.vocabulary import Assumption, Level
from runners.engines.torch_classes import TORCH_CLASSES, TORCH_ONLY
from runners.presets import PRESETS, preset_problem
from runners.schedules import Kind, Schedule, ScheduleError, build, held
from runners.schedules.generate import check_request

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}  # run.json dtype -> bytes an element
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


def run_caveats(analysis: Analysis) -> list[str]:
    """Why the run's level cannot be trusted: its flags' notes, and its trust where low (the assumptions
    of a run without calibration are named on each candidate instead)."""
    summary = analysis.summary
    notes = list(summary.notes) or [f"run flagged {flag}" for flag in summary.flags]
    low = summary.trust is not None and summary.trust.level != Level.HIGH
    return notes + (["the trust is low (" + "; ".join(summary.trust.reasons) + ")"] if low else [])


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


def candidate_assumptions(analysis: Analysis, target: Schedule, timed: bool) -> list[str]:
    """What a candidate's stages assume beyond the run's measurements (`timed`: its stages', I's and W's
    times and stash per row calibrated by the runner)."""
    source = analysis.schedule
    measured_kinds = {kind for _, kind in analysis.model.kinds}
    assumed = []
    if target.n_stages != source.n_stages and not timed:
        assumed.append(Assumption.LAYERS_SPLIT)
    if target.split_backward and Kind.I.value not in measured_kinds and not timed:
        assumed.append(Assumption.BACKWARD_SPLIT)
    return [str(a) for a in assumed]


def candidate_caveats(analysis: Analysis, engine: str, target: Schedule) -> list[str]:
    """What a candidate's engine changes beyond the run's measurements."""
    caveats = []
    own = analysis.summary.engine
    if engine != own:
        ran = f"the {own} run's" if own else "this run's (its engine unnamed)"
        caveats.append(f"runs on the {engine} engine; predicted from {ran} host times and stash")
    if engine == "torch" and target.name == "zb":
        caveats.append(TORCH_ZB)
    return caveats


def advise(
    analysis: Analysis, config: dict | None, requests, memory_limit_bytes: int | None, where
) -> tuple[Advice, dict]:
    """Every requested (engine, schedule, m, v) predicted, best first, and why each skipped one could not be;
    from the trace alone where `config` (run.json) lacks the runner's calibration or rows (from_trace)."""
    source = analysis.schedule
    config, assumed = from_trace(analysis, config, sorted({m for _, _, m, _ in requests}))
    ref = reference(analysis.cells, config, source.m)
    levels, drift = run_levels(analysis, config, assumed)
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
            guess = predict(
                source, model, own, ref, moved_config, m, where, levels, name, v, share, drift, assumed
            )
        except Unpredictable as why:
            skipped[(engine, name, m, v)] = str(why)
            continue
        target = build(name, source.p, m, v)
        timed = timed_pair(config, source, v)
        kept = output_row_bytes(config) if engine == "torch" != analysis.summary.engine else 0.0
        peak = peak_bytes(target, config, per_row, source.n_stages, timed, kept)
        names = guess.assumptions + candidate_assumptions(analysis, target, timed is not None)
        engine_caveats = candidate_caveats(analysis, engine, target)
        fits = memory_limit_bytes is None or peak is None or peak <= memory_limit_bytes
        times = (guess.step_time_ms, guess.step_time_low_ms, guess.step_time_high_ms, guess.bubble_formula)
        caveats = engine_caveats + spread_caveat(*times[:3])
        extrapolated = bool(names or engine_caveats)
        found.append(Candidate(engine, name, m, v, *times, peak, fits, extrapolated, caveats, names))
    found.sort(key=lambda c: (not c.fits, c.step_time_ms))
    s = analysis.summary
    origin = {key: getattr(s, key) for key in ("engine", "schedule", "p", "m", "v", "step_time_ms")}
    memory = [] if per_row is not None else [str(Assumption.MEMORY_UNKNOWN)]
    caveats = run_caveats(analysis)
    return Advice(not caveats, caveats, memory_limit_bytes, origin, found, memory), skipped
