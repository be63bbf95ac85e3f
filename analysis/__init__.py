"""Analyse pipeline-parallel Chrome traces: cells, idle-time classes, the deviation from the formula.

In a notebook:

    from analysis import analyze
    run = analyze("traces/latest")      # RUN/analysis/ as `analyze` wrote it, else analysed now
    run.summary.step_time_ms, run.summary.bubble_measured, run.summary.waterfall_ms
    run.cells, run.gaps, run.parts      # polars frames; .to_pandas() for pandas
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.results import Analysis


def analyze(run_dir: str | Path, schedule: str | None = None, m: int | None = None) -> Analysis:
    """One run directory's analysis (analysis.results.Analysis: summary, schedule, cells, gaps, parts,
    ideal, model, memory). With `schedule` and `m` (for traces without run.json) it is analysed anew;
    otherwise a current RUN/analysis/ is read. Bad input raises analysis.errors.InputError."""
    # imported here: `python -m analysis` and `import analysis` load this module, and the pipeline's
    # imports (polars, msgspec) are most of a command's start-up
    from analysis.job.run_dir import analysis_of, analyze_dir

    if schedule is None and m is None:
        return analysis_of(Path(run_dir))
    return analyze_dir(Path(run_dir), schedule=schedule, m=m)
