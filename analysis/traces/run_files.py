"""Which files of a directory are a run's rank traces, and which directory is a run.

Names and listings alone, nothing decoded (analysis.traces.load reads what these name), so a caller
can list a run's traces without the loader's imports.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from analysis.errors import TraceWarning
from runners.rundir import RUNNER_LOG

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
# JSON files of a run directory that are not rank traces: ours and the synthetic generator's.
HTA_FILE = "hta.json"  # Holistic Trace Analysis's figures (analysis.hta.figures)
PREDICT_FILE = "predict.json"  # the step predicted at other m (python -m analysis predict)
ADVICE_FILE = "advice.json"  # the schedules, m and v advised (python -m analysis advise)
WHATIF_FILE = "whatif.json"  # the straggler what-if figures of an op-level run (python -m analysis whatif)
RUN_FILES = frozenset(
    {
        "run.json",
        "truth.json",
        "merged.json.gz",
        "merged.json",
        HTA_FILE,
        PREDICT_FILE,
        ADVICE_FILE,
        WHATIF_FILE,
    }
)


def rank_from_name(path: Path) -> int | None:
    """rank3.json.gz, worker3_step_12..., rank-34.Jul_15... -> the number; None if the name has none."""
    found = _RANK_IN_NAME.findall(Path(path).name)
    if not found:
        return None
    digits = found[-1].lstrip("0") or "0"
    return int(digits[:1000])  # (int() refuses 4300 digits; a thousand are past any limit already)


def looks_like_trace(name: str) -> bool:
    """Named like a rank trace: a rank number (rank3.json.gz, worker3_step_12.pt.trace.json) or "trace" in
    the name (torch.profiler's TensorBoard handler: HOST_PID.MILLIS.pt.trace.json.gz; torchtitan:
    rank0_trace.json). Such a file that cannot be read is an error; another JSON file may be no trace."""
    return rank_from_name(Path(name)) is not None or "trace" in name.lower()


def oplevel_files(directory: Path) -> tuple[Path, Path] | None:
    """The first `trace-<name>.parquet` with its `meta-<name>.yaml` in `directory` (an op-level timeline,
    analysis.traces.oplevel), or None."""
    for parquet in sorted(Path(directory).glob("trace-*.parquet")):
        meta = parquet.with_name(f"meta-{parquet.name[len('trace-') : -len('.parquet')]}.yaml")
        if meta.is_file():
            return parquet, meta
    return None


def is_run_directory(path: Path) -> bool:
    """A directory holding run.json, our launcher's log (a run that failed or was interrupted before
    run.json: reading it says so), an op-level timeline (oplevel_files) or a file named like a rank
    trace (looks_like_trace: rank0.json.gz, torchtitan's rank0_trace.json, the TensorBoard handler's
    HOST_PID.MILLIS.pt.trace.json.gz); a symbolic link (our `latest`) is not a run of its own."""
    if not path.is_dir() or path.is_symlink():
        return False
    try:
        ours = (path / "run.json").is_file() or (path / RUNNER_LOG).is_file()
        return (
            ours
            or oplevel_files(path) is not None
            or any(looks_like_trace(file.name) for file in trace_files(path))
        )
    except OSError:  # unreadable: a run whose reading will say why
        return True


def run_in(path: Path) -> Path:
    """`path` when it is a run directory; else, for a folder of runs (torchtitan's profile_trace/ with an
    iteration_N folder per profiled iteration, or our traces/), its latest run, said in a warning: the
    highest iteration number, else the newest."""
    path = Path(path)
    if not path.is_dir() or is_run_directory(path):
        return path
    runs = [child for child in path.iterdir() if is_run_directory(child)]
    if not runs:
        return path  # the loader says what is missing

    def latest(child: Path) -> tuple[int, int]:
        number = re.fullmatch(r"iteration_(\d+)", child.name)
        return (int(number.group(1)) if number else -1, child.stat().st_mtime_ns)

    chosen = max(runs, key=latest)
    warnings.warn(
        f"{path}: a folder of {len(runs)} runs; analysing the latest, {chosen.name}",
        TraceWarning,
        stacklevel=2,
    )
    return chosen


def trace_files(directory: Path) -> list[Path]:
    """JSON files directly in `directory` that may be Chrome traces: *.json / *.json.gz except our own
    run files (which are rank traces is settled by reading them: load_run)."""
    return sorted(
        path
        for path in directory.iterdir()
        if path.name.endswith((".json", ".json.gz"))
        and path.name not in RUN_FILES
        and not path.name.startswith(".")
        and path.is_file()
    )
