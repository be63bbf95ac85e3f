"""What a rank's trace shows of communication: the evidence that decides whether a job is a pipeline.

A pipeline passes activations and gradients between ranks point to point. Per rank this counts, over
its profiled steps:

- p2p calls: torch's `c10d::send` / `c10d::recv_` (and `recv_any_source_`) or the backend's spans of
  them (`nccl:send`, `nccl:recv`, `gloo:send`, `gloo:recv`), whichever level recorded more;
- p2p kernels: NCCL or RCCL Send, Recv and SendRecv kernels, but not on a rank that runs all_to_all:
  NCCL implements all_to_all with the same SendRecv kernels (DLRM's embedding exchange);
- pipeline labels: `PP:` actions (or a framework's phase labels) the rank's cells were read from;
- collectives by kind (all_reduce, all_to_all, ...), per kind the level that recorded more, so that a
  job that is not a pipeline can be told what it is instead.

`analysis.trust.gate.pipeline_evidence` reads these over the job's ranks.
"""

from __future__ import annotations

import re

import msgspec
import polars as pl

from analysis.cells.labelled import RankCells
from analysis.traces.spans import rows

P2P_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
P2P_SPANS = ("nccl:send", "nccl:recv", "gloo:send", "gloo:recv")
P2P_KERNEL = r"(?i)^(nccl|rccl).*(send|recv)"
# A collective's kind from its op name, tried in order (reduce_scatter before reduce, all_gather
# before gather); the c10d op names drop the underscores (allreduce_, _allgather_base_).
_KINDS = (
    ("all_to_all", r"all_?to_?all"),
    ("all_reduce", r"all_?reduce"),
    ("reduce_scatter", r"reduce_?scatter"),
    ("all_gather", r"all_?gather"),
    ("broadcast", r"broadcast"),
    ("barrier", r"barrier"),
)
_C10D, _BACKEND = "c10d::", ("nccl:", "gloo:")


class CommCensus(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's communication over its profiled steps (counts)."""

    steps: int  # profiled steps (ProfilerStep spans; a trace without them is one)
    p2p_calls: int
    p2p_kernels: int
    labelled_cells: int  # cells read from pipeline labels rather than inferred from the op stream
    collectives: dict[str, int]  # kind -> calls

    @property
    def hops(self) -> bool:
        """The rank sent or received point to point, or its actions carry pipeline labels."""
        return bool(self.p2p_calls or self.p2p_kernels or self.labelled_cells)


def _kind(name: str) -> str | None:
    lowered = name.lower()
    return next((kind for kind, pattern in _KINDS if re.search(pattern, lowered)), None)


def _level(names: pl.Series, p2p: tuple[str, ...]) -> dict[str, int]:
    """p2p calls (`p2p`: this level's names of them) and collectives by kind, at one level of names."""
    found: dict[str, int] = {}
    for name, n in names.value_counts().iter_rows():
        kind = "p2p" if name in p2p else _kind(name)
        if kind is not None:
            found[kind] = found.get(kind, 0) + n
    return found


def _calls(names: pl.Series) -> tuple[int, dict[str, int]]:
    """p2p calls and collectives by kind. torch records a call as a c10d op, its backend as a span of its
    own, or both (some versions record only the backend's span of a kind, nccl:all_to_all beside
    c10d::allreduce_): per kind, the level that saw more."""
    c10d = names.str.starts_with(_C10D)
    ops, spans = _level(names.filter(c10d), P2P_OPS), _level(names.filter(~c10d), P2P_SPANS)
    merged = {kind: max(ops.get(kind, 0), spans.get(kind, 0)) for kind in {*ops, *spans}}
    return merged.pop("p2p", 0), dict(sorted(merged.items()))


def census_of(frame: pl.DataFrame, cells: RankCells) -> CommCensus:
    """The rank's CommCensus from its loaded frame and its cells (analysis.cells); only the frame's
    communication rows are taken (a name test per event, no copy of the frame)."""
    name, kernel = pl.col("name"), pl.col("cat").str.to_lowercase() == "kernel"
    host_comm = pl.any_horizontal(name.str.starts_with(prefix) for prefix in (_C10D, *_BACKEND))
    found = rows(
        frame,
        (pl.col("ph") == "X") & ((host_comm & ~kernel) | (kernel & name.str.contains(P2P_KERNEL))),
        "name",
        kernel.alias("kernel"),
    )
    calls, collectives = _calls(found.filter(~pl.col("kernel"))["name"])
    p2p_kernels = 0 if "all_to_all" in collectives else found["kernel"].sum()
    return CommCensus(
        steps=max(cells.steps.height, 1),
        p2p_calls=calls,
        p2p_kernels=int(p2p_kernels),
        labelled_cells=cells.cells.filter(~pl.col("inferred")).height,
        collectives=collectives,
    )
