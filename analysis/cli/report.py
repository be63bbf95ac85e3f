"""`python -m analysis report`: reports/index.html, a page per run (analysis.report) and a page per
compared pair of runs.

The report draws diffs, it does not make them: here, before it is built, each sweep's neighbours
(analysis.diff.neighbours) are compared and every diff already stored under traces/ (`make diff`) is
made again where either run was analysed since, each kept in its B's run directory
(analysis.diff.stored). A diff still current is left as it is: a report after every run stays quick.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from analysis.diff import output
from analysis.diff.compare import diff
from analysis.diff.neighbours import sweep_neighbours
from analysis.diff.stored import diff_path, read_diff, stored_diffs, write_diff
from analysis.errors import InputError, TraceWarning
from analysis.report import build_report
from analysis.report.runs import Run, load_run, run_directories
from analysis.report.site import Site
from analysis.results import ANALYSIS_DIR, Analysis


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", type=Path, default=Path("traces"), help="folder of run directories")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="where index.html goes")


def _pairs(whole: dict[str, Run]) -> set[tuple[str, str]]:
    """The sweeps' neighbours and the pairs a diff was stored for, where both runs are in the report."""
    asked = {(path.stem, run_id) for run_id, run in whole.items() for path in stored_diffs(run.path)}
    neighbours = sweep_neighbours([(run_id, run.summary) for run_id, run in whole.items()])
    return {(a, b) for a, b in asked | set(neighbours) if a in whole and b in whole}


def _current(a: Run, b: Run) -> bool:
    """A's diff is kept in B, readable, and made since both runs' analyses were written."""
    kept = diff_path(b.path, a.run_id)
    try:
        read_diff(kept)
        made = kept.stat().st_mtime_ns
        return all(made >= (run.path / ANALYSIS_DIR / "summary.json").stat().st_mtime_ns for run in (a, b))
    except (InputError, OSError):
        return False


def store_diffs(runs: list[Run]) -> None:
    """Compare each pair (_pairs) and store it in B's run directory; a pair that cannot be compared or
    stored is a warning, and the report goes on without its page."""
    whole = {run.run_id: run for run in runs if run.error is None and isinstance(run.analysis, Analysis)}
    for a, b in sorted(_pairs(whole)):
        first, second = whole[a], whole[b]
        if _current(first, second):
            continue
        try:
            found = diff(first.analysis, second.analysis)
            write_diff(second.path, output.stored(found, first.path, second.path))
        except InputError as error:  # an output error too: the run directory is read-only
            warnings.warn(f"{a} against {b}: no diff page ({error})", TraceWarning, stacklevel=2)
        except Exception as error:  # one pair must not stop the report, as one bad run does not
            message = str(error).splitlines()[0] if str(error) else ""
            warnings.warn(
                f"{a} against {b}: no diff page ({type(error).__name__}: {message})",
                TraceWarning,
                stacklevel=2,
            )


def run(args: argparse.Namespace) -> int:
    Site(args.out)  # an --out the report may not write is refused before any run is read or compared
    runs = [load_run(path) for path in run_directories(args.traces)]
    store_diffs(runs)
    print(build_report(args.traces, args.out, runs))
    return 0
