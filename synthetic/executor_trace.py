"""A run directory from synthetic.executor_sim (shape "cpu"), synthetic.executor_gpu ("gpu") or
synthetic.executor_single_gpu ("single_gpu": one trace file, its events written there): Kineto traces of
the native executor's steps, run.json with the calibration, and truth.json with each step's true times.

    run = write_executor_run(DIR, build("gpipe", 2, 16), durations_us={"F": 1000, "B": 2000},
                             transport=Transport(RENDEZVOUS, transfer_ns=50_000), host=HostTime(tail_ns=300_000))

Each step is one simulate_step (every step alike), steps back to back, every rank's ProfilerStep the
step's length (the barrier). What a rank's thread records, as the native executor's gloo traces do
(shapes.cpu_cell): a `PP:` span per action; inside a compute span its two operators from its work's
start; inside a RECV span `c10d::recv_` and `gloo:recv` over the blocked time (the whole span: a RECV is
posted when it begins); inside a SEND span `c10d::send`, and from its end a `gloo:send` span until the
step's wait for sends returns from that send (as real gloo traces hold it, over everything between);
after the last action `PP wait for sends` until the sends are released, then `optimizer_step` holding an
`aten::add_` over the tail.

truth.json: {"transport", "steps": [{"step", "step_ns", "ranks": {rank: {"actions": [[label, start_ns,
end_ns], ...] in order, "lane_end_ns", "sends_done_ns", "parts_ns": {...}}}}]}, times from the step's
start. A rank's parts sum to the step: compute (its work at the reference speed; small_gemm and slowdown
the rest of it, split_compute), launch_overhead (host time between actions,
inside compute spans before the work, in asynchronous SEND calls), bubble (a RECV's or blocking SEND's
wait before the partner posted; the wait for sends before their last receiver posted, with a
rendezvous; idle after the tail until the barrier), p2p_wait (those waits after the partner posted),
other (the tail).

GPU (NCCL, eager delivery by default): per action its `PP:` label on the host thread around one
cudaLaunchKernel, the kernel (correlation id, ac2g flow) with its device-side label on the compute
stream or its peer's comm stream; `PP wait for sends`, then `optimizer_step` around the optimizer's
launch. truth.json's actions are the kernels' times; its parts are synthetic.executor_gpu.rank_parts (compute
split as on CPU), and p2p_queued_ns and p2p_unposted_ns how much of p2p_wait is each of
synthetic.executor_gpu.DEPARTURES. single_gpu: the same per virtual rank, a RECV's action its compute stream's wait.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from runners.schedules import Action, Schedule, lower
from runners.schedules.single_gpu import PROCESSES, SINGLE_GPU
from runners.schedules.trace_names import label
from synthetic.executor_events import BASE_TIME_NS, Group, cpu_rank_events, gpu_rank_events
from synthetic.executor_gpu import DEPARTURES, GpuStep, queued_parts, simulate_gpu_step
from synthetic.executor_gpu import rank_parts as gpu_parts
from synthetic.executor_sim import EAGER, RENDEZVOUS, HostTime, StepRun, Transport, simulate_step
from synthetic.executor_single_gpu import simulate_single_gpu_step, single_gpu_events
from synthetic.truth import (
    DEFAULT_US,
    ROWS_PER_MICROBATCH,
    Durations,
    Factors,
    Work,
    calibration,
    calibration_by_rows,
    dims,
)


def rank_parts(run: StepRun, rank: int, transport: Transport, host: HostTime) -> dict[str, int]:
    """The true parts of one rank's step (module docstring), ns; they sum to run.step_ns."""
    parts = dict.fromkeys(("compute", "launch_overhead", "bubble", "p2p_wait", "dp_sync", "other"), 0)
    free = 0
    for done in run.actions[rank]:
        parts["launch_overhead"] += done.start - free
        free = done.end
        if done.action.kind.is_compute:
            parts["launch_overhead"] += done.work_start - done.start
            parts["compute"] += done.end - done.work_start
        elif done.partner_posted is None:  # an asynchronous SEND's call
            parts["launch_overhead"] += done.end - done.start
        else:
            ready = min(max(done.start, done.partner_posted), done.end)
            parts["bubble"] += ready - done.start
            parts["p2p_wait"] += done.end - ready
    end = run.ends[rank]
    posted = end.last_receiver_post if transport.semantics == RENDEZVOUS else None
    ready = min(max(end.lane_end, posted if posted is not None else end.lane_end), end.sends_done)
    parts["bubble"] += ready - end.lane_end + run.step_ns - end.tail_end
    parts["p2p_wait"] += end.sends_done - ready
    tail = end.sends_done if end.synced is None else end.synced
    parts["dp_sync"] += tail - end.sends_done
    parts["other"] += end.tail_end - tail
    return parts


def rank_document(
    run: StepRun | GpuStep,
    rank: int,
    steps: int,
    run_id: str,
    distributed: Mapping[str, Any],
    group: Group | None = None,
    labels: bool = True,
    clock_ns: int = 0,
    events: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The trace of the run's local rank `rank`; `distributed`: its global rank and world_size (and
    pg_config), `group` its DP group, `clock_ns` its clock's offset (synthetic.executor_events);
    `events` where they are written apart (a single-GPU run's one process)."""
    on_gpu = isinstance(run, GpuStep)
    gpu = [{"id": rank, "name": "Synthetic GPU", "totalGlobalMem": 80 * 2**30, "computeMajor": 9}]
    if events is None:
        events = (gpu_rank_events if on_gpu else cpu_rank_events)(run, rank, steps, group, labels, clock_ns)
    return {
        "schemaVersion": 1,
        "deviceProperties": gpu if on_gpu else [],
        "distributedInfo": {"backend": "nccl" if on_gpu else "gloo", **distributed},
        "run_id": run_id,
        "baseTimeNanoseconds": BASE_TIME_NS,
        "traceName": f"synthetic executor rank{distributed['rank']}",
        "traceEvents": events,
    }


def truth_document(
    run: StepRun | GpuStep, schedule: Schedule, work: Work, transport: Transport, host: HostTime, steps: int
) -> dict[str, Any]:
    """truth.json's content (module docstring): `run` of the lowered `schedule` with `work`."""
    if isinstance(run, GpuStep):
        ranks = {
            str(rank): {
                "actions": [[label(k.action), k.start, k.end] for k in kernels if k.action],
                "parts_ns": split_compute(gpu_parts(run, rank), schedule, rank, work),
                **{f"{name}_ns": ns for name, ns in queued_parts(run, rank).items() if name in DEPARTURES},
            }
            for rank, kernels in run.kernels.items()
        }
    else:
        ranks = {
            str(rank): {
                "actions": [[label(d.action), d.start, d.end] for d in run.actions[rank]],
                "lane_end_ns": run.ends[rank].lane_end,
                "sends_done_ns": run.ends[rank].sends_done,
                "parts_ns": split_compute(rank_parts(run, rank, transport, host), schedule, rank, work),
            }
            for rank in run.actions
        }
    return {
        "transport": asdict(transport),
        "steps": [{"step": step, "step_ns": run.step_ns, "ranks": ranks} for step in range(steps)],
    }


def run_config(
    schedule: Schedule, work: Work, step_ns: int, transport: Transport, run_id: str, shape: str = "cpu"
) -> dict[str, Any]:
    """run.json: the keys synthetic.generate writes for a run of `shape` (write_executor_run's), and the
    transport."""
    step_ms = step_ns / 1e6
    on_gpu = shape != "cpu"
    return {
        "schedule": schedule.name,
        "p": schedule.p,
        "m": schedule.m,
        "v": schedule.v,
        "engine": "synthetic",
        "preset": None,
        "device": "cuda" if on_gpu else "cpu",
        "backend": "nccl" if on_gpu else "gloo",
        "mode": SINGLE_GPU if shape == SINGLE_GPU else PROCESSES,
        "dtype": "float32",
        "run_id": run_id,
        "dims": dims(schedule),
        "rows_per_microbatch": ROWS_PER_MICROBATCH,
        "calibration": calibration(schedule, work),
        "calibration_by_rows": calibration_by_rows(schedule, work),
        "step_time_unprofiled_ms": step_ms,
        "step_times_unprofiled_ms": [step_ms] * 3,
        "synthetic_transport": transport.semantics,
        "complete": True,
    }


def split_compute(parts: dict[str, int], schedule: Schedule, rank: int, work: Work) -> dict[str, int]:
    """A rank's parts with the measured time of its compute split as synthetic.truth says: compute at
    the reference, small_gemm (isolated - reference) and slowdown (measured - isolated)."""
    actions = [a for a in schedule.orders[rank] if a.kind.is_compute]
    reference = sum(work.reference_ns(a) for a in actions)
    isolated = sum(work.isolated_ns(a, schedule.m) for a in actions)
    measured = sum(work.measured_ns(a, schedule.m) for a in actions)
    return parts | {
        "compute": parts["compute"] - measured + reference,
        "small_gemm": isolated - reference,
        "slowdown": measured - isolated,
    }


def write_trace(path: Path, document: Mapping[str, Any]) -> None:
    _write(path, gzip.compress(json.dumps(document).encode(), 6))


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    _write(path, json.dumps(data, indent=1).encode())


def _write(path: Path, data: bytes) -> None:
    """Write beside `path`, then rename over it: a reader never sees half a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def write_executor_run(
    directory: str | Path,
    schedule: Schedule,
    *,
    durations_us: Durations = DEFAULT_US,
    transport: Transport | None = None,
    host: HostTime | None = None,
    steps: int = 3,
    run_id: str = "synthetic-executor",
    shape: str = "cpu",
    labels: bool = True,
    batched: bool = False,
    small_gemm: Factors = 1.0,
    slowdown: Factors = 1.0,
    clock_offset_ns: Mapping[int, int] | None = None,
) -> StepRun | GpuStep:
    """rank{r}.json.gz, truth.json and run.json (last, with complete) of `steps` simulated steps; by
    default a rendezvous (cpu) or eager delivery (gpu) without transfer time, and no host time. A
    compute action takes its `durations_us` x `small_gemm` x `slowdown` (synthetic.truth.Work); the
    calibration holds the first two. `clock_offset_ns`: rank -> how far its clock runs ahead of the true
    one (its timestamps move, never the truth)."""
    if shape not in ("cpu", "gpu", SINGLE_GPU):
        raise ValueError(f"shape {shape!r}: cpu, gpu or {SINGLE_GPU}")
    on_gpu = shape != "cpu"
    transport = transport or Transport(EAGER if on_gpu else RENDEZVOUS)
    host = host or HostTime()
    lowered = schedule if schedule.lowered else lower(schedule)
    work = Work(durations_us, small_gemm, slowdown)
    if batched and (labels or shape != "gpu"):
        raise ValueError("batched p2p is written GPU-shaped and unlabelled (shape='gpu', labels=False)")
    if shape == SINGLE_GPU and (not labels or clock_offset_ns or transport.semantics != EAGER):
        raise ValueError(f"shape {SINGLE_GPU} is written labelled, on one clock, with eager copies")
    work_ns = lambda action: work.measured_ns(action, lowered.m)  # noqa: E731
    if shape == SINGLE_GPU:
        run = simulate_single_gpu_step(lowered, work_ns, transport.transfer_ns, host)
    elif on_gpu:
        run = simulate_gpu_step(lowered, work_ns, transport, host, batched=batched)
    else:
        run = simulate_step(lowered, work_ns, transport, host)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if shape == SINGLE_GPU:  # one process, one file
        events = single_gpu_events(run, lowered.p, steps)
        document = rank_document(run, 0, steps, run_id, {"rank": 0, "world_size": 1}, events=events)
        write_trace(directory / "rank0.json.gz", document)
    else:
        for rank in range(lowered.p):
            distributed = {"rank": rank, "world_size": lowered.p}
            clock = (clock_offset_ns or {}).get(rank, 0)
            document = rank_document(run, rank, steps, run_id, distributed, labels=labels, clock_ns=clock)
            write_trace(directory / f"rank{rank}.json.gz", document)
    truth = truth_document(run, lowered, work, transport, host, steps)
    write_json(directory / "truth.json", truth)
    config = run_config(schedule, work, run.step_ns, transport, run_id, shape)
    write_json(directory / "run.json", config)
    return run


def stalls_before(actions: Mapping[str, int]) -> dict[Action, int]:
    """HostTime.stalls from compact labels: {"0RECV_B0": ns} -> {Action(0, RECV_B, 0): ns}."""
    return {Action.parse(text): ns for text, ns in actions.items()}
