"""An op-level timeline (analysis.traces.oplevel) written as the GPU-shaped Kineto traces the loader reads.

One trace per (stage, dp_rank), global rank stage x dp + dp_rank (the mesh's order, pp outermost), so
that every reader of runs (analyze, merge, report) takes the job as it takes a profiled one:
- a forward or backward compute is a `PP:{stage}F{mb}` / `B{mb}` action, its kernel on the compute
  stream from its recorded start to its end; the k-th forward-send, forward-recv, backward-send and
  backward-recv of a stage are SEND_F, RECV_F, SEND_B, RECV_B of the microbatch of the k-th compute of
  their direction, an NCCL SendRecv kernel each (sends and receives on streams of their own: Megatron
  batches a send with a receive, recorded as two ops over one span);
- params-all-gather, grads-reduce-scatter and the all-reduces are NCCL AllGather, ReduceScatter and
  AllReduce kernels on a collective stream, each under a record_param_comms naming its group's ranks;
  gc and the optimizer are compute kernels outside any action;
- steps follow one another in their recorded order, each from the previous one's end;
- the host issues every kernel ahead of the device: an op-level timeline records no host time, so
  none of its idle time can be launch overhead.
Process groups (distributedInfo.pg_config) as DeviceMesh names them (mesh_pp, mesh_dp), and the
embedding group (Megatron's name) between a replica's first and last stage.
Limits: no calibration (small_gemm and slowdown stay unknown), one kernel per op (no kernels recorded),
virtual pipeline stages (vpp_size > 1) refused.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl

from analysis.errors import InputError
from analysis.files import write_atomically
from analysis.traces import kineto
from analysis.traces.kineto import RECORD_PARAM_COMMS
from analysis.traces.oplevel import OpTimeline, read_timeline
from analysis.traces.oplevel import COMPUTE, DP_COLLECTIVES, EMBEDDING, P2P

# summary.json's note on an op-level run: what its analysis cannot measure
LIMITS = (
    "an op-level timeline, read as one kernel per op: no calibration (small_gemm and slowdown unknown), "
    "no host time (no launch overhead), no kernels below the op; its steps laid end to end"
)
ORIGIN_NS = 10**9  # the first step's start on every rank's clock
LAUNCH_NS = 2_000  # one cudaLaunchKernel on the host, each label this long around it
COMPUTE_STREAM, SEND_STREAM, RECV_STREAM, COLLECTIVE_STREAM = 7, 20, 21, 22
_KIND = {
    "forward-send": "SEND_F",
    "forward-recv": "RECV_F",
    "backward-send": "SEND_B",
    "backward-recv": "RECV_B",
}
_NCCL = {
    "params-all-gather": "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "grads-reduce-scatter": "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
}
_ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
_SEND_RECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


def _labelled(ops: pl.DataFrame, stage: int) -> pl.DataFrame:
    """The lane's ops with `label`: its PP action (null for ops outside the schedule)."""
    compute_mb = {
        kind: ops.filter(pl.col("optype") == kind).sort("step", "seq_id").select("step", "seq_id", "mb_id")
        for kind in COMPUTE
    }
    parts = [
        ops.filter(~pl.col("optype").is_in(list(P2P))).with_columns(
            label=pl.when(pl.col("optype").is_in(list(COMPUTE)))
            .then(
                pl.format(f"PP:{stage}{{}}{{}}", pl.col("optype").str.slice(0, 1).str.to_uppercase(), "mb_id")
            )
            .otherwise(None)
        )
    ]
    for optype, compute in P2P.items():
        mine = (
            ops.filter(pl.col("optype") == optype)
            .drop("mb_id")
            .join(compute_mb[compute], on=["step", "seq_id"], how="left")
        )
        parts.append(
            mine.with_columns(label=pl.format(f"PP:{stage}{_KIND[optype]}{{}}", "mb_id")).select(
                parts[0].columns
            )
        )
    return pl.concat(parts).sort("start_ns", "optype")


def _kernel(optype: str) -> tuple[str, int]:
    if optype in P2P:
        return _SEND_RECV, SEND_STREAM if optype.endswith("send") else RECV_STREAM
    if optype in _NCCL:
        return _NCCL[optype], COLLECTIVE_STREAM
    if "all-reduce" in optype or optype == "optimizer-clip-main-grad":
        return _ALL_REDUCE, COLLECTIVE_STREAM
    return optype, COMPUTE_STREAM


def _group_ranks(optype: str, stage: int, replica: int, p: int, dp: int) -> list[int] | None:
    if optype in DP_COLLECTIVES:
        return [stage * dp + j for j in range(dp)]
    if optype == EMBEDDING:
        return sorted({replica, (p - 1) * dp + replica})
    if optype == "optimizer-clip-main-grad":
        return list(range(p * dp))
    return None


def _lane_events(ops: pl.DataFrame, stage: int, replica: int, p: int, dp: int) -> list[dict[str, Any]]:
    rank = stage * dp + replica
    host, device = 1000 + rank, rank
    events = [{"ph": "M", "name": "thread_name", "pid": host, "tid": host, "args": {"name": "python"}}]
    step_starts = ops.group_by("step").agg(pl.col("start_ns").min()).sort("step")
    for step, step_ops in ops.group_by("step", maintain_order=True):
        step_ops = step_ops.sort("start_ns")
        first = int(step_ops["start_ns"].min())
        issue = first - (step_ops.height + 2) * LAUNCH_NS
        ends = step_starts.filter(pl.col("step") > step[0])["start_ns"]
        closes = (
            int(ends[0]) - (step_ops.height + 2) * LAUNCH_NS if len(ends) else int(step_ops["end_ns"].max())
        )
        events.append(kineto.span(f"ProfilerStep#{step[0]}", "user_annotation", host, host, issue, closes))
        for row in step_ops.iter_rows(named=True):
            issue += LAUNCH_NS
            correlation = len(events)
            name, stream = _kernel(row["optype"])
            ids = {"correlation": correlation, "External id": correlation}
            launch = kineto.span(
                "cudaLaunchKernel", "cuda_runtime", host, host, issue, issue + LAUNCH_NS // 2, **ids
            )
            kernel = kineto.span(
                name, "kernel", device, stream, row["start_ns"], row["end_ns"], stream=stream, **ids
            )
            events += [launch, kernel]
            if row["label"] is not None:
                events.append(
                    kineto.span(
                        row["label"], "user_annotation", host, host, issue - 1, issue + LAUNCH_NS // 2 + 1
                    )
                )
            members = _group_ranks(row["optype"], stage, replica, p, dp)
            if members is not None:
                events.append(
                    kineto.span(
                        RECORD_PARAM_COMMS,
                        "cpu_op",
                        host,
                        host,
                        issue - 1,
                        issue + LAUNCH_NS // 2 + 1,
                        **{"Collective name": row["optype"], "Process Group Ranks": members},
                    )
                )
    return events


def _placed(timeline: OpTimeline) -> pl.DataFrame:
    """Every op in integer ns on one clock: each step from the previous one's end (their gap, data
    loading and the like, is not recorded), its ops at their recorded offsets from its first start."""
    ops = timeline.lanes()
    spans = ops.group_by("step").agg(span=pl.col("end_ts").max() - pl.col("start_ts").min()).sort("step")
    offsets = spans.with_columns(
        offset=ORIGIN_NS + (pl.col("span") * 1e9).round().cast(pl.Int64).cum_sum().shift(1, fill_value=0)
    )
    origin = pl.col("start_ts").min().over("step")
    return ops.join(offsets, on="step").with_columns(
        start_ns=((pl.col("start_ts") - origin) * 1e9).round().cast(pl.Int64) + pl.col("offset"),
        end_ns=((pl.col("end_ts") - origin) * 1e9).round().cast(pl.Int64) + pl.col("offset"),
    )


def documents(timeline: OpTimeline, source: Path) -> dict[int, dict[str, Any]]:
    """global rank -> its Kineto trace document."""
    if timeline.sizes["vpp_size"] > 1:
        raise InputError(source, "virtual pipeline stages (vpp_size > 1) are not read as a run yet")
    ops = _placed(timeline)
    p, dp = int(ops["stage"].max()) + 1, int(ops["dp_rank"].max()) + 1
    groups = [("mesh_pp", [s * dp + j for s in range(p)]) for j in range(dp)]
    groups += [("mesh_dp", [s * dp + j for j in range(dp)]) for s in range(p)]
    groups += [("EMBEDDING_GROUP", sorted({j, (p - 1) * dp + j})) for j in range(dp)]
    pg_config = [
        {"pg_name": str(i), "pg_desc": name, "ranks": ranks} for i, (name, ranks) in enumerate(groups)
    ]
    found = {}
    for (stage, replica), lane in ops.group_by("stage", "dp_rank"):
        rank = stage * dp + replica
        found[rank] = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": rank, "name": "op-level timeline"}],
            "distributedInfo": {
                "backend": "nccl",
                "rank": rank,
                "world_size": p * dp,
                "pg_config": pg_config,
            },
            "traceName": f"{timeline.name} stage {stage} dp_rank {replica}",
            "traceEvents": _lane_events(_labelled(lane, stage), stage, replica, p, dp),
        }
    return found


def write_traces(directory: Path) -> None:
    """rank{g}.json.gz for the op-level run in `directory` (analysis.traces.oplevel)."""
    timeline = read_timeline(directory)
    for rank, document in documents(timeline, directory / f"trace-{timeline.name}.parquet").items():
        write_atomically(directory / f"rank{rank}.json.gz", gzip.compress(json.dumps(document).encode(), 6))
