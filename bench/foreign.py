"""Part `foreign`: `advise` from the trace alone (only the rank traces, no run.json) against the same runs'
calibrated advice and against the step measured or generated at each candidate.

Synthetic: GPU- and CPU-shaped runs with a slowdown of SLOWDOWN (the generator's, one factor in every
order) and the generator's own step at each target: at the source's m, the other schedules; at other m
with run.json stripped to its microbatch's rows (ROWS_KEPT), which the trace cannot tell. Runs: gpipe and
1f1b at p=2, m=4 and 8, `repeats` times each; each run advised twice (its own run directory, and a copy
holding its rank traces alone) for every schedule and m of them, against the median measured step there.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path

from analysis.cli.advise import advice
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.traces.run_files import trace_files
from bench.runs import P, RunPlan, request
from runners.launch import LaunchError, launch
from runners.schedules import build
from synthetic import write_run

SCHEDULES = ("gpipe", "1f1b")
MS = (4, 8)
SLOWDOWN = 1.3
SYNTHETIC_WORK = dict(
    durations_us={"F": 1000, "B": 2000, "I": 1000, "W": 1000}, p2p_latency_us=40, small_gemm=1.2, steps=3
)
SYNTHETIC_SOURCES = ((2, "gpipe", 4), (4, "1f1b", 8))  # (p, schedule, m)
SYNTHETIC_TARGETS = ("gpipe", "1f1b", "zb")
ROWS_KEPT = ("schedule", "p", "m", "v", "rows_per_microbatch", "complete")
OWN_M_TARGET = 0.10  # abs(trace-alone / measured step - 1) at the run's own m
COVERAGE_TARGET = 0.8  # at other m, the share of intervals holding the measured median


def bare_copy(run_dir: Path, to: Path, keep: tuple[str, ...] = ()) -> Path:
    """`run_dir`'s rank traces alone at `to` (a foreign trace's layout), with its run.json cut to `keep`."""
    to.mkdir(parents=True)
    for path in trace_files(run_dir):
        shutil.copy(path, to / path.name)
    if keep:
        config = json.loads((run_dir / "run.json").read_text())
        (to / "run.json").write_text(json.dumps({key: value for key, value in config.items() if key in keep}))
    return to


def _advised(run_dir: Path, schedules, ms) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a candidate that cannot be predicted is a warning
        found = advice(run_dir, list(schedules), list(ms), [1], None)
    return {
        "ranked": found.ranked,
        "by": {(c.schedule, c.m): c for c in found.candidates},
        "top": found.candidates[0],
    }


def synthetic(workdir: Path) -> list[dict]:
    """Each synthetic source advised calibrated and from its traces alone, against the generator's step."""
    rows = []
    for shape in ("gpu", "cpu"):
        for p, name, m in SYNTHETIC_SOURCES:
            where = workdir / f"{shape}-{name}-p{p}"
            write_run(where / "cal", build(name, p, m), shape=shape, slowdown=SLOWDOWN, **SYNTHETIC_WORK)
            cases = [(bare_copy(where / "cal", where / "bare"), m)]
            cases.append((bare_copy(where / "cal", where / "rows", ROWS_KEPT), 2 * m))
            calibrated = _advised(where / "cal", SYNTHETIC_TARGETS, (m, 2 * m))["by"]
            for bare, at in cases:
                alone = _advised(bare, SYNTHETIC_TARGETS, (at,))["by"]
                for target in SYNTHETIC_TARGETS:
                    if (target, at) not in alone or (target == name and at == m):
                        continue
                    truth = (
                        write_run(
                            where / f"{target}-m{at}",
                            build(target, p, at),
                            shape=shape,
                            slowdown=SLOWDOWN,
                            **SYNTHETIC_WORK,
                        )
                        .truth[0]
                        .step_ns
                        / 1e6
                    )
                    a, c = alone[(target, at)], calibrated[(target, at)]
                    rows.append(
                        {
                            "shape": shape,
                            "p": p,
                            "source": f"{name} m={m}",
                            "target": f"{target} m={at}",
                            "truth_ms": truth,
                            "calibrated_ms": c.step_time_ms,
                            "alone_ms": a.step_time_ms,
                            "interval_ms": [a.step_time_low_ms, a.step_time_high_ms],
                            "assumptions": a.assumptions,
                        }
                    )
    return rows


def foreign_accuracy(plan: RunPlan, repeats: int, workdir: Path, progress: Callable[[str], None]) -> dict:
    """The synthetic table, then every (schedule, m) run `repeats` times and advised with and without run.json."""
    progress("  synthetic runs")
    found = {
        "synthetic": synthetic(workdir / "synthetic"),
        "repeats": repeats,
        "failed": [],
        "load_average": [],
    }
    launched: dict[tuple[str, int], list[Path]] = {(s, m): [] for s in SCHEDULES for m in MS}
    for repeat in range(1, repeats + 1):
        found["load_average"].append(os.getloadavg()[0])
        for key in launched:
            try:
                launched[key].append(launch(request(plan, key[0], P, key[1]), plan.traces))
            except LaunchError as error:
                found["failed"].append(f"{key} repeat {repeat}: {error}")
        progress(f"  [{repeat}/{repeats}] runs made")
    steps = {
        key: [analyze_pipeline(read_run(run)).summary.step_time_ms for run in runs]
        for key, runs in launched.items()
    }
    measured = {key: statistics.median(times) for key, times in steps.items() if times}
    rows, picks = [], []
    for (name, m), runs in launched.items():
        for run in runs:
            calibrated = _advised(run, SCHEDULES, MS)
            alone = _advised(bare_copy(run, workdir / "bare" / run.name), SCHEDULES, MS)
            picks.append(
                {
                    "source": f"{name} m={m}",
                    "calibrated": [calibrated["top"].schedule, calibrated["top"].m, calibrated["ranked"]],
                    "alone": [alone["top"].schedule, alone["top"].m, alone["ranked"]],
                }
            )
            for key, truth in measured.items():
                a, c = alone["by"][key], calibrated["by"][key]
                rows.append(
                    {
                        "source": f"{name} m={m}",
                        "target": f"{key[0]} m={key[1]}",
                        "own_m": key[1] == m,
                        "same": key == (name, m),
                        "measured_ms": truth,
                        "calibrated_ms": c.step_time_ms,
                        "alone_ms": a.step_time_ms,
                        "interval_ms": [a.step_time_low_ms, a.step_time_high_ms],
                        "assumptions": a.assumptions,
                    }
                )
    return found | {
        "measured_ms": {f"{s} m={m}": times for (s, m), times in steps.items()},
        "runs": rows,
        "picks": picks,
        "targets": {"own_m": OWN_M_TARGET, "coverage": COVERAGE_TARGET},
    }
