"""A run request and its validation, done in the launcher before any process starts (torch-free).

Every problem is one line (RequestError); the CLI prints it and exits 2. Device choice: CUDA with NCCL
when there are at least P GPUs, CPU with gloo when there are none. With some GPUs but fewer than P the
run is not moved to CPU (that would measure something else than the user asked for; --device cpu says
so) and NCCL cannot put two ranks on one GPU: the P ranks run as streams of one process on one GPU
instead (mode single_gpu, runners.engines.single_gpu). A worker of a multi-node job, one process per
local rank, still needs a GPU per local rank. With DP > 1 pipelines (runners/mesh.py) the run has
P x DP ranks: on CUDA each needs its own GPU, since the single-GPU mode holds one pipeline; on CPU more
ranks than cores run anyway (they take turns for a core, as P > cores does).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from analysis.traces.limits import available_bytes
from runners.arguments import SWITCH, whole_number
from runners.bounds import limits_problem, memory_problem, steps_problem
from runners.engines import ENGINES
from runners.engines.torch_classes import SPLIT_BACKWARD, TORCH_CLASSES, TORCH_ONLY
from runners.inject import SYNTAX, Injection, InjectionError, injection_problem, parse_injections
from runners.mesh import Mesh, dp_problem
from runners.presets import PRESETS, Preset, preset_problem
from runners.schedules import V_SHAPED, ScheduleError, build, check_request
from runners.schedules.single_gpu import PROCESSES, SINGLE_GPU

DEVICES = ("auto", "cpu", "cuda")
ENTRY_POINT = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")  # package.module:factory


class RequestError(ValueError):
    """A run that cannot start; the message is one line."""


@dataclass(frozen=True)
class RunRequest:
    schedule: str
    p: int
    m: int
    v: int = 1
    engine: str = "native"
    preset: str | None = None  # None: seed on CUDA, cpu otherwise
    steps: int = 3  # profiled steps
    device: str = "auto"
    # unprofiled steps whose median is step_time_unprofiled_ms; each is followed by a calibration sample
    timed_steps: int = 5
    # fixed microbatch size: the batch grows to m x this; None: the preset's batch split m ways
    rows_per_microbatch: int | None = None
    profile_memory: bool = True  # torch.profiler's allocator events ([memory]) in the traces
    injections: tuple[Injection, ...] = ()  # delays injected on purpose (runners/inject.py)
    # package.module:factory building each stage (runners/stage_factory.py); None: the preset's Linear+GELU
    model: str | None = None
    dp: int = 1  # pipelines (data-parallel replicas); the world is p x dp ranks (runners/mesh.py)
    dp_overlap: bool = False  # all-reduce each gradient bucket in the last backward (runners/grad_sync.py)
    # also time what advise would otherwise assume: chunk-sized stages and I, W (runners.advice_calibration)
    calibrate_advice: bool = False

    @property
    def mesh(self) -> Mesh:
        return Mesh(self.p, self.dp)


@dataclass(frozen=True)
class Resolved:
    """A validated request with its choices made."""

    request: RunRequest
    device: str  # cpu | cuda
    backend: str  # gloo | nccl
    preset: Preset
    mode: str = PROCESSES  # PROCESSES: one process (and GPU) per rank; SINGLE_GPU: P streams of one GPU


def choose_device(requested: str, p: int, gpus: int, ranks_per_node: int | None = None) -> str:
    """cpu or cuda for p ranks on a node with `gpus` GPUs. ranks_per_node: a worker of a job that runs
    one process per local rank (it needs a GPU each); None: the launcher, free to run all P ranks in
    one process on one GPU."""
    if requested not in DEVICES:
        raise RequestError(f"unknown device {requested!r}; choose one of {', '.join(DEVICES)}")
    if requested == "cpu" or (requested == "auto" and gpus == 0):
        return "cpu"
    needed = ranks_per_node or p
    if gpus >= needed or (gpus and ranks_per_node is None):
        return "cuda"
    if gpus == 0:
        raise RequestError("--device cuda needs a GPU but this machine has no GPU")
    raise RequestError(
        f"{needed} ranks on this node need {needed} GPUs (one NCCL rank per GPU) but it has {gpus}; "
        f"use {gpus} per node or --device cpu"
    )


def mode_line(resolved: Resolved) -> str | None:
    """What the launcher says of a single_gpu run before it starts; None for one process per rank."""
    if resolved.mode != SINGLE_GPU:
        return None
    return (
        f"mode {SINGLE_GPU}: P={resolved.request.p} ranks as CUDA streams of one process on one GPU "
        "(copies between them); the stages share its SMs and memory bandwidth (run.json: mode, streams)"
    )


SEED_P = 4  # the seed experiment's pipeline: 4 stages


def default_p(requested_device: str, count_gpus: Callable[[], int], cores: int) -> int:
    """P when the user gave none: the seed's 4 on CUDA; on CPU at most one rank per usable core, so the
    first run measures the schedule, not ranks taking turns for a core (P=4 is one option away)."""
    if requested_device != "cpu" and count_gpus() > 0:
        return SEED_P
    return max(1, min(SEED_P, cores))


def choose_preset(name: str | None, device: str) -> Preset:
    name = name or ("seed" if device == "cuda" else "cpu")
    if name not in PRESETS:
        raise RequestError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def resolve(
    request: RunRequest, count_gpus: Callable[[], int], ranks_per_node: int | None = None
) -> Resolved:
    """Check everything a run needs, in the order a user would fix it; raise RequestError on the first one.

    count_gpus (this node's GPUs) is called only when the device is not forced to CPU: it imports torch,
    which a bad request should not wait for. ranks_per_node: a multi-node job needs a GPU per local rank.
    """
    if request.engine not in ENGINES:
        raise RequestError(f"unknown engine {request.engine!r}; choose one of {', '.join(ENGINES)}")
    problem = steps_problem(request.steps, request.timed_steps)
    if problem:
        raise RequestError(problem)
    if request.rows_per_microbatch is not None and request.rows_per_microbatch < 1:
        raise RequestError(f"rows per microbatch must be at least 1, got {request.rows_per_microbatch}")
    if request.schedule in TORCH_ONLY and request.engine != "torch":
        torch_class = TORCH_CLASSES[request.schedule]
        raise RequestError(
            f"{request.schedule} runs only on --engine torch (torch's {torch_class}); "
            f"engine {request.engine!r} does not run it"
        )
    if request.schedule in V_SHAPED and request.v == 1:
        request = replace(request, v=2)  # a V always holds 2 stages per rank; v=1 is the option's default
    try:
        check_request(request.schedule, request.p, request.m, request.v)
    except ScheduleError as error:
        raise RequestError(str(error).splitlines()[0]) from None
    problem = (
        dp_problem(request.dp)
        or overlap_problem(request)
        or limits_problem(request.p, request.m, request.v, request.dp)
    )
    if problem:
        raise RequestError(problem)
    world = request.p * request.dp
    gpus = 0 if request.device == "cpu" else count_gpus()
    device = choose_device(request.device, world, gpus, ranks_per_node)
    mode = SINGLE_GPU if device == "cuda" and gpus < world and ranks_per_node is None else PROCESSES
    if mode == SINGLE_GPU and request.dp > 1:
        raise RequestError(
            f"P={request.p} x DP={request.dp} = {world} ranks need {world} GPUs (one NCCL rank per GPU) but "
            f"this machine has {gpus}; the single-GPU mode holds one pipeline only (DP=1)"
        )
    if mode == SINGLE_GPU and request.engine != "native":
        raise RequestError(
            f"P={request.p} ranks on {gpus} GPU(s) run as streams of one process, which only "
            f"--engine native does; engine {request.engine!r} needs a GPU per rank"
        )
    preset = choose_preset(request.preset, device)
    if request.rows_per_microbatch is not None:
        preset = replace(preset, rows=request.rows_per_microbatch * request.m)
    # a custom model's stages do not split the preset's layers over chunks, so any v suits it
    problem = preset_problem(preset, request.m, request.v if request.model is None else 1)
    if problem:
        raise RequestError(problem)
    resolved = Resolved(request, device, "nccl" if device == "cuda" else "gloo", preset, mode)
    if ranks_per_node is None:  # the launcher, before any process starts (a worker's siblings hold memory)
        processes = 1 if mode == SINGLE_GPU else world
        on_host = device == "cpu" and request.model is None  # a --model's stages are its own, unknown here
        factor = max((int(i.amount) for i in request.injections if i.kind == "slow"), default=1)
        problem = memory_problem(processes, preset, factor if on_host else 0, available_bytes())
        if problem:
            raise RequestError(problem)
    schedule = build(request.schedule, request.p, request.m, request.v)
    problem = injection_problem(
        request.injections, request.p, schedule.n_stages, request.dp
    ) or model_problem(request, schedule.split_backward)
    if problem:
        raise RequestError(problem)
    return resolved


def model_problem(request: RunRequest, split_backward: bool) -> str | None:
    """Why --model cannot run this request (torch-free: the factory itself is checked by
    runners.stage_factory.checked_sample_shape), or None when it can."""
    if request.model is None:
        return None
    if not ENTRY_POINT.fullmatch(request.model):
        return f"--model {request.model!r}: write package.module:factory (a function of an importable module)"
    if split_backward and request.engine == "native":
        return (
            f"--model: {request.schedule} splits each backward into I and W, which the native executor does "
            "from the Linear+GELU stack's own taps only; --engine torch splits any module's backward"
        )
    return None


def overlap_problem(request: RunRequest) -> str | None:
    """Why --dp-overlap cannot apply to this request, or None when it can (or is not asked for)."""
    if not request.dp_overlap:
        return None
    if request.dp == 1:
        return "--dp-overlap overlaps the gradient all-reduce between pipelines, and DP=1 has none"
    if request.engine == "torch" and request.schedule in SPLIT_BACKWARD:
        return (
            f"--dp-overlap needs autograd to accumulate every weight gradient, and torch's "
            f"{TORCH_CLASSES[request.schedule]} assigns them itself; run {request.schedule} without it"
        )
    return None


def add_request_arguments(parser: argparse.ArgumentParser, microbatches: bool = True) -> None:
    """The options a run request needs; shared with the launcher so both read the same request.

    torchrun's own parser takes `--m`/`--v` after the module name for abbreviations of its options, so
    the launcher passes the long spellings (--microbatches, --chunks) to workers.
    """
    parser.add_argument(
        "--sched", required=True, help="gpipe | 1f1b | interleaved | zb; --engine torch adds zbv | dualpipev"
    )
    if microbatches:  # a sweep takes its microbatch counts from --ms instead
        parser.add_argument(
            "--m", "--microbatches", dest="m", type=whole_number, required=True, help="microbatches per step"
        )
    parser.add_argument(
        "--v",
        "--chunks",
        dest="v",
        type=whole_number,
        default=1,
        help="chunks per rank (interleaved; zbv and dualpipev: 2)",
    )
    parser.add_argument(
        "--engine",
        default="native",
        help="; ".join(f"{name}: {engine.description}" for name, engine in ENGINES.items()),
    )
    parser.add_argument(
        "--preset", default=None, help="seed | cpu | tiny (default: seed on CUDA, cpu otherwise)"
    )
    parser.add_argument("--steps", type=whole_number, default=3, help="profiled steps")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument(
        "--timed-steps", type=whole_number, default=5, help="unprofiled steps timed for step_time"
    )
    parser.add_argument(
        "--rows-per-mb",
        dest="rows_per_microbatch",
        type=whole_number,
        default=None,
        help="fix the microbatch size (the batch becomes m x this many rows) instead of the batch",
    )
    parser.add_argument(
        "--no-profile-memory",
        dest="profile_memory",
        action="store_false",
        help="leave torch.profiler's memory events out of the traces",
    )
    parser.add_argument(
        "--inject",
        default=None,
        help=f"delays injected on purpose ({SYNTAX}): host:R:X sleeps X ms before each forward on rank R, "
        "slow:S:K gives stage S K times its layers (--model: K of its modules in a row)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="package.module:factory building each stage (default: the preset's Linear+GELU stack); "
        "e.g. runners.examples.transformer_block:stage",
    )
    parser.add_argument(
        "--dp", type=whole_number, default=1, help="pipelines (data-parallel replicas): P x DP ranks in all"
    )
    parser.add_argument(
        "--dp-overlap",
        **SWITCH,
        help="launch each gradient bucket's all-reduce in the last backward, as DDP does "
        "(default: all buckets after it)",
    )
    parser.add_argument(
        "--calibrate-advice",
        **SWITCH,
        help="also calibrate what `python -m analysis advise` would otherwise assume: the stages at every "
        "advised v (chunks) and the backward split into I and W (run.json advice_calibration)",
    )


def request_from(args: argparse.Namespace, p: int, m: int | None = None) -> RunRequest:
    m = args.m if m is None else m
    try:
        injections = parse_injections(args.inject)
    except InjectionError as error:
        raise RequestError(str(error)) from None
    return RunRequest(
        args.sched,
        p,
        m,
        args.v,
        args.engine,
        args.preset,
        args.steps,
        args.device,
        args.timed_steps,
        args.rows_per_microbatch,
        args.profile_memory,
        injections,
        args.model,
        args.dp,
        args.dp_overlap,
        args.calibrate_advice,
    )
