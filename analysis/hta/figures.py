"""RUN/hta.json: Holistic Trace Analysis's figures of a run's ranks as `python -m analysis hta` keeps
them (`write`, `read`), so the report shows them without running HTA."""

from __future__ import annotations

from pathlib import Path

import msgspec

from analysis.errors import InputError, printable
from analysis.files import write_atomically
from analysis.traces import limits
from analysis.traces.run_files import HTA_FILE
from analysis.traces.source import read_text
from analysis.traces.toplevel import NESTED_TOO_DEEPLY
from analysis.vocabulary import DeviceIdle

TOP_KERNELS = 5
IDLE_CATEGORIES = tuple(DeviceIdle)  # HTA's, as get_idle_time_breakdown names them
KERNEL_NAME_CHARS = 80  # kernel names are C++ signatures of hundreds of characters


class StreamIdle(msgspec.Struct):
    """HTA's idle-time breakdown of one stream: the gaps between its consecutive kernels, ms."""

    stream: int
    host_wait_ms: float
    kernel_wait_ms: float
    other_ms: float

    @property
    def total_ms(self) -> float:
        return self.host_wait_ms + self.kernel_wait_ms + self.other_ms


class Kernel(msgspec.Struct):
    name: str
    kernel_type: str  # HTA's: COMPUTATION, COMMUNICATION, MEMORY
    total_ms: float


class HtaRank(msgspec.Struct):
    """One rank as HTA sees it. span: first to last kernel on any stream; idle: no kernel on any stream;
    compute: HTA's compute kernels (all but NCCL and memory) running; non-compute: the rest of the span."""

    rank: int
    rounding_ms: float  # the most HTA's rounding of this trace's kernel times can move its busy or idle
    compute_stream: int | None  # the stream that ran the most non-NCCL kernel time (ours to pick)
    span_ms: float
    idle_ms: float
    compute_ms: float
    non_compute_ms: float
    overlap_pct: float | None  # share of communication kernel time overlapped by compute; None: no comm
    streams: list[StreamIdle]
    top_kernels: list[Kernel]

    def percent(self, ms: float) -> float:
        return 100 * ms / self.span_ms if self.span_ms else 0.0

    @property
    def compute_stream_idle(self) -> StreamIdle | None:
        return next((s for s in self.streams if s.stream == self.compute_stream), None)


class HtaFigures(msgspec.Struct):
    hta_version: str
    ranks: list[HtaRank]
    ranks_without_kernels: list[int]  # left out: HTA's breakdowns need kernels


def short_name(name: str) -> str:
    """A kernel's name from the trace as one short line (control characters escaped)."""
    name = printable(name)
    return name if len(name) <= KERNEL_NAME_CHARS else name[: KERNEL_NAME_CHARS - 1] + "…"


def write(run_dir: Path, figures: HtaFigures) -> Path:
    target = Path(run_dir) / HTA_FILE
    write_atomically(target, msgspec.json.format(msgspec.json.encode(figures)) + b"\n")
    return target


def read(run_dir: Path) -> HtaFigures | None:
    """RUN/hta.json; None where `python -m analysis hta` has not written one, InputError where unreadable."""
    path = Path(run_dir) / HTA_FILE
    if not path.is_file():
        return None
    try:  # bounded as run.json is: the report reads whatever lies in a run directory
        return msgspec.json.decode(read_text(path, limits.RUN_JSON_BYTES).data, type=HtaFigures)
    except RecursionError:
        raise InputError(path, f"not readable JSON ({NESTED_TOO_DEEPLY})") from None
    except msgspec.DecodeError as error:
        raise InputError(path, f"not readable: {error}; python -m analysis hta writes it again") from None
