"""A run's analysis/ directory: its one writer (`write`, called by `analyze`) and its one reader (`read`,
for the merge, the report and the benchmarks), so every page and track shows what summary.json holds.

    summary.json          Summary (analysis.schema), the median step's figures (a job of several
                          pipelines: its slowest pipeline's, with every rank and pipeline; analysis.job.join)
    schedule.json         the executed schedule: name, p, m, v, placement and each rank's order of actions
    cells.parquet         rank, step, stage, kind, microbatch, start_ns, end_ns, blocked_ns, inferred,
                          busy_ns, compute_ns, small_gemm_ns, slowdown_ns, cpu_contention_ns
                          (analysis.attribution.parts)
    gaps.parquet          rank, step, start_ns, end_ns, class (analysis.schema.GAP_CLASSES)
    ranks.parquet         every analysed step's parts per rank, in ms
    ideal.parquet         the ideal timeline (analysis.attribution.waterfall): rank, step, stage, kind,
                          microbatch, start_ns, end_ns from the median step's origin
    model.json            the typical step (analysis.attribution.model): per (stage, kind) its mean
                          inputs, per rank its mean tail, the executed lowered orders; the waterfall
                          and `predict` replay it
    critical.parquet      each analysed step's critical path (analysis.attribution.critical): step,
                          rank, start_ns, end_ns, part, stage, kind, microbatch
    replay_inputs.parquet, replay_tails.parquet
                          every analysed step's own inputs (analysis.attribution.own_step), which
                          `predict` resamples for its intervals
    memory.parquet, memory_peaks.parquet
                          where the traces carry memory events (analysis.traces.memory)
    predictions.json      the step at every m runs calibrate, where the run can predict without assuming
                          (analysis.attribution.predict.standard_predictions): the verdict's best m, the
                          sweep page's curve
    format.json           {"format": ANALYSIS_FORMAT}: which layout of these files this is

Times in the tables are on the analysis's clock: each rank's own plus its offset in `summary.clock`;
ranks are global. An analysis of another format (a stored table's columns changed; or no stamp, written
before it) is not read: `read` says so, and the report and the merge analyse the run again. A summary
written before the PP x DP keys (dp, pipelines, straggler, a rank's pipeline, dp_sync_ms, dp_skew_ms)
reads with their one-pipeline defaults.
The directory is written into a fresh temporary sibling and renamed into place, so a crash or a full
disk leaves the previous analysis whole; `analyze` replaces it entirely, so nothing else keeps files
there.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from dataclasses import astuple, dataclass
from pathlib import Path

import msgspec
import polars as pl

from analysis.attribution.model import StepModel
from analysis.attribution.own_step import OwnSteps
from analysis.attribution.replay import Inputs, Tail
from analysis.errors import InputError
from analysis.files import SHARED_DIRECTORY, OutputError, unwritable, write_atomically
from analysis.schema import Advice, Prediction, RanksSummary, Scope, Summary
from analysis.traces.memory import Memory
from analysis.traces.run_files import ADVICE_FILE, PREDICT_FILE
from runners.schedules import Action, Schedule

ANALYSIS_DIR = "analysis"
# The layout and meaning of what `write` stores. Bump it with any change to a stored table's columns (a
# test pins them) or to what a stored figure means, so an analysis written before the change is analysed
# again rather than read wrong. 3: a receive that is only posted waits in its consumer, in the parts too.
# 4: summary.json's trust and verdict (analysis.trust.gate, analysis.verdict).
# 5: the waterfall's terms and the typical step renamed (tests/test_renames.py maps the old names).
# 6: predictions.json (the step at every m runs calibrate); ideal.parquet's in_flight.
ANALYSIS_FORMAT = 6
FORMAT_FILE = "format.json"
PREDICTIONS_FILE = "predictions.json"  # Analysis.predictions


@dataclass(frozen=True)
class Analysis:
    """Everything `analyze` finds for one run; what `read` gives back."""

    summary: Summary
    schedule: Schedule  # as executed: the replay, the in-flight count and the ideal timeline follow it
    cells: pl.DataFrame
    gaps: pl.DataFrame
    parts: pl.DataFrame  # every analysed step's parts per rank, ms (ranks.parquet)
    ideal: pl.DataFrame
    model: StepModel
    critical: pl.DataFrame  # each analysed step's critical path (analysis.attribution.critical)
    own: OwnSteps  # every analysed step's own replay inputs
    memory: Memory | None = None  # None: the traces have no memory events
    # the step at every m runs calibrate (analysis.attribution.predict.standard_predictions); None: the
    # run cannot predict (no isolated calibration), or an analysis read without them
    predictions: list[Prediction] | None = None


@dataclass(frozen=True)
class RanksAnalysis:
    """What `analyze` finds of some ranks of a bigger job (analysis.job.partial)."""

    summary: RanksSummary
    cells: pl.DataFrame
    gaps: pl.DataFrame


class _ScheduleFile(msgspec.Struct):
    name: str
    p: int
    m: int
    v: int
    placement: str
    orders: list[list[str]]  # per rank, its actions in execution order, in the compact form "0F3"
    stage_ranks: list[int] = []  # the custom placement's rank of each stage


class _ModelFile(msgspec.Struct):
    # stage, kind, and its mean lead, pre, work, transfer, post (ns)
    kinds: list[tuple[int, str, float, float, float, float, float]]
    # per rank, replay.Tail's fields: dp_sync, other, launch_overhead, barrier, opened (older files hold fewer: 0)
    tails_ns: list[tuple[float, ...]]
    orders: list[list[str]]  # per rank, its lowered actions as the median step ran them
    blocking_sends: bool
    eager_receives: bool
    posted_receives: bool = False  # (older files: none)


def _model_json(model: StepModel) -> bytes:
    kinds = [
        (stage, kind, i.lead, i.pre, i.work, i.transfer, i.post) for (stage, kind), i in model.kinds.items()
    ]
    tails = [astuple(t) for t in model.tails]
    orders = [[str(action) for action in order] for order in model.orders]
    document = _ModelFile(
        sorted(kinds), tails, orders, model.blocking_sends, model.eager_receives, model.posted_receives
    )
    return msgspec.json.format(msgspec.json.encode(document)) + b"\n"


def _model(path: Path) -> StepModel:
    found = _decode(path, _ModelFile)
    try:
        orders = tuple(tuple(Action.parse(text) for text in order) for order in found.orders)
    except ValueError as error:
        raise InputError(path, f"not a step model: {error}") from None
    return StepModel(
        {(stage, kind): Inputs(*values) for stage, kind, *values in found.kinds},
        tuple(Tail(*values) for values in found.tails_ns),
        orders,
        found.blocking_sends,
        found.eager_receives,
        found.posted_receives,
    )


def _schedule_json(schedule: Schedule) -> bytes:
    orders = [[str(action) for action in order] for order in schedule.orders]
    document = _ScheduleFile(
        schedule.name,
        schedule.p,
        schedule.m,
        schedule.v,
        schedule.placement,
        orders,
        list(schedule.stage_ranks),
    )
    return msgspec.json.format(msgspec.json.encode(document)) + b"\n"


def _files(analysis: Analysis | RanksAnalysis) -> dict[str, bytes | pl.DataFrame]:
    """File name -> its bytes or table, for `write`."""
    files: dict[str, bytes | pl.DataFrame] = {
        "summary.json": msgspec.json.format(msgspec.json.encode(analysis.summary)) + b"\n",
        FORMAT_FILE: msgspec.json.encode({"format": ANALYSIS_FORMAT}) + b"\n",
        "cells.parquet": analysis.cells,
        "gaps.parquet": analysis.gaps,
    }
    if isinstance(analysis, RanksAnalysis):
        return files
    files |= {
        "schedule.json": _schedule_json(analysis.schedule),
        "model.json": _model_json(analysis.model),
        "ranks.parquet": analysis.parts,
        "ideal.parquet": analysis.ideal,
        "critical.parquet": analysis.critical,
        "replay_inputs.parquet": analysis.own.actions,
        "replay_tails.parquet": analysis.own.tails,
    }
    if analysis.memory is not None and not analysis.memory.peaks.is_empty():
        files |= {"memory.parquet": analysis.memory.stash, "memory_peaks.parquet": analysis.memory.peaks}
    if analysis.predictions is not None:
        files[PREDICTIONS_FILE] = msgspec.json.format(msgspec.json.encode(analysis.predictions)) + b"\n"
    return files


def _swap_in(staging: Path, target: Path) -> None:
    """`staging` renamed to `target`, the analysis there first moved aside and deleted. Writers of one
    run's analysis at once (a report and a merge) each retry where another moved it first."""
    while True:
        try:
            os.replace(staging, target)  # where no analysis is there (or an empty directory)
            return
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        old = Path(tempfile.mkdtemp(prefix=f".{ANALYSIS_DIR}.old.", dir=target.parent))
        try:
            os.replace(target, old)
        except FileNotFoundError:
            continue  # another writer moved it aside first: the rename above may now succeed
        finally:
            shutil.rmtree(old, ignore_errors=True)


def write(run_dir: Path, analysis: Analysis | RanksAnalysis) -> Path:
    """RUN/analysis/, replaced as a whole; returns its path. A place that cannot be written is one
    OutputError line (the previous analysis whole, no staging directory left); an `analysis` that is
    not a directory this writes (a file, a link) is left as it is and refused."""
    target = Path(run_dir) / ANALYSIS_DIR
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise OutputError(
            target, "is not the analysis directory analyze writes (a file or a link); left as it is"
        )
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{ANALYSIS_DIR}.", dir=target.parent))
    except OSError as error:
        raise unwritable(target, error) from None
    try:
        os.chmod(staging, SHARED_DIRECTORY)
        for name, content in _files(analysis).items():
            if isinstance(content, pl.DataFrame):
                content.write_parquet(staging / name)
            else:
                (staging / name).write_bytes(content)
        _swap_in(staging, target)
    except (OSError, pl.exceptions.PolarsError) as error:  # polars says ComputeError for a full disk
        raise unwritable(target, error) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def exists(run_dir: Path) -> bool:
    return (Path(run_dir) / ANALYSIS_DIR / "summary.json").is_file()


def _decode(path: Path, kind: type):
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except FileNotFoundError:
        raise InputError(path, "missing") from None
    except (OSError, msgspec.DecodeError) as error:  # ValidationError is a DecodeError: an older analysis
        raise InputError(path, f"not this version's analysis ({error})") from None


class _FormatFile(msgspec.Struct):
    format: int


def _check_format(path: Path) -> None:
    """InputError unless the analysis at `path`'s folder is of this version's ANALYSIS_FORMAT."""
    if not path.is_file():
        raise InputError(path, "not this version's analysis (no format stamp: written by an older version)")
    found = _decode(path, _FormatFile).format
    if found != ANALYSIS_FORMAT:
        raise InputError(
            path, f"not this version's analysis (format {found}; this version reads {ANALYSIS_FORMAT})"
        )


def _table(path: Path, required: bool = True) -> pl.DataFrame | None:
    if not path.is_file():
        if required:
            raise InputError(path, "missing")
        return None
    try:
        return pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as error:
        raise InputError(path, f"not a readable table ({type(error).__name__})") from None


def _schedule(path: Path) -> Schedule:
    found = _decode(path, _ScheduleFile)
    try:
        orders = tuple(tuple(Action.parse(text) for text in order) for order in found.orders)
        return Schedule(
            found.name,
            found.p,
            found.m,
            found.v,
            orders,
            placement=found.placement,
            stage_ranks=tuple(found.stage_ranks),
        )
    except ValueError as error:  # ActionParseError, ScheduleError
        raise InputError(path, f"not a schedule: {error}") from None


def read_stored(run_dir: Path) -> Analysis | RanksAnalysis:
    """RUN/analysis/ as `analyze` wrote it, of a whole job or of some of its ranks."""
    directory = Path(run_dir) / ANALYSIS_DIR
    _check_format(directory / FORMAT_FILE)
    if _decode(directory / "summary.json", Scope).scope != "ranks":
        return _whole(directory)
    return RanksAnalysis(
        _decode(directory / "summary.json", RanksSummary),
        _table(directory / "cells.parquet"),
        _table(directory / "gaps.parquet"),
    )


def read(run_dir: Path) -> Analysis:
    """RUN/analysis/ of a whole job as `analyze` wrote it; InputError naming the file that is missing or
    unreadable, or saying that it holds some ranks of a job only (read_stored reads that)."""
    found = read_stored(run_dir)
    if isinstance(found, RanksAnalysis):
        raise InputError(
            run_dir, "holds some of the job's ranks only: each one's own figures, nothing across ranks"
        )
    return found


def _whole(directory: Path) -> Analysis:
    stash, peaks = (
        _table(directory / "memory.parquet", False),
        _table(directory / "memory_peaks.parquet", False),
    )
    return Analysis(
        summary=_decode(directory / "summary.json", Summary),
        schedule=_schedule(directory / "schedule.json"),
        cells=_table(directory / "cells.parquet"),
        gaps=_table(directory / "gaps.parquet"),
        parts=_table(directory / "ranks.parquet"),
        ideal=_table(directory / "ideal.parquet"),
        model=(model := _model(directory / "model.json")),
        critical=_table(directory / "critical.parquet"),
        own=OwnSteps(
            _table(directory / "replay_inputs.parquet"),
            _table(directory / "replay_tails.parquet"),
            model.blocking_sends,
            model.eager_receives,
            model.posted_receives,
        ),
        memory=None if stash is None or peaks is None else Memory(stash, peaks),
        predictions=_predictions(directory / PREDICTIONS_FILE),
    )


def _predictions(path: Path) -> list[Prediction] | None:
    return _decode(path, list[Prediction]) if path.is_file() else None


def write_predictions(run_dir: Path, found: list[Prediction]) -> Path:
    """RUN/predict.json (`predict`'s), written whole or not at all."""
    target = Path(run_dir) / PREDICT_FILE
    write_atomically(target, msgspec.json.format(msgspec.json.encode(found)) + b"\n")
    return target


def write_advice(run_dir: Path, found: Advice) -> Path:
    """RUN/advice.json (`advise`'s), written whole or not at all."""
    target = Path(run_dir) / ADVICE_FILE
    write_atomically(target, msgspec.json.format(msgspec.json.encode(found)) + b"\n")
    return target


def read_advice(run_dir: Path) -> Advice | None:
    """RUN/advice.json as write_advice wrote it; None where there is none, InputError where it cannot be
    read."""
    path = Path(run_dir) / ADVICE_FILE
    if not path.is_file():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=Advice)
    except (msgspec.DecodeError, msgspec.ValidationError, OSError) as error:
        raise InputError(path, f"not readable advice ({str(error).splitlines()[0]})") from None
