"""Synthetic PP x DP jobs: dp replicas of one pipeline, one of them slower, and a gradient sync per step.

    traces, truth = synthesize_job(build("1f1b", 2, 4), dp=2, slow_pipeline=1, slow_factor=1.5,
                                   sync_us=300, shape="gpu")

Each replica j is synthetic.generate's replay of the schedule (the slow one's compute x slow_factor),
its ranks laid out as the runner's mesh, pp outermost: stage s of replica j is global rank s * dp + j.
After its last action (GPU: once its SEND kernels are done, as the compute stream waits for the sends)
each rank joins its DP group's all-reduce (stage s's ranks of every replica): it starts there, at
e(j, s), and ends on every member at the latest start plus `sync_us`, the transfer.
The step is as long as the longest sync; every rank idles after its sync until then (drain: bubble).
Truth per rank: dp_sync = end - e(j, s), all of it exposed (nothing computes after the last action),
and of it dp_skew = the latest start - e(j, s), the wait for the slowest replica; bubble is the rest
of what the replay's truth called bubble (GPU: the next step's head, launch_overhead there, is dp_sync
where the sync covers it). Per replica, its step alone: its last rank's end plus the
transfer. CPU: c10d::allreduce_ on the main thread (CALL_NS) and its
gloo:all_reduce on gloo's thread until the end; GPU: an NCCL AllReduce kernel on the comm stream.
Each rank's trace records its process groups (distributedInfo.pg_config) as the runner names them.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, NamedTuple

from analysis.files import write_atomically
from runners.schedules import Schedule, lower
from synthetic import batched as batching
from synthetic import shapes
from synthetic.executor_dp import global_peers
from synthetic.generate import ORIGIN_NS, OptionError, next_head, run_config, sends_until_received, synthesize
from synthetic.truth import RankTruth

CALL_NS = 5_000  # CPU: the c10d::allreduce_ call that hands the buckets to gloo's thread
GLOO_TID_OFFSET = 50  # gloo's worker thread is tid pid + 50
SYNC_CORRELATION = 1 << 30  # the all-reduces' launches: correlation ids no action's launch has
PARAM_LEAD_NS = 2_000  # the all-reduce's launch ends this long before its kernel starts
# the runner's group descriptions: (a pipeline's p2p group, a stage's DP group, a pipeline's group across its
# stages)
NAMES = ("pp_activation_up", "dp", "pp_stages")
ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


class Job(NamedTuple):
    traces: dict[int, dict[str, Any]]  # global rank -> Chrome trace document
    truth: dict[int, RankTruth]  # global rank -> its truth, dp_sync and dp_skew included
    pipelines: list[list[int]]  # global ranks in stage order, one list per replica
    alone_ns: list[int]  # each replica's step alone: its last rank's end plus the all-reduce's transfer


def synthesize_job(
    schedule: Schedule,
    dp: int,
    *,
    slow_pipeline: int = 0,
    slow_factor: float = 1.0,
    sync_us: float = 0.0,
    shape: str = "cpu",
    steps: int = 3,
    process_groups: bool = True,
    **options: Any,
) -> Job:
    """dp replicas of `schedule`, replica `slow_pipeline`'s compute x `slow_factor`; `options` as
    synthetic.generate.synthesize's (no clock offsets: the replicas share a clock). Without
    `process_groups` the traces record none: only the p2p peers of unlabelled GPU traces (their
    record_param_comms, global ranks) say which ranks form a pipeline. GPU: each all-reduce's
    record_param_comms names its group, the stage's DP group (an all-reduce across stages:
    synthetic.executor_dp)."""
    if shape not in ("cpu", "gpu") or options.get("clock_offset_ns"):
        raise OptionError("a PP x DP job is written cpu- or gpu-shaped, on one clock")
    lowered = schedule if schedule.lowered else lower(schedule)
    p, slowdown = lowered.p, options.pop("slowdown", 1.0)
    if not isinstance(slowdown, (int, float)):
        raise OptionError("a PP x DP job takes one slowdown factor")
    factors = [slowdown * (slow_factor if j == slow_pipeline else 1.0) for j in range(dp)]
    alone = [synthesize(lowered, slowdown=f, shape=shape, steps=1, **options) for f in factors]
    drawn = [sends_until_received(run.cells) if shape == "gpu" else run.cells for run in alone]
    pairs = batching.pairs(lowered) if options.get("batched") else {}
    ends = [[max(cell.end for cell in cells[s]) for s in range(p)] for cells in drawn]  # e(j, s)
    latest = [max(ends[j][s] for j in range(dp)) for s in range(p)]
    sync_end = [latest[s] + round(sync_us * 1000) for s in range(p)]
    step_ns = max(sync_end)
    pipelines = [[s * dp + j for s in range(p)] for j in range(dp)]
    traces, truth = {}, {}
    groups = _groups(pipelines)
    for j, factor in enumerate(factors):
        run = synthesize(lowered, slowdown=factor, shape=shape, steps=steps, step_ns=step_ns, **options)
        for s in range(p):
            rank = pipelines[j][s]
            sync = (ends[j][s], sync_end[s])
            document = run.traces[s]
            events = [global_peers(e, pipelines[j]) for e in document["traceEvents"]]
            said = _said(groups, [ranks[s] for ranks in pipelines])
            events += _sync_events(document, s, sync, step_ns, steps, shape, said)
            info = {**document["distributedInfo"], "rank": rank, "world_size": p * dp}
            info |= {"pg_config": groups} if process_groups else {}
            traces[rank] = document | {"traceEvents": events, "distributedInfo": info}
            told = run.truth[s]
            exposed = sync[1] - sync[0]
            under = 0  # of the next step's head (launch_overhead in the truth), the part under the sync
            if shape == "gpu" and steps > 1:
                head = next_head(run.cells[s], step_ns, pairs)
                under = max(0, min(head[1], sync[1]) - max(head[0], sync[0]))
            truth[rank] = replace(
                told,
                rank=rank,
                launch_overhead_ns=told.launch_overhead_ns - under,
                bubble_ns=told.bubble_ns - exposed + under,
                dp_sync_ns=exposed,
                dp_skew_ns=latest[s] - ends[j][s],
            )
    alone_ns = [max(ends[j]) + round(sync_us * 1000) for j in range(dp)]
    return Job(traces, truth, pipelines, alone_ns)


def _sync_events(
    document: dict[str, Any],
    stage: int,
    sync: tuple[int, int],
    step_ns: int,
    steps: int,
    shape: str,
    group: dict[str, Any],
) -> list[dict[str, Any]]:
    """Every step's all-reduce of one rank, from its start to its end on the rank's clock."""
    pid = 4000 + stage  # synthetic.generate's pid of local rank `stage`
    events = []
    for step in range(steps):
        start, end = (ORIGIN_NS + step * step_ns + t for t in sync)
        if shape == "gpu":
            events += _gpu_sync(pid, stage, start, end, SYNC_CORRELATION + step, group)
        else:
            gloo = pid + GLOO_TID_OFFSET
            events.append(shapes.span("c10d::allreduce_", "cpu_op", pid, pid, start, start + CALL_NS))
            events.append(shapes.span("gloo:all_reduce", "user_annotation", pid, gloo, start, end))
    return events


def _gpu_sync(
    pid: int, device: int, start: int, end: int, correlation: int, group: dict[str, Any]
) -> list[dict[str, Any]]:
    """The all-reduce's kernel on the comm stream, launched just before it inside the record_param_comms
    that names its process group (`group`: its args), as ProcessGroupNCCL records a collective."""
    stream, ids = shapes.COMM_STREAM, {"correlation": correlation, "External id": correlation}
    launch = (start - shapes.LAUNCH_NS - PARAM_LEAD_NS, start - PARAM_LEAD_NS)
    params = {"Collective name": "allreduce", **group}
    return [
        shapes.span("record_param_comms", "cpu_op", pid, pid, launch[0] - 1_000, launch[1] + 1_000, **params),
        shapes.span("cudaLaunchKernel", "cuda_runtime", pid, pid, *launch, **ids),
        shapes.span(
            ALLREDUCE_KERNEL, "kernel", device, stream, start, end, device=device, stream=stream, **ids
        ),
    ]


def _groups(pipelines: list[list[int]]) -> list[dict[str, Any]]:
    """The process groups a rank records (pg_config): every pipeline's p2p group, every stage's DP group,
    and every pipeline as a group across its stages, described as NAMES."""
    pp, dp, across = NAMES
    groups = [(pp, ranks) for ranks in pipelines]
    groups += [(dp, [ranks[s] for ranks in pipelines]) for s in range(len(pipelines[0]))]
    groups += [(across, ranks) for ranks in pipelines]
    return [{"pg_name": str(i), "pg_desc": d, "ranks": r} for i, (d, r) in enumerate(groups)]


def _said(groups: list[dict[str, Any]], members: list[int]) -> dict[str, Any]:
    """What a collective's record_param_comms says of its group (the last pg_config entry of `members`),
    its ranks as text, as recent torch writes them."""
    entry = [g for g in groups if g["ranks"] == members][-1]
    return {
        "Process Group Name": entry["pg_name"],
        "Process Group Description": entry["pg_desc"],
        "Process Group Ranks": str(members),
    }


def write_job(
    directory: str | Path, schedule: Schedule, dp: int, run_json: bool = True, **options: Any
) -> Job:
    """rank{g}.json.gz per global rank, truth.json and (with `run_json`) run.json with dp and pipelines."""
    job = synthesize_job(schedule, dp, **options)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for rank, document in job.traces.items():
        write_atomically(directory / f"rank{rank}.json.gz", gzip.compress(json.dumps(document).encode(), 6))
    write_atomically(directory / "truth.json", json.dumps([asdict(t) for t in job.truth.values()]).encode())
    if run_json:
        p = len(job.pipelines[0])
        mesh = {"dim_names": ["pp", "dp"], "shape": [p, dp]}
        config = run_config(schedule, job.truth, options) | {
            "dp": dp,
            "world_size": p * dp,
            "mesh": mesh,
            "pipelines": job.pipelines,
        }
        write_atomically(directory / "run.json", json.dumps(config, indent=1).encode())
    return job
