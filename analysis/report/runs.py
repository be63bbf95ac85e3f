"""The report's input: every run directory under traces/, with its analysis (made here if missing).

A run that cannot be read or analysed becomes a Run with `error` set: the index lists it with the
message and the rest of the report is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from analysis.errors import InputError, NotAPipeline
from analysis.job.run_dir import stored_of
from analysis.results import Analysis, RanksAnalysis
from analysis.schema import RanksSummary, Summary
from analysis.traces import limits
from analysis.traces.run_files import is_run_directory
from analysis.traces.source import read_text
from analysis.traces.toplevel import NESTED_TOO_DEEPLY


@dataclass(frozen=True)
class Run:
    run_id: str
    path: Path
    config: dict  # run.json, or {} where the run has none (traces written by someone else)
    # what `analyze` wrote (analysis.results): a whole job's, or some of its ranks'; None with `error`
    analysis: Analysis | RanksAnalysis | None = None
    error: str | None = None
    not_a_pipeline: bool = False  # `error` says what the job is instead (analysis.trust.gate)

    @property
    def summary(self) -> Summary | RanksSummary:
        return self.analysis.summary

    @property
    def merged_trace(self) -> Path | None:
        merged = self.path / "merged.json.gz"
        return merged if merged.is_file() else None


def run_directories(traces: Path) -> list[Path]:
    """Run directories newest first: by when run.json (else the directory) was written, then by name. A
    link to a run directory (runs gathered from elsewhere) is one, unless it points at a run listed
    already (`latest`)."""
    if not traces.is_dir():
        raise InputError(traces, "no such traces directory")
    found: dict[Path, Path] = {}  # where each run is -> its entry in `traces`
    for path in sorted(traces.iterdir(), key=Path.is_symlink):  # a run's own directory before links to it
        try:
            where = path.resolve(strict=True)
        except (OSError, RuntimeError):  # a dangling link, a loop
            continue
        if where not in found and is_run_directory(where):
            found[where] = path
    runs = list(found.values())

    def written(path: Path) -> tuple[int, str]:
        stamp = path / "run.json" if (path / "run.json").is_file() else path
        return stamp.stat().st_mtime_ns, path.name

    return sorted(runs, key=written, reverse=True)


def _read_json(path: Path) -> dict:
    """run.json as a dict, read as the loader reads it: a bounded size (a huge or sparse file is refused
    unread), invalid UTF-8 replaced, nesting past the decoder's limit an InputError."""
    try:
        data = msgspec.json.decode(read_text(path, limits.RUN_JSON_BYTES).data)
    except RecursionError:
        raise InputError(path, f"not readable JSON ({NESTED_TOO_DEEPLY})") from None
    except msgspec.DecodeError as error:
        raise InputError(path, f"not readable JSON ({error})") from None
    if not isinstance(data, dict):
        raise InputError(path, "expected a JSON object")
    return data


def load_run(path: Path) -> Run:
    """Read one run's config and analysis, analysing it first if needed; any failure -> error row."""
    config: dict = {}
    try:
        if (path / "run.json").is_file():
            config = _read_json(path / "run.json")
        return Run(path.name, path, config, stored_of(path))
    except NotAPipeline as error:
        return Run(path.name, path, config, error=error.problem, not_a_pipeline=True)
    except InputError as error:
        return Run(path.name, path, config, error=str(error))
    except Exception as error:  # one bad run must not stop the report; the index shows why
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        return Run(path.name, path, config, error=f"{type(error).__name__}: {message}")
