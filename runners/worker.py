"""One pipeline rank: `torchrun ... -m runners.worker --run-dir DIR --sched gpipe --m 8 ...`.

With `--dp D` the world is D pipelines of WORLD_SIZE / D ranks (runners/mesh.py): each rank finds its
stage rank and pipeline from its global rank, feeds its pipeline its own batch (a data-parallel shard:
seeded by the pipeline), and averages its gradients over its DP group before each optimizer step
(runners/grad_sync.py).

The launcher (`python -m runners trace`) starts it on one node; for several nodes start it with
torchrun yourself, as docs/guide.md's "Several nodes" says (c10d rendezvous, the run directory on a shared
file system). Each rank times unprofiled steps, calibrating its stages between them at every microbatch
size of runners.presets.calibration_rows (under a profiler
session with the profiled steps' settings: CALIBRATION_PROFILED), then profiles a few steps into
rank{r}.json.gz; rank 0 writes run.json last, once every rank has exported its trace (started by our
launcher, incomplete: the launcher completes it, runners.rundir). With
`--virtual-ranks P` (the launcher's single_gpu mode) this one process runs all P ranks as streams of
its GPU (runners.engines.single_gpu) and calibrates every stage itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import record_function

from runners.advice_calibration import advice_calibration, chunk_ids
from runners.arguments import OneLineParser, whole_number
from runners.engines import ENGINES, single_gpu
from runners.engines.protocol import RankSetup
from runners.grad_sync import open_grad_sync
from runners.heap import keep_heap, minor_faults, reserve_heap
from runners.inject import layer_factors
from runners.measure import (
    at_rows,
    calibration,
    calibration_by_rows,
    calibration_samples,
    pooled,
    timed_step,
    timing_rule,
)
from runners.mesh import world_problem
from runners.model import stage_input
from runners.p2p import PEER_TIMEOUT
from runners.presets import ADVISED_VS, calibration_rows, microbatch_rows, preset_problem
from runners.profile import profile_steps, session
from runners.request import RequestError, Resolved, add_request_arguments, request_from, resolve
from runners.rundir import git_revision, host_facts, write_run_json
from runners.runqueue import RunQueueMeter
from runners.schedules import Schedule, build, lower
from runners.schedules.single_gpu import SINGLE_GPU
from runners.schedules.trace_names import STEP_END_BARRIER
from runners.stage_factory import checked_sample_shape, rank_stages
from runners.stash import StashMeter
from runners.stop import die_with_parent

PROFILER_WAIT, PROFILER_WARMUP = 1, 1
# Calibrate inside a profiler session with the profiled steps' settings (its trace discarded), so the
# isolated passes pay the profiler's per-op cost as the profiled cells do, and on CPU are timed as the
# union of their operators' spans, as busy time is (runners.measure); run.json says which.
CALIBRATION_PROFILED = True
ADVICE_REPEATS = 3  # samples per pass and size of --calibrate-advice's one round, after the timed steps


def ended_together(step: Callable[[], None]) -> Callable[[], None]:
    """The step followed by a barrier across the pipeline ranks, as training loops end a step when they
    reduce the loss or the gradient norm over the stages (torchtitan clips gradients over the PP mesh).
    Without it each rank's ProfilerStep is its own phase of the period (the last stage's starts while
    the first still runs the previous step), and the step's time, the longest of them, reads long. The
    barrier is labelled: the analysis replays it (the last rank's arrival, then each rank's release)."""

    def step_then_barrier() -> None:
        step()
        with record_function(STEP_END_BARRIER):
            dist.barrier()

    return step_then_barrier


def faults_counted(step: Callable[[], None], counts: list[int]) -> Callable[[], None]:
    """The step, appending the minor page faults each call takes to `counts` (runners.heap)."""

    def counting() -> None:
        before = minor_faults()
        step()
        counts.append(minor_faults() - before)

    return counting


def threads_per_rank(ranks_on_node: int) -> int:
    """Share this node's cores fairly among its ranks."""
    return max(1, len(os.sched_getaffinity(0)) // ranks_on_node)


def set_up_torch(ranks_on_node: int) -> None:
    """Flush subnormal floats to zero, then share the cores. A deep stack's gradients underflow into
    subnormals (about a tenth of the first Linear's weight gradient with the cpu preset's 32 layers),
    which many x86 CPUs compute through slow microcode, so the backward's time would depend on the data.
    The flag is per thread: set before the first parallel op, the OpenMP threads inherit it."""
    torch.set_flush_denormal(True)
    torch.set_num_threads(threads_per_rank(ranks_on_node))


def versions(device: torch.device) -> dict:
    nccl = torch.cuda.nccl.version() if device.type == "cuda" else None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "python": sys.version.split()[0],
    }


def run_facts(
    resolved: Resolved, schedule: Schedule, sample_shape: tuple[int, ...], device: torch.device, threads: int
) -> dict:
    """run.json's description of the run (timings are added by the caller)."""
    request, preset = resolved.request, resolved.preset
    # the built-in stack's depth; a custom model's stages are its factory's
    layers = {"layers_per_stage": preset.layers_per_rank // request.v} if request.model is None else {}
    host = host_facts() | ({"gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {})
    streams = {"streams": single_gpu.stream_facts()} if resolved.mode == SINGLE_GPU else {}
    return {
        "schedule": request.schedule,
        "p": request.p,
        "m": request.m,
        "v": request.v,
        "n_stages": schedule.n_stages,
        "engine": request.engine,
        "preset": preset.name,
        "model": request.model,
        "dims": {
            "width": preset.width,
            **layers,
            "sample_shape": list(sample_shape),
            "rows": preset.rows,
            "microbatch_rows": microbatch_rows(preset.rows, request.m),
        },
        "dtype": preset.dtype,
        "device": resolved.device,
        "backend": resolved.backend,
        "mode": resolved.mode,
        **streams,
        **request.mesh.facts(),
        "dp_overlap": request.dp_overlap,
        "threads_per_rank": threads,
        "nodes": dist.get_world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())),
        "profiler": {
            "wait": PROFILER_WAIT,
            "warmup": PROFILER_WARMUP,
            "active": request.steps,
            "profile_memory": request.profile_memory,
        },
        "rows_per_microbatch": request.rows_per_microbatch,  # set: microbatch size fixed, batch = m x it
        "injections": [injection.as_json() for injection in request.injections],
        "versions": versions(device),
        "host": host,
        "git_revision": git_revision(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def gathered(mine: object) -> list:
    """Every global rank's `mine`, in rank order (collective)."""
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def parameter_digests(stages: dict) -> list[str]:
    """Per global rank, a digest of its parameters' bytes (collective): the replicas of a stage agree
    exactly when their gradients were synced, since each pipeline trains on its own batch."""
    flat = torch.cat(
        [p.detach().flatten() for _, stage in sorted(stages.items()) for p in stage.parameters()]
    )
    return gathered(hashlib.sha256(flat.cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16])


def advice_chunks(resolved: Resolved, v: int, stage_ranks: tuple[int, ...], device: torch.device) -> dict:
    """The stages at v chunks per rank these stage ranks calibrate for advice (runners.advice_calibration.chunk_ids),
    each slowed as the run's stage holding its first layer is."""
    request = resolved.request
    n_run, n_chunks = request.p * request.v, request.p * v
    ids = chunk_ids(v, stage_ranks)
    factors = layer_factors(request.injections)
    slowed = {c: factors[c * n_run // n_chunks] for c in ids if c * n_run // n_chunks in factors}
    return rank_stages(replace(resolved, request=replace(request, v=v)), ids, n_chunks, device, slowed)


def run_rank(
    resolved: Resolved, sample_shape: tuple[int, ...], run_dir: Path, heap_kept: bool, complete: bool
) -> None:
    """Everything one rank does once the process group is up (`heap_kept`: runners.heap's settings took;
    `complete`: rank 0 says the run is complete in run.json, rather than its launcher)."""
    request, preset, rank = resolved.request, resolved.preset, dist.get_rank()
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if resolved.device == "cuda"
        else torch.device("cpu")
    )
    schedule = lower(build(request.schedule, request.p, request.m, request.v))
    one_gpu = resolved.mode == SINGLE_GPU
    stage_rank, replica = request.mesh.coordinates(rank)
    stage_ids = tuple(range(schedule.n_stages)) if one_gpu else schedule.stages_of(stage_rank)
    stages = rank_stages(resolved, stage_ids, schedule.n_stages, device, layer_factors(request.injections))
    batch = stage_input(preset, device, sample_shape, seed=replica)
    optimizer = torch.optim.SGD([p for stage in stages.values() for p in stage.parameters()], lr=1e-4)
    meter, run_queue = StashMeter(), RunQueueMeter()
    build_step = single_gpu.build_step if one_gpu else ENGINES[request.engine].step_builder()
    grad_sync = open_grad_sync(request.mesh, resolved.backend, stages, request.m, request.dp_overlap)
    setup = RankSetup(
        resolved, schedule, stage_rank, stages, batch, optimizer, meter, run_queue, replica, grad_sync
    )
    step = ended_together(build_step(setup))
    on_cuda = device.type == "cuda"
    row_counts = calibration_rows(preset.rows, request.m)
    timing = timing_rule(device, CALIBRATION_PROFILED)

    def calibration_session():
        return session(on_cuda, request.profile_memory) if CALIBRATION_PROFILED else contextlib.nullcontext()

    step()  # first step allocates; keep it out of the timings
    reserved = reserve_heap()
    step_ms, rounds, phases = [], [], {"timed_steps": 0.0, "calibration": 0.0, "profiled_steps": 0.0}
    timed_faults, profiled_faults = [], []
    for index in range(request.timed_steps):  # calibration samples beside the steps (runners/measure.py)
        began = time.monotonic()
        step_ms.append(timed_step(faults_counted(step, timed_faults), device))
        calibrating = time.monotonic()
        rounds.append(
            calibration_samples(
                stages,
                batch,
                schedule.n_stages,
                row_counts,
                warmup=index == 0,
                session=calibration_session,
                ranks=request.mesh.pipeline(0),
                timing=timing,
            )
        )
        phases["timed_steps"] += calibrating - began
        phases["calibration"] += time.monotonic() - calibrating
    advice = {}
    if request.calibrate_advice:
        calibrating_ranks = tuple(range(request.p)) if one_gpu else (stage_rank,) if replica == 0 else ()
        began = time.monotonic()
        advice["advice_calibration"] = advice_calibration(
            lambda v: advice_chunks(resolved, v, calibrating_ranks, device),
            batch,
            request.p,
            [v for v in ADVISED_VS if request.model is not None or preset_problem(preset, 1, v) is None],
            row_counts,
            microbatch_rows(preset.rows, request.m)[0],
            ADVICE_REPEATS,
            session=calibration_session,
            ranks=request.mesh.pipeline(0),
            timing=timing,
        )
        phases["advice_calibration"] = time.monotonic() - began
    began = time.monotonic()
    profile_steps(
        faults_counted(step, profiled_faults),
        run_dir / f"rank{rank}.json.gz",
        request.steps,
        on_cuda,
        PROFILER_WAIT,
        PROFILER_WARMUP,
        request.profile_memory,
        meter,
        run_queue,
    )
    dist.barrier()  # every rank's trace is on disk before run.json says complete
    phases["profiled_steps"] = time.monotonic() - began
    heap = gathered(
        {
            "reserve_mb": reserved >> 20,
            "minor_faults_timed_steps": timed_faults,
            "minor_faults_profiled_steps": profiled_faults,
        }
    )
    replicas = {"parameter_digests": parameter_digests(stages)} if request.dp > 1 else {}
    if rank == 0:
        facts = run_facts(resolved, schedule, sample_shape, device, torch.get_num_threads())
        samples_ms = pooled(rounds)
        whole_batch = at_rows(samples_ms, preset.rows)
        write_run_json(
            run_dir,
            facts
            | {
                "calibration": calibration(whole_batch),
                "calibration_samples_ms": whole_batch,
                "calibration_by_rows": calibration_by_rows(samples_ms),
                "calibration_by_rows_samples_ms": samples_ms,
                "calibration_profiled": CALIBRATION_PROFILED,
                "calibration_timing": timing,
                "step_time_unprofiled_ms": statistics.median(step_ms),
                "step_times_unprofiled_ms": step_ms,
                "phases_s": {name: round(seconds, 3) for name, seconds in phases.items()},
                "heap": {"kept": heap_kept, "ranks": heap},
                **advice,
                **replicas,
            },
            complete,
        )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m runners.worker", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument(
        "--virtual-ranks",
        type=whole_number,
        default=None,
        help="run P ranks as streams of this one process's GPU",
    )
    parser.add_argument(
        "--completed-by-launcher",
        action="store_true",
        help="write run.json incomplete: the launcher completes it once torchrun has ended well",
    )
    add_request_arguments(parser)
    args = parser.parse_args(argv)
    die_with_parent()  # a worker whose torchrun died (SIGKILL) stops too
    world, local_world = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    set_up_torch(local_world)  # before any op of the checks below starts torch's threads
    heap_kept = keep_heap()
    try:
        if args.virtual_ranks is None:
            problem = world_problem(world, args.dp)
            if problem:
                raise RequestError(problem)
            resolved = resolve(request_from(args, world // args.dp), torch.cuda.device_count, local_world)
        else:
            resolved = resolve(request_from(args, args.virtual_ranks), torch.cuda.device_count)
            if resolved.mode != SINGLE_GPU or world != 1:
                raise RequestError(
                    f"--virtual-ranks runs P ranks in one process on one GPU; here mode {resolved.mode} "
                    f"with {world} process(es)"
                )
        sample_shape = checked_sample_shape(resolved)
    except RequestError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    device_id = None
    if resolved.device == "cuda":
        device_id = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device_id)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    dist.init_process_group(resolved.backend, timeout=PEER_TIMEOUT, device_id=device_id)
    try:
        run_rank(resolved, sample_shape, args.run_dir, heap_kept, not args.completed_by_launcher)
    finally:
        dist.destroy_process_group()
    return 0


def exit_without_finalizing(code: int) -> None:
    """Exit now, skipping the interpreter's finalization. torch keeps a gloo group's worker threads past
    destroy_process_group, and one may drop the last reference to a finished collective's tensor (the
    all_gather_object of run.json's facts) while the interpreter finalizes: taking the GIL then ends the
    thread, C++ calls std::terminate and the rank dies of SIGABRT after its run was written whole (about
    1 dualpipev run in 13 on 2 cores). Everything the run writes is closed before this point."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_finalizing(main())
