"""Kineto Chrome traces (.json, .json.gz, or a legacy bare event array) -> one polars frame per rank.

`read_trace` decodes a file once with typed msgspec structs (analysis.traces.kineto) and keeps what the merge
needs verbatim: every top-level key as `msgspec.Raw` and the whole traceEvents array as one
`msgspec.Raw` (a view of the decompressed bytes, unknown fields included; `RawTrace.events()` decodes
it to dicts, and a frame row's `index` is its event's position there). The array is located without
decoding it first (`_guess_top_level`), so the events are parsed once, not twice. `load_trace` gives
the frame:

    index, rank, ph, name, cat, pid, tid, start_ns, end_ns, correlation, external_id, stream, sequence,
    flow_id, bp

(correlation links a runtime launch to its kernel, external_id a CPU op to its launches, stream is the
kernel's CUDA stream, sequence is autograd's sequence number (a backward op has the one of the forward op
it differentiates), flow_id and bp belong to flow events "s"/"f".)

Times are integer nanoseconds since the epoch: Kineto's `ts` is microseconds relative to the header's
`baseTimeNanoseconds`, so start_ns = base + ts, exact to the nanosecond of the JSON text: ints as they
are, floats through a double only where the double settles the nanosecond, else from the text
(analysis.traces.times), so 5110114341537.881 gives ...537881. end_ns = start_ns + dur for "X" events, start_ns
otherwise. pid/tid that are not integers (Kineto's "Spans"/"Traces" pseudo-processes) are null.

Bad input raises InputError naming the file and the problem. Events with a negative duration are
dropped with a TraceWarning and counted in `RawTrace.dropped` (clock glitches; one such event must not
make a whole run unusable). JSON has no NaN or infinity: such files are refused as not JSON.
"""

from __future__ import annotations

import gzip
import re
import warnings
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from analysis.traces import kineto
from analysis.errors import InputError
from analysis.traces.events import event_frame, json_problem, where

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
# runners.launch writes it before any worker starts: a directory holding it is one of our runs.
RUNNER_LOG = "torchrun.log"
_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')


class TraceWarning(UserWarning):
    """Usable input with something dropped or assumed; the message names the file."""


@dataclass(frozen=True)
class RawTrace:
    path: Path
    rank: int | None
    world_size: int | None
    backend: str | None
    base_ns: int
    header: dict[str, Any]  # the typed top-level keys of kineto.HEADER_TYPES that were present
    metadata: dict[str, msgspec.Raw]  # every top-level key but traceEvents, verbatim
    events_json: msgspec.Raw  # the traceEvents array, verbatim
    frame: pl.DataFrame
    dropped: int  # events dropped for a negative duration

    def events(self) -> list[dict[str, Any]]:
        """Every event as written, unknown fields included (for the merge)."""
        return msgspec.json.decode(self.events_json)


def read_trace(path: str | Path) -> RawTrace:
    path = Path(path)
    data = _read_bytes(path)
    guess = _guess_top_level(data)
    if guess is not None:
        try:
            return _parse(path, *guess)
        except InputError:
            pass  # a wrong guess or a bad file: the full split below decides, and words the error
    return _parse(path, *_split_top_level(path, data))


def _parse(path: Path, metadata: dict[str, msgspec.Raw], events_json: msgspec.Raw) -> RawTrace:
    header = _decode_header(path, metadata)
    info = header.get("distributedInfo") or kineto.DistributedInfo()
    rank = info.rank if info.rank is not None else rank_from_name(path)
    base_ns = header.get("baseTimeNanoseconds", 0)
    frame, dropped = event_frame(path, events_json, base_ns)
    if dropped:
        warnings.warn(f"{path}: dropped {dropped} events with a negative duration", TraceWarning, stacklevel=2)
    frame = frame.with_columns(rank=pl.lit(rank, dtype=pl.Int64))
    return RawTrace(path, rank, info.world_size, info.backend, base_ns, header, metadata, events_json, frame, dropped)


def load_trace(path: str | Path) -> pl.DataFrame:
    return read_trace(path).frame


def rank_from_name(path: Path) -> int | None:
    """rank3.json.gz, worker3_step_12..., rank-34.Jul_15... -> the number; None if the name has none."""
    found = _RANK_IN_NAME.findall(path.name)
    return int(found[-1]) if found else None


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory, not a trace file") from None
    except OSError as error:
        raise InputError(path, f"cannot read: {error.strerror}") from None
    if data[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
        data = _gunzip(path, data)
    if not data.strip():
        raise InputError(path, "empty file")
    return data


def _gunzip(path: Path, data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except EOFError:
        raise InputError(path, "gzip stream truncated (file cut short while being written?)") from None
    except (gzip.BadGzipFile, zlib.error) as error:
        raise InputError(path, f"gzip data corrupted: {error}") from None


def _guess_top_level(data: bytes) -> tuple[dict[str, msgspec.Raw], msgspec.Raw] | None:
    """The top level split without scanning the events: the array is taken to run from the `[` after
    the "traceEvents" key to the file's last `]` (Kineto writes only short keys after it). The header and
    the trailer are checked to be an object around one value, so if the array then decodes, the whole
    file is valid JSON and that array is its traceEvents. None when the guess fails its cheap checks."""
    key = data.find(b'"traceEvents"')
    found = _EVENTS_KEY.match(data, key) if key >= 0 else None
    if found is None:
        return None
    start, end = found.end() - 1, data.rfind(b"]") + 1
    try:
        head = kineto.TOP_LEVEL.decode(data[:start] + b"[]}")
        tail = kineto.TOP_LEVEL.decode(b'{"traceEvents":[]' + data[end:])
    except msgspec.DecodeError:
        return None
    if list(head)[-1:] != ["traceEvents"] or list(tail)[:1] != ["traceEvents"] or "traceEvents" in list(tail)[1:]:
        return None
    del head["traceEvents"], tail["traceEvents"]
    return head | tail, msgspec.Raw(memoryview(data)[start:end])


def _split_top_level(path: Path, data: bytes) -> tuple[dict[str, msgspec.Raw], msgspec.Raw]:
    if data.lstrip()[:1] == b"[":  # legacy format: a bare event array
        return {}, msgspec.Raw(data)
    try:
        top = kineto.TOP_LEVEL.decode(data)
    except msgspec.ValidationError:  # a subclass of DecodeError: test it first
        raise InputError(path, "not a trace: the top level is neither an object nor an event array") from None
    except msgspec.DecodeError as error:
        raise InputError(path, json_problem(error)) from None
    events_json = top.pop("traceEvents", None)
    if events_json is None:
        raise InputError(path, "no traceEvents array (not a Chrome trace?)")
    return top, events_json


def _decode_header(path: Path, metadata: dict[str, msgspec.Raw]) -> dict[str, Any]:
    header = {}
    for key, kind in kineto.HEADER_TYPES.items():
        if key in metadata:
            try:
                header[key] = msgspec.json.decode(metadata[key], type=kind)
            except msgspec.ValidationError as error:  # a subclass of DecodeError: test it first
                raise InputError(path, f"bad {key}: {where(error, key)}") from None
            except msgspec.DecodeError as error:  # e.g. invalid UTF-8, which skipping it as Raw let through
                raise InputError(path, f"bad {key}: {json_problem(error)}") from None
    if not 0 <= header.get("baseTimeNanoseconds", 0) < 4 * 10**18:
        raise InputError(path, f"baseTimeNanoseconds out of range: {header['baseTimeNanoseconds']}")
    return header




@dataclass(frozen=True)
class RunTraces:
    path: Path
    traces: tuple[RawTrace, ...]  # traces[r] is rank r
    config: dict[str, Any] | None  # run.json; None for traces our runners did not write

    @property
    def world_size(self) -> int:
        return len(self.traces)

    def frame(self) -> pl.DataFrame:
        """Every rank's events in one frame (column `rank` tells them apart)."""
        return pl.concat([trace.frame for trace in self.traces], how="vertical")


def load_run(directory: str | Path) -> RunTraces:
    """Every rank trace of a run directory (+ run.json if present), checked to form one whole run."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(directory, "not a directory")
    config = read_run_config(directory / "run.json")
    files = trace_files(directory)
    if not files:
        raise InputError(directory, "no trace files (*.json, *.json.gz) in the run directory")
    traces = [read_trace(path) for path in files]
    if len(traces) == 1 and traces[0].rank is None:  # someone's single-process trace
        traces = [_with_rank(traces[0], 0)]
    _check_same_run(directory, traces)
    by_rank = _one_per_rank(directory, traces)
    if config is not None and config.get("p") not in (None, len(by_rank)):
        raise InputError(directory / "run.json", f"says p={config['p']} but the directory has {len(by_rank)} rank traces")
    return RunTraces(directory, tuple(by_rank), config)


def trace_files(directory: Path) -> list[Path]:
    """Chrome traces directly in `directory`: *.json / *.json.gz except our own run files."""
    skip = {"run.json", "truth.json", "merged.json.gz", "merged.json"}  # truth.json: synthetic.generate
    return sorted(
        path
        for path in directory.iterdir()
        if path.is_file() and path.name.endswith((".json", ".json.gz")) and path.name not in skip
        and not path.name.startswith(".")
    )


def read_run_config(path: Path) -> dict[str, Any] | None:
    """run.json as a dict; None when absent (traces our runners did not write). A run.json without
    `"complete": true`, or none beside the launcher's log, is an interrupted or failed run."""
    if not path.exists():
        if path.with_name(RUNNER_LOG).exists():
            raise InputError(path.parent, f"incomplete run: no run.json beside {RUNNER_LOG} (a rank failed or "
                                          f"the run was interrupted; see {RUNNER_LOG})")
        return None
    try:
        config = msgspec.json.decode(path.read_bytes())
    except (msgspec.DecodeError, OSError) as error:
        raise InputError(path, f"unreadable run.json: {error}") from None
    if not isinstance(config, dict):
        raise InputError(path, "run.json is not a JSON object")
    if config.get("complete") is not True:
        raise InputError(path, 'incomplete run: run.json lacks "complete": true (interrupted or still running)')
    _check_calibration(path, config.get("calibration"))
    return config


def _check_calibration(path: Path, calibration: Any) -> None:
    """Stage index text -> {"F_ms": ms, "B_ms": ms, ...} with every time > 0, or absent: checked here once,
    so the waterfall, the report and the merge's ideal track never meet a malformed one."""
    if calibration is None:
        return
    if not isinstance(calibration, dict):
        raise InputError(path, "bad calibration: not an object of stage -> times")
    for stage, times in calibration.items():
        if not (stage.isascii() and stage.isdecimal()) or not isinstance(times, dict) or not {"F_ms", "B_ms"} <= times.keys():
            raise InputError(path, f"bad calibration: stage {stage!r:.40} needs an integer index and F_ms, B_ms")
        for key, ms in times.items():
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms > 0:
                raise InputError(path, f"bad calibration: stage {stage} {key!r:.40} = {ms!r:.40} is not a time > 0")


def _with_rank(trace: RawTrace, rank: int) -> RawTrace:
    return replace(trace, rank=rank, frame=trace.frame.with_columns(rank=pl.lit(rank, dtype=pl.Int64)))


def _one_per_rank(directory: Path, traces: list[RawTrace]) -> list[RawTrace]:
    by_rank: dict[int, RawTrace] = {}
    for trace in traces:
        if trace.rank is None:
            raise InputError(trace.path, "cannot tell the rank: no distributedInfo.rank and no rank number in the name")
        if trace.rank in by_rank:
            raise InputError(directory, f"two files claim rank {trace.rank}: {by_rank[trace.rank].path.name}, {trace.path.name}")
        by_rank[trace.rank] = trace
    sizes = {trace.world_size for trace in traces} - {None}
    expected = max([len(traces), *sizes])
    missing = sorted(set(range(expected)) - set(by_rank))
    if missing:
        raise InputError(directory, f"missing rank(s) {_listed(missing)} (found {_listed(sorted(by_rank))})")
    return [by_rank[rank] for rank in range(expected)]


def _check_same_run(directory: Path, traces: list[RawTrace]) -> None:
    """Ranks of one job agree on world size and on our run id (Kineto's trace_id is per process)."""
    for label, values in (
        ("world sizes", {t.rank: t.world_size for t in traces if t.world_size is not None}),
        ("run ids", {t.rank: t.header["run_id"] for t in traces if "run_id" in t.header}),
    ):
        if len(set(values.values())) > 1:
            shown = ", ".join(f"rank{rank}: {value}" for rank, value in values.items())
            raise InputError(directory, f"ranks from different runs: {label} differ ({shown})")


def _listed(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8" (a 300-rank job must still give one readable line)."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
