"""A run directory in, its analysis out: the I/O at the edges of the job's analysis.

`read_run` reads a run's traces into each rank's tables (in a pool of processes), `analyze_dir` analyses
the job (analysis.job.join), adds an op-level run's what-if figures and writes RUN/analysis/
(analysis.results), `analysis_of` reads it back where it is current.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from analysis import results
from analysis.cells.virtual_ranks import virtual_ranks
from analysis.errors import InputError, TraceWarning
from analysis.job.join import analyze_job
from analysis.job.measure import RunInput
from analysis.job.partial import measure_ranks
from analysis.ranks.pool import read_ranks
from analysis.ranks.tables import rank_input
from analysis.results import Analysis, RanksAnalysis
from analysis.traces.run import RunTraces
from analysis.traces.run_files import run_in
from analysis.trust.gate import pipeline_evidence
from analysis.whatif.figures import with_whatif


def read_run(path: Path) -> RunInput:
    """The traces of a run directory and its run.json (analysis.traces.run.load_run checks they form a
    run: every rank of its job, or some), each rank read into its tables alone, in a pool of processes
    (analysis.ranks.pool)."""
    run, ranks = read_ranks(path)
    return RunInput(run.path, ranks, run.config, world_size=run.world_size)


def run_input(run: RunTraces) -> RunInput:
    """The same from traces loaded already (the merge's); one process's trace of P ranks on one GPU is
    read as P ranks (analysis.cells.virtual_ranks)."""
    run = virtual_ranks(run.require_complete())
    alone = len(run.traces) == 1
    ranks = {t.rank: rank_input(t, config=run.config, alone=alone) for t in run.traces}
    return RunInput(run.path, ranks, run.config)


def analyze_dir(run_dir: Path, schedule: str | None = None, m: int | None = None) -> Analysis | RanksAnalysis:
    """Analyse one run directory and write its analysis/ beside the traces (the `analyze` command's work):
    a whole job's, or where the traces hold some of its ranks, each present rank's own figures
    (analysis.job.partial) once they show a pipeline (analysis.trust.gate)."""
    run_dir = run_in(Path(run_dir)).resolve()
    run = read_run(run_dir)
    if run.partial:
        pipeline_evidence(run.path, {rank: one.census for rank, one in run.ranks.items()}, run.world_size)
        found = measure_ranks(run, run.world_size)
    else:
        found = analyze_job(run, schedule=schedule, m=m)
        found = dataclasses.replace(found, summary=with_whatif(found.summary, run_dir))
    results.write(run_dir, found)
    return found


def stored_of(run_dir: Path) -> Analysis | RanksAnalysis:
    """RUN/analysis/ as `analyze` wrote it, of a whole job or of some of its ranks; where it is missing,
    unreadable or from another version of the analysis, the run is analysed (and its analysis/ written)
    first, the last two with a warning. A folder of runs stands for its latest
    (analysis.traces.run_files.run_in)."""
    run_dir = run_in(Path(run_dir))
    if not results.exists(run_dir):
        return analyze_dir(run_dir)
    try:
        return results.read_stored(run_dir)
    except InputError as error:
        warnings.warn(f"{error}; analysed again", TraceWarning, stacklevel=2)
        return analyze_dir(run_dir)


def analysis_of(run_dir: Path) -> Analysis:
    """stored_of's analysis of a whole job; InputError where the traces hold some of its ranks only (the
    commands that replay the pipeline need every rank)."""
    found = stored_of(run_dir)
    if isinstance(found, RanksAnalysis):
        present = found.summary.ranks_present
        raise InputError(
            run_in(Path(run_dir)),
            f"needs every rank of the job: the traces hold {len(present)} of its {found.summary.world_size}",
        )
    return found
