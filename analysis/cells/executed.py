"""Which schedule a run executed: from run.json, or inferred from the traces' labels.

Without run.json: p is the number of ranks, v the stages per rank, m the microbatches seen, and the
schedule the generator whose per-rank compute order matches the first analysed step's. Hints
(`--schedule`, `--m`) must agree with what the traces show, else the traces are not what the user
thinks they are: an InputError.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import polars as pl

from analysis.errors import InputError
from analysis.traces.load import TraceWarning
from runners.schedules import COMPUTE_KINDS, SCHEDULES, Action, Kind, Schedule, ScheduleError, build
from runners.schedules.trace_names import LABEL_PREFIX


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
    found = []
    for name in SCHEDULES:
        try:
            found.append(build(name, p, m, v))
        except ScheduleError:
            continue
    return found


def infer(
    cells: pl.DataFrame, p: int, path: Path, schedule: str | None = None, m: int | None = None
) -> Schedule:
    """The schedule the traces ran; `schedule`/`m` are hints that must agree with them."""
    compute = cells.filter(pl.col("kind").is_in(COMPUTE_KINDS))
    if compute.height == 0:
        raise InputError(path, "no PP:<action> labels in any trace; cannot tell the schedule")
    stages = compute["stage"].n_unique()
    seen_m = compute["microbatch"].n_unique()
    if m is not None and m != seen_m:
        raise InputError(path, f"--m {m} disagrees with the traces, which show {seen_m} microbatches")
    if stages % p:
        raise InputError(path, f"{stages} stages do not divide over {p} ranks")
    step = compute["step"].min()
    measured = compute_orders(compute, step, p)
    matches = [s for s in _candidates(p, seen_m, stages // p) if s.orders == measured]
    names = [s.name for s in matches]
    if schedule is not None:
        if schedule not in names:
            shown = ", ".join(names) or "none of " + ", ".join(SCHEDULES)
            raise InputError(
                path, f"--schedule {schedule} disagrees with the traces' order (it matches {shown})"
            )
        return next(s for s in matches if s.name == schedule)
    if not matches:
        raise InputError(
            path, f"the traces' action order matches none of {', '.join(SCHEDULES)} (p={p}, m={seen_m})"
        )
    return matches[0]


def from_run_json(run: dict, path: Path, cells: pl.DataFrame) -> Schedule:
    """run.json's schedule, built only once its m and v agree with the traces' microbatches and stages
    (a wrong m of 10**9 must be an error line, not a schedule that fills memory)."""
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
    executed = replace(named, orders=compute_orders(compute, compute["step"].min(), named.p))
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
