"""Frames for the index: one row per analysed run, and the sweep views built from them.

A family is one (schedule, p, v, engine, device) measured at several m. Where a setting was measured
more than once, the run of median step time stands for it (the lower one of an even count: a run that
happened, so its terms still sum to its step), and `repeats` says how many there were.
"""

from __future__ import annotations

import polars as pl

from analysis.results import Analysis
from analysis.schema import Summary
from analysis.vocabulary import RUNGS
from runners.schedules import SCHEDULES, Schedule, ScheduleError, bubble_formula, build

ENGINES = ("native", "torch")
RUN_COLUMNS = {
    "run_id": pl.String,
    "schedule": pl.String,
    "engine": pl.String,
    "device": pl.String,
    "p": pl.Int64,
    "m": pl.Int64,
    "v": pl.Int64,
    "step_time_ms": pl.Float64,
    "bubble_formula": pl.Float64,
    "bubble_measured": pl.Float64,
    "peak_activation_bytes": pl.Float64,
    "rows_per_microbatch": pl.Int64,
    **{term: pl.Float64 for term in RUNGS},
}


def run_row(run_id: str, summary: Summary, config: dict | None = None) -> dict:
    """The index's numbers for one analysed run, flat (run.json's rows_per_microbatch: set when the
    microbatch size was fixed rather than the batch)."""
    peaks = [
        entry.peak_activation_bytes for entry in summary.ranks if entry.peak_activation_bytes is not None
    ]
    row = {name: getattr(summary, name) for name in RUN_COLUMNS if name in Summary.__struct_fields__}
    return row | {
        "run_id": run_id,
        "peak_activation_bytes": max(peaks, default=None),
        "rows_per_microbatch": (config or {}).get("rows_per_microbatch"),
        **{term: getattr(summary.waterfall_ms, term) for term in RUNGS},
    }


def _engine() -> pl.Expr:
    """The engine for a label; traces from elsewhere name none (a null would make the label null)."""
    return pl.col("engine").fill_null("unknown engine")


def runs_frame(rows: list[dict]) -> pl.DataFrame:
    """All analysed runs, newest first, with the family and schedule labels the charts group by."""
    frame = pl.DataFrame(rows, schema=RUN_COLUMNS)
    return frame.with_columns(
        family=pl.format("{} p={} v={} ({}, {})", "schedule", "p", "v", _engine(), "device"),
        schedule_label=pl.when(pl.col("v") > 1)
        .then(pl.format("{} v={}", "schedule", "v"))
        .otherwise("schedule"),
    )


def families(runs: pl.DataFrame) -> pl.DataFrame:
    """Runs whose family was measured at two or more values of m."""
    return runs.filter(pl.col("m").n_unique().over("family") >= 2)


def formula_curve(family_runs: pl.DataFrame) -> pl.DataFrame:
    """The formula bubble (runners.schedules.bubble_formula: the schedule's own geometry) at every m up to
    the family's largest that the schedule can be built for; a custom order has no curve."""
    families = family_runs.group_by("family").agg(pl.col("schedule", "p", "v").first(), top=pl.col("m").max())
    rows = [
        (family, m, bubble_formula(schedule))
        for family, name, p, v, top in families.iter_rows()
        for m in range(1, top + 1)
        if (schedule := _buildable(name, p, m, v)) is not None
    ]
    return pl.DataFrame(
        rows, schema={"family": pl.String, "m": pl.Int64, "bubble_formula": pl.Float64}, orient="row"
    ).sort("family", "m")


def _buildable(name: str, p: int, m: int, v: int) -> Schedule | None:
    if name not in SCHEDULES:
        return None
    try:
        return build(name, p, m, v)
    except ScheduleError:
        return None


def median_runs(runs: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """One run per `key`: the one of median step time over its repeats, with `repeats`, their count."""
    ranked = runs.with_columns(
        repeats=pl.len().over(key),
        position=pl.col("step_time_ms").rank("ordinal").over(key) - 1,
    )
    return ranked.filter(pl.col("position") == (pl.col("repeats") - 1) // 2).drop("position")


def median_per_m(family_runs: pl.DataFrame) -> pl.DataFrame:
    return median_runs(family_runs, ["family", "m"]).sort("family", "m")


def _terms_long(frame: pl.DataFrame, index: list[str]) -> pl.DataFrame:
    """Waterfall terms in long form with their stacking order; a null term (not measurable) counts 0."""
    return (
        frame.select(*index, *[pl.col(t).fill_null(0.0) for t in RUNGS])
        .unpivot(index=index, variable_name="term", value_name="ms")
        .with_columns(order=pl.col("term").replace_strict(list(RUNGS), list(range(len(RUNGS)))))
    )


def step_terms(newest: pl.DataFrame) -> pl.DataFrame:
    return _terms_long(newest, ["family", "m"])


def measured_steps(newest: pl.DataFrame) -> pl.DataFrame:
    """Measured step time per (family, m) and how many runs it is the median of, with the family's best m
    flagged."""
    return newest.select(
        "family",
        "m",
        "step_time_ms",
        "repeats",
        best=pl.col("step_time_ms") == pl.col("step_time_ms").min().over("family"),
    )


def prediction_source(newest: pl.DataFrame) -> str:
    """The run a family's predicted curve comes from: the one at its middle measured m (the lower one)."""
    ordered = newest.sort("m")
    return ordered["run_id"][(ordered.height - 1) // 2]


def predicted_steps(analysis: Analysis, ms: list[int]) -> pl.DataFrame:
    """The step time `analyze` predicted from one run (Analysis.predictions) at each of `ms`, with the
    predicted best m flagged; empty where the run has no isolated calibration."""
    found = [p for p in analysis.predictions or [] if p.m in ms]
    frame = pl.DataFrame(
        [(p.m, p.step_time_ms) for p in found],
        schema={"m": pl.Int64, "step_time_ms": pl.Float64},
        orient="row",
    )
    return frame.with_columns(best=pl.col("step_time_ms") == pl.col("step_time_ms").min())


def schedule_comparison(runs: pl.DataFrame) -> pl.DataFrame:
    """Waterfall terms per schedule, for every (p, m, engine, device) measured with several schedules."""
    labelled = runs.with_columns(setting=pl.format("p={} m={} ({}, {})", "p", "m", _engine(), "device"))
    chosen = median_runs(labelled, ["setting", "schedule_label"])
    shared = chosen.filter(pl.col("schedule_label").n_unique().over("setting") >= 2)
    terms = _terms_long(shared, ["setting", "schedule_label", "run_id"])
    return terms.rename({"schedule_label": "schedule"}).sort("setting", "schedule", "order")


def engine_pairs(runs: pl.DataFrame) -> pl.DataFrame:
    """Native and torch.distributed.pipelining runs of one configuration side by side (each the median
    run of its repeats, their count beside it), with their ratio."""
    key = ["schedule", "p", "m", "v", "device"]
    chosen = median_runs(runs.filter(pl.col("engine").is_in(ENGINES)), [*key, "engine"])
    wide = {
        value: chosen.pivot(on="engine", index=key, values=value).rename(
            {engine: f"{engine}{suffix}" for engine in ENGINES}, strict=False
        )
        for value, suffix in (("step_time_ms", ""), ("repeats", "_runs"))
    }
    both = wide["step_time_ms"].join(wide["repeats"], on=key)
    columns = [*ENGINES, *(f"{engine}_runs" for engine in ENGINES)]
    if not set(columns) <= set(both.columns):
        return pl.DataFrame(
            schema={
                **{k: RUN_COLUMNS[k] for k in key},
                **{engine: pl.Float64 for engine in ENGINES},
                **{f"{engine}_runs": pl.UInt32 for engine in ENGINES},
                "ratio": pl.Float64,
            }
        )
    return both.drop_nulls(list(ENGINES)).with_columns(ratio=pl.col("torch") / pl.col("native")).sort(key)


def peak_memory(family_runs: pl.DataFrame) -> pl.DataFrame:
    """Peak activation memory per (family, m) in MiB, where the runs recorded it; a fixed batch and a fixed
    microbatch size are separate lines (the first keeps GPipe flat, the second 1F1B)."""
    batch = (
        pl.when(pl.col("rows_per_microbatch").is_null())
        .then(pl.lit("fixed batch"))
        .otherwise(pl.format("{} rows/microbatch", "rows_per_microbatch"))
    )
    labelled = family_runs.with_columns(family=pl.format("{}, {}", "family", batch))
    return (
        median_per_m(labelled)
        .drop_nulls("peak_activation_bytes")
        .select("family", "m", peak_mib=pl.col("peak_activation_bytes") / 2**20)
    )
