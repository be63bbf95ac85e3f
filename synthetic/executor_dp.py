"""PP x DP from synthetic.executor_sim (CPU) or executor_gpu (GPU): dp replicas of one pipeline and the
gradients' all-reduce after each rank's wait for its sends, on gloo (CPU) or as an NCCL kernel on the
DP group's stream (GPU), written as the runner's run directory with the truth.

    job = write_executor_job(DIR, build("1f1b", 2, 4), dp=2, slow_replica=1, slow_factor=1.5,
                             sync_us=300, transport=Transport(RENDEZVOUS, 50_000), host=HostTime(tail_ns=300_000))

Replica j is simulate_step of the schedule (replica `slow_replica`'s compute x `slow_factor`), its
ranks laid out as the runner's mesh, pp outermost: stage s of replica j is global rank s * dp + j. The
replicas share nothing until the all-reduce, so each is simulated alone (without its tail) and the
all-reduce is placed after: stage s of replica j joins its DP group (stage s of every replica) when its
sends are done, at e(j, s), and every member leaves at max over j of e(j, s) + `sync_us` (the ring's
transfer once the last member is there; on GPU e(j, s) is when the all-reduce's kernel can start,
executor_gpu's `ready`, and the GPU replicas are simulated again with the group's ends). Then the tail
(the optimizer step, which a GPU job needs: its all-reduce's time is read under it); the step ends with
the last rank's tail, a barrier. Truth per rank: dp_sync = the all-reduce's whole time (nothing runs beside it),
dp_skew = the part before the last member arrived; the slow replica's compute beyond the others' is its
slowdown (the calibration is the others'). A replica's step alone (Job.alone_ns) is its step were its
groups to hold only its own ranks: what it takes without waiting for another replica. With
`across_stages` each rank's all-reduce is its pipeline's instead (Megatron's embedding or model-parallel
group): it joins the pipeline's other stages, and its truth is write_executor_job's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from runners.schedules import Schedule, lower
from synthetic.executor_gpu import DP_STREAM, LAUNCH_NS, GpuStep, simulate_gpu_step
from synthetic.executor_sim import EAGER, RENDEZVOUS, HostTime, StepRun, Transport, simulate_step
from synthetic.executor_trace import (
    rank_document,
    run_config,
    truth_document,
    write_json,
    write_trace,
)
from synthetic.truth import DEFAULT_US, Durations, Work

DP_GROUP = "dp"  # the runner's DP groups' description (pg_config's pg_desc)
PP_GROUP = "pp_stages"  # a pipeline's ranks
NAMES = {  # the groups' descriptions: (a stage's DP group, a pipeline's), as the runner or Megatron says them
    "runner": (DP_GROUP, PP_GROUP),
    "megatron": ("DATA_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP"),
}


class Job(NamedTuple):
    runs: list[StepRun] | list[GpuStep]  # replica j's steps, its ranks local (stage order)
    pipelines: list[list[int]]  # global ranks in stage order, one list per replica
    skew_ns: dict[int, int]  # global rank -> its wait in the all-reduce for the last member
    joined_ns: list[dict[int, int]]  # replica j -> stage -> when its all-reduce's last member arrived
    alone_ns: list[int]  # replica j's step were its groups to hold only its own ranks (no other replica)


def simulate_job(
    schedule: Schedule,
    dp: int,
    work: list[Work],
    transport: Transport,
    host: HostTime,
    sync_ns: int,
    shape: str,
    across_stages: bool = False,
) -> Job:
    """The dp replicas' steps (module docstring), replica j's compute from work[j]; `across_stages`: each
    rank all-reduces with its pipeline's other stages instead of its DP group."""
    work_ns = [lambda a, w=w: w.measured_ns(a, schedule.m) for w in work]
    if shape == "gpu":  # each rank's all-reduce kernel begins at ready[s] and lasts until the group's end
        alone = [simulate_gpu_step(schedule, timed, transport, host, synced={}) for timed in work_ns]
        arrived = [run.ready for run in alone]
    else:  # each rank joins when its sends are done
        alone = [simulate_step(schedule, timed, transport, replace(host, tail_ns=0)) for timed in work_ns]
        arrived = [{s: end.sends_done for s, end in run.ends.items()} for run in alone]

    def joined_of(replicas: list[dict[int, int]]) -> list[dict[int, int]]:
        """Per replica, when each stage's group has its last member: its DP group's (or its pipeline's)."""
        return [
            {s: max(ready.values()) if across_stages else max(other[s] for other in replicas) for s in ready}
            for ready in replicas
        ]

    def finished(j: int, joined: dict[int, int]) -> StepRun | GpuStep:
        """Replica j's step with each stage's all-reduce ending `sync_ns` after its group's last arrival."""
        synced = {s: last + sync_ns for s, last in joined.items()}
        if shape == "gpu":
            return simulate_gpu_step(schedule, work_ns[j], transport, host, synced=synced)
        ends = {
            s: replace(end, synced=synced[s], tail_end=synced[s] + host.tail_ns)
            for s, end in alone[j].ends.items()
        }
        return replace(alone[j], ends=ends)

    def step_of(run: StepRun | GpuStep) -> int:
        return run.step_ns if shape == "gpu" else max(e.tail_end for e in run.ends.values())

    joined = joined_of(arrived)
    skew = {s * dp + j: joined[j][s] - ready[s] for j, ready in enumerate(arrived) for s in ready}
    runs = [finished(j, group) for j, group in enumerate(joined)]
    step_ns = max(step_of(run) for run in runs)
    alone_ns = [step_of(finished(j, joined_of([ready])[0])) for j, ready in enumerate(arrived)]
    pipelines = [[s * dp + j for s in range(schedule.p)] for j in range(dp)]
    return Job([replace(run, step_ns=step_ns) for run in runs], pipelines, skew, joined, alone_ns)


def _groups(pipelines: list[list[int]], names: str) -> list[dict[str, Any]]:
    """pg_config: every stage's DP group, then every pipeline's, described as NAMES[names] says."""
    dp_name, pp_name = NAMES[names]
    dp_groups = [[ranks[s] for ranks in pipelines] for s in range(len(pipelines[0]))]
    named = [(dp_name, ranks) for ranks in dp_groups] + [(pp_name, ranks) for ranks in pipelines]
    return [{"pg_name": str(i), "pg_desc": d, "ranks": r} for i, (d, r) in enumerate(named)]


def global_peers(event: dict[str, Any], ranks: list[int]) -> dict[str, Any]:
    """A replica's event with its p2p peers (local ranks, as synthetic.shapes writes them) made global:
    `ranks` are the replica's, in stage order."""
    args = event.get("args")
    if event.get("name") != "record_param_comms" or not args:
        return event
    peers = {key: ranks[args[key]] for key in ("Src Rank", "Dst Rank") if key in args}
    return event | {"args": args | peers}


def _launched_late(run: StepRun | GpuStep, joined: dict[int, int]) -> StepRun | GpuStep:
    """The run as a late launch records it: each rank calls its all-reduce only once its group's last
    member arrived (joined), nothing recorded before; on GPU the optimizer's launch follows."""
    if isinstance(run, StepRun):
        return replace(run, ends={s: replace(end, sync_called=joined[s]) for s, end in run.ends.items()})
    kernels = {}
    for s, launched in run.kernels.items():
        called = joined[s]
        kernels[s] = [
            replace(k, label_start=called - LAUNCH_NS, launch_end=called, start=called)
            if k.stream == DP_STREAM
            else replace(k, label_start=called, launch_end=called + LAUNCH_NS)
            if k.action is None and k.launch_end < called + LAUNCH_NS
            else k
            for k in launched
        ]
    return replace(run, kernels=kernels)


def _across_stages(told: dict[str, Any]) -> dict[str, Any]:
    """A rank's truth where its all-reduce is across stages: its wait for the last stage is bubble (for
    another stage, not a replica), the rest of the collective other."""
    parts, waited = dict(told["parts_ns"]), told["dp_skew_ns"]
    parts["bubble"] += waited
    parts["other"] += parts["dp_sync"] - waited
    return told | {"parts_ns": parts | {"dp_sync": 0}, "dp_skew_ns": 0}


def write_executor_job(
    directory: str | Path,
    schedule: Schedule,
    dp: int,
    *,
    durations_us: Durations = DEFAULT_US,
    slow_replica: int = 0,
    slow_factor: float = 1.0,
    sync_us: float = 0.0,
    transport: Transport | None = None,
    host: HostTime | None = None,
    steps: int = 3,
    run_id: str = "synthetic-executor-dp",
    shape: str = "cpu",
    late_launch: bool = False,
    names: str = "runner",
    run_json: bool = True,
    across_stages: bool = False,
    process_groups: bool = True,
    labels: bool = True,
) -> Job:
    """rank{g}.json.gz per global rank, truth.json (per global rank, dp_skew_ns beside its parts) and
    (with `run_json`; without, the traces' process groups alone say the pipelines) run.json (dp, the mesh
    and the pipelines), written last. `late_launch`: each rank's all-reduce recorded from its group's last
    arrival (_launched_late, as converted Megatron jobs hold it), the truth unchanged; `names`: the
    groups' descriptions (NAMES); `across_stages`: each rank's all-reduce is its pipeline's, across its
    stages (an embedding or model-parallel group's, not data parallelism): its wait for the last stage
    to arrive is bubble in the truth, the rest of it other, and no dp_sync nor dp_skew. Without
    `process_groups` the traces record none (no pg_config): without run.json only the p2p peers of
    unlabelled GPU traces (`labels` False: a hand-written loop's, synthetic.executor_events) say the
    pipelines."""
    if shape not in ("cpu", "gpu"):
        raise ValueError(f"shape {shape!r}: cpu or gpu")
    if late_launch and shape == "gpu" and sync_us * 1000 < LAUNCH_NS:
        raise ValueError("a late launch on GPU needs an all-reduce longer than the optimizer's launch")
    transport = transport or Transport(EAGER if shape == "gpu" else RENDEZVOUS)
    host = host or HostTime()
    lowered = schedule if schedule.lowered else lower(schedule)
    reference = Work(durations_us)  # the calibration's
    work = [Work(durations_us, slowdown=slow_factor if j == slow_replica else 1.0) for j in range(dp)]
    job = simulate_job(lowered, dp, work, transport, host, round(sync_us * 1000), shape, across_stages)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    groups = _groups(job.pipelines, names)
    world = lowered.p * dp
    truth: dict[str, Any] = {
        "steps": [{"step": k, "step_ns": job.runs[0].step_ns, "ranks": {}} for k in range(steps)]
    }
    for j, run in enumerate(job.runs):
        replica = truth_document(run, lowered, work[j], transport, host, steps)
        drawn = _launched_late(run, job.joined_ns[j]) if late_launch else run
        for s in range(lowered.p):
            rank = job.pipelines[j][s]
            said = groups[lowered.p + j if across_stages else s]  # _groups: the DP groups, then the pipelines
            group = {
                "Process Group Name": said["pg_name"],
                "Process Group Description": said["pg_desc"],
                "Process Group Ranks": str(said["ranks"]),
            }
            distributed = {"rank": rank, "world_size": world} | (
                {"pg_config": groups} if process_groups else {}
            )
            document = rank_document(drawn, s, steps, run_id, distributed, group, labels)
            events = [global_peers(event, job.pipelines[j]) for event in document["traceEvents"]]
            write_trace(directory / f"rank{rank}.json.gz", document | {"traceEvents": events})
            told = replica["steps"][0]["ranks"][str(s)] | {"dp_skew_ns": job.skew_ns[rank]}
            if across_stages:
                told = _across_stages(told)
            for step in truth["steps"]:
                step["ranks"][str(rank)] = told
    write_json(directory / "truth.json", truth)
    if not run_json:
        return job
    config = run_config(schedule, reference, job.runs[0].step_ns, transport, run_id, shape) | {
        "dp": dp,
        "world_size": world,
        "mesh": {"dim_names": ["pp", "dp"], "shape": [lowered.p, dp]},
        "pipelines": job.pipelines,
    }
    write_json(directory / "run.json", config)
    return job
