"""Which schedule a run executed: its per-rank order of actions, replayed as it ran, and its name.

The order comes from the cells of the first analysed step; dependencies come from the data (what each
action consumes: runners.schedules.dependencies), not from a name, so any valid order is analysed. A
name only names the run: run.json's, else the generator whose order the traces match exactly, else
"custom" with the nearest generator's name beside it. Refused (InputError, naming the action): an
order that cannot run (an action twice or missing, a stage on two ranks, a backward before its
forward), steps that ran different actions, and cells that contradict their dependencies in time (a
consumer that ended before its producer began, with the ranks on one clock). Hints (`--schedule`,
`--m`) must agree with what the traces show, else the traces are not what the user thinks they are.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import polars as pl

from analysis.errors import InputError, TraceWarning
from runners.engines.torch_classes import TORCH_CLASSES
from runners.schedules import (
    COMPUTE_KINDS,
    SCHEDULES,
    Action,
    Kind,
    Schedule,
    ScheduleError,
    build,
    dependencies,
    placement_of,
    validate,
)
from runners.schedules.trace_names import LABEL_PREFIX

CUSTOM = "custom"


def compute_orders(cells: pl.DataFrame, step: int, p: int) -> tuple[tuple[Action, ...], ...]:
    """Per rank, the compute actions of `step` in the order they started."""
    chosen = cells.filter((pl.col("step") == step) & pl.col("kind").is_in(COMPUTE_KINDS)).sort(
        "rank", "start_ns"
    )
    orders: list[list[Action]] = [[] for _ in range(p)]
    for rank, stage, kind, microbatch in chosen.select("rank", "stage", "kind", "microbatch").iter_rows():
        orders[rank].append(Action(stage, Kind(kind), microbatch))
    return tuple(tuple(order) for order in orders)


def _candidates(p: int, m: int, v: int) -> list[Schedule]:
    """The generators' schedules for this shape. Interleaved with one chunk is 1F1B with a deeper
    warm-up: it names nothing a user would call interleaved, so it is not a candidate."""
    found = []
    for name in SCHEDULES:
        if name == "interleaved" and v == 1:
            continue
        try:
            found.append(build(name, p, m, v))
        except ScheduleError:
            continue
    return found


def _distance(orders: tuple[tuple[Action, ...], ...], other: Schedule) -> float:
    """How far apart two orders are: the mean displacement of each action between the two (Spearman's
    footrule per rank); an action only one of them runs counts as displaced by its rank's length."""
    total = count = 0
    for mine, theirs in zip(orders, other.orders):
        where = {action: k for k, action in enumerate(theirs)}
        total += sum(abs(k - where[a]) if a in where else len(mine) for k, a in enumerate(mine))
        total += sum(len(theirs) for a in theirs if a not in set(mine))
        count += len(mine) + len(theirs)
    return total / max(count, 1)


def nearest(executed: Schedule) -> str | None:
    """The generator whose order is closest to `executed`'s, among those of its shape and placement (None
    for a placement no generator uses: orders of other placements run other stages on each rank)."""
    found = [s for s in _candidates(executed.p, executed.m, executed.v) if s.placement == executed.placement]
    return min(found, key=lambda s: _distance(executed.orders, s)).name if found else None


def _placed(compute: pl.DataFrame, p: int, path: Path) -> tuple[str, tuple[int, ...], int]:
    """(placement, stage_ranks, v) from which rank ran which stage's cells."""
    owners = compute.group_by("stage").agg(pl.col("rank").unique()).sort("stage")
    shared = owners.filter(pl.col("rank").list.len() > 1)
    if shared.height:
        stage, ranks = shared.row(0)
        raise InputError(path, f"stage {stage} ran on ranks {sorted(ranks)}: a stage lives on one rank")
    stages = owners["stage"].to_list()
    if stages != list(range(len(stages))):
        raise InputError(path, f"the traces' stages are {stages}, not 0..{len(stages) - 1}")
    if len(stages) % p:
        raise InputError(path, f"{len(stages)} stages do not divide over {p} ranks")
    placement, stage_ranks = placement_of(tuple(owners["rank"].explode().to_list()), p)
    return placement, stage_ranks, len(stages) // p


def _runnable(schedule: Schedule, path: Path) -> Schedule:
    """`schedule` if every action is there once, on its stage's rank, in an order that can run."""
    try:
        validate(schedule)
    except ScheduleError as error:
        raise InputError(path, f"the traces' order cannot run: {str(error).splitlines()[0]}") from None
    return schedule


# torch.distributed.pipelining's (and so torchtitan's) schedule names that no generator here builds: as a
# hint each says only "the order is the traces' own" (it is analysed as custom, with its nearest name).
TORCH_ONLY_ORDERS = ("LoopedBFS",)


def hinted_name(hint: str, path: Path) -> str | None:
    """A --schedule hint as a generator's name: ours, or torch's (torchtitan's) class name with or without
    its Schedule prefix, in any case (Interleaved1F1B, ZBVZeroBubble, ...); None for a torch order no
    generator builds; InputError naming the accepted ones for any other."""
    names = {name: name for name in SCHEDULES} | {
        torch_class.removeprefix("Schedule").lower(): name for name, torch_class in TORCH_CLASSES.items()
    }
    wanted = hint.lower().removeprefix("schedule")
    if wanted in names:
        return names[wanted]
    if wanted in {name.lower() for name in TORCH_ONLY_ORDERS}:
        return None
    known = [*SCHEDULES, *(c.removeprefix("Schedule") for c in TORCH_CLASSES.values()), *TORCH_ONLY_ORDERS]
    raise InputError(path, f"--schedule {hint!r:.40} is no schedule name; known: {', '.join(known)}")


def infer(
    cells: pl.DataFrame, p: int, path: Path, schedule: str | None = None, m: int | None = None
) -> tuple[Schedule, str | None]:
    """The schedule the traces ran, and the nearest named one when it is custom; `schedule`/`m` are hints
    that must agree with them (`schedule` in any spelling `hinted_name` takes)."""
    schedule = None if schedule is None else hinted_name(schedule, path)
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
    if compute.height == 0:
        raise InputError(path, f"no {LABEL_PREFIX}<action> labels in any trace; cannot tell the schedule")
    seen_m = compute["microbatch"].n_unique()
    if m is not None and m != seen_m:
        raise InputError(path, f"--m {m} disagrees with the traces, which show {seen_m} microbatches")
    placement, stage_ranks, v = _placed(compute, p, path)
    orders = compute_orders(compute, compute["step"].min(), p)
    executed = _runnable(
        Schedule(CUSTOM, p, seen_m, v, orders, placement=placement, stage_ranks=stage_ranks), path
    )
    _check_every_step(executed, compute, path)
    names = [s.name for s in _candidates(p, seen_m, v) if s.orders == orders and s.placement == placement]
    if schedule is not None and schedule not in names:
        shown = (
            ", ".join(names) or f"none of {', '.join(SCHEDULES)}: a custom order, nearest {nearest(executed)}"
        )
        raise InputError(path, f"--schedule {schedule} disagrees with the traces' order (it matches {shown})")
    name = schedule or (names[0] if names else None)
    return (replace(executed, name=name), None) if name else (executed, nearest(executed))


def from_run_json(run: dict, path: Path, cells: pl.DataFrame) -> Schedule | None:
    """run.json's schedule, built only once its m and v agree with the traces' microbatches and stages
    (a wrong m of 10**9 must be an error line, not a schedule that fills memory); None where it says
    "custom": the traces' own order is the schedule."""
    try:
        name, p, m, v = run["schedule"], int(run["p"]), int(run["m"]), int(run.get("v", 1))
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(path / "run.json", f"no usable schedule/p/m/v: {error}") from None
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
    seen = {"m": compute["microbatch"].n_unique(), "stages": compute["stage"].n_unique()}
    if compute.height and (m, p * v) != (seen["m"], seen["stages"]):
        raise InputError(
            path / "run.json",
            f"says m={m}, v={v} (p={p}) but the traces show {seen['m']} microbatches "
            f"and {seen['stages']} stages",
        )
    if name == CUSTOM:
        return None
    try:
        return build(name, p, m, v)
    except (TypeError, ValueError) as error:  # ScheduleError is a ValueError
        raise InputError(path / "run.json", f"no usable schedule/p/m/v: {error}") from None


def as_executed(named: Schedule, cells: pl.DataFrame, path: Path) -> Schedule:
    """The named schedule with the per-rank order the traces show, where the two differ.

    Engines order the same schedule differently (torch's ZB1P defers W unlike our ZB-H1), and the
    replay must be of what ran, not of what our generator would have run.
    """
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
    if compute.height == 0:
        return named
    difference = _first_difference(named, compute)
    if difference is not None:
        raise InputError(
            path,
            f"the traces' actions are not those of {named.name} p={named.p} m={named.m} "
            f"v={named.v}: {difference}",
        )
    executed = _runnable(replace(named, orders=compute_orders(compute, compute["step"].min(), named.p)), path)
    if executed.orders == named.orders:
        return named
    others = [s.name for s in _candidates(named.p, named.m, named.v) if s.orders == executed.orders]
    if others:  # not an engine's own ordering: the run.json names the wrong schedule
        warnings.warn(
            f"{path / 'run.json'}: says {named.name}, but every rank ran {others[0]}'s order; "
            f"replayed as it ran",
            TraceWarning,
            stacklevel=2,
        )
    return executed


def _check_every_step(executed: Schedule, compute: pl.DataFrame, path: Path) -> None:
    """Every step ran the first step's actions, each once (a label dropped, doubled or stray in any step
    would make the steps incomparable)."""
    difference = _first_difference(executed, compute)
    if difference is not None:
        raise InputError(path, f"the traces' steps ran different actions: {difference}")


def _first_difference(named: Schedule, compute: pl.DataFrame) -> str | None:
    """The first (step, rank, action) whose count in the traces is not the schedule's, in words; None if
    every step has exactly the schedule's actions (a duplicated, dropped or stray label in any step)."""
    action = pl.format("{}{}{}", "stage", "kind", "microbatch")
    expected = (
        pl.DataFrame(
            [(rank, str(a)) for rank, order in enumerate(named.orders) for a in order],
            schema=["rank", "action"],
            orient="row",
        )
        .group_by("rank", "action")
        .agg(expected=pl.len())
    )
    wanted = compute.select(pl.col("step").unique()).join(expected, how="cross")
    seen = compute.group_by("rank", "step", action=action).agg(seen=pl.len())
    differ = (
        wanted.join(seen, on=["rank", "step", "action"], how="full", coalesce=True)
        .with_columns(pl.col("expected", "seen").fill_null(0).cast(pl.Int64))
        .filter(pl.col("expected") != pl.col("seen"))
        .sort("step", "rank", "action")
    )
    if differ.height == 0:
        return None
    row = differ.row(0, named=True)
    ran = f"step {row['step']} rank {row['rank']} ran {LABEL_PREFIX}{row['action']} {row['seen']}x"
    return f"{ran}, the schedule {row['expected']}x"


def check_causality(schedule: Schedule, cells: pl.DataFrame, sources: dict[int, Path]) -> None:
    """Every compute cell ended no earlier than each of its inputs began (ranks on one clock): a consumer
    that ended before its producer began is a trace that contradicts the data flow."""
    edges = [
        (a.stage, a.kind.value, a.microbatch, dep.stage, dep.kind.value, dep.microbatch)
        for order in schedule.orders
        for a in order
        for dep in dependencies(schedule, a)
    ]
    if not edges:
        return
    keys = ["stage", "kind", "microbatch"]
    table = pl.DataFrame(edges, schema=[*keys, *(f"dep_{k}" for k in keys)], orient="row")
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS)).select(
        "rank", "step", *keys, "start_ns", "end_ns"
    )
    inputs = compute.rename({k: f"dep_{k}" for k in (*keys, "rank", "start_ns", "end_ns")})
    joined = compute.join(table, on=keys).join(inputs, on=["step", *(f"dep_{k}" for k in keys)])
    broken = joined.filter(pl.col("end_ns") < pl.col("dep_start_ns")).sort("step", "start_ns")
    if broken.height:
        row = broken.row(0, named=True)
        consumer = f"{LABEL_PREFIX}{row['stage']}{row['kind']}{row['microbatch']}"
        producer = f"{LABEL_PREFIX}{row['dep_stage']}{row['dep_kind']}{row['dep_microbatch']}"
        where = sources.get(row["rank"], f"rank {row['rank']}")
        late = (row["dep_start_ns"] - row["end_ns"]) / 1e6
        raise InputError(
            where,
            f"step {row['step']}: {consumer} ended {late:.3f} ms before its input {producer} "
            f"(rank {row['dep_rank']}) began, with the ranks on one clock",
        )
