"""P pipeline ranks in one process on one GPU (run.json "mode": "single_gpu"): each virtual rank's
stages on its own CUDA stream, the host issuing every rank's actions in one dependency-respecting
order (runners.schedules.single_gpu: the plan of streams, events and issue order).

Compute actions run the native executor's handlers (runners/execute.py) with the virtual rank's own
StepContext and StepState, on its compute stream, inside the same `PP:` labels, so the trace (one file,
P compute streams) reads as P ranks (analysis.cells.virtual_ranks). A SEND copies the tensor device to
device on the sender's copy stream once the sender's compute stream has produced it; the RECV makes the
receiver's compute stream wait for that copy. Nothing blocks the host, so there is no wait for sends
after the last action. Each virtual rank steps its own optimizer (the worker's, rebuilt over its stages)
on its own stream, as each rank of a multi-GPU run does. The step begins with every stream waiting for
the current one and ends with the current one waiting for every compute stream (the copies end before
the RECVs that wait for them), so CUDA events on the current stream time the whole step.

The streams share the GPU's SMs: torch's green contexts cannot split them (`stream_facts`), so stages
that run at once slow each other down, and the analysis shows that as slowdown. The streams and events
come from the batch's device module (torch.cuda; torch.cpu's stand-ins on CPU, where the tests run the
same step to check what it computes).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any

import torch
from torch.profiler import record_function

from runners.engines.protocol import RankSetup
from runners.execute import HANDLERS, STASHING, StepContext, StepState
from runners.inject import host_stall_ms
from runners.model import split_microbatches
from runners.schedules import Action, Kind, Schedule
from runners.schedules.single_gpu import COMPUTE, COPY, Issue, Stream, issue_plan
from runners.schedules.trace_names import OPTIMIZER_STEP, label
from runners.stash import StashMeter

InFlight = dict[Action, tuple[torch.Tensor, Any]]  # SEND -> its copy and the event recorded after it
Streams = dict[Stream, Any]  # the plan's streams -> the device module's streams


def green_contexts_in_torch() -> bool:
    """Whether this torch can create CUDA green contexts at all (older ones have no such module)."""
    try:
        from torch.cuda.green_contexts import SUPPORTED
    except ImportError:
        return False
    return SUPPORTED


def stream_facts() -> dict:
    """run.json's "streams": how the virtual ranks share the GPU, and why not through green contexts
    (torch's create splits one group of n SMs off the whole device each time: the same n for every
    context, so P of them would crowd every stage onto one share and leave the rest idle)."""
    return {
        "compute": "one CUDA stream per virtual rank",
        "copy": "one CUDA stream per sending virtual rank, ordered by CUDA events",
        "sm_partition": "none: plain streams share every SM",
        "green_contexts_in_torch": green_contexts_in_torch(),
        "why_not_green_contexts": "torch's GreenContext.create(num_sms=n) takes the same first n SMs for "
        "every context, so P contexts would share one set of SMs instead of splitting the GPU",
    }


def _keep_for(tensor: torch.Tensor, stream: Any) -> None:
    """CUDA's caching allocator may hand out a tensor's memory again once it is freed on the host: not
    before `stream`'s work queued so far is done with it (other devices have no such allocator)."""
    if tensor.is_cuda:
        tensor.record_stream(stream)


def send(device: ModuleType, streams: Streams, state: StepState, item: Issue, in_flight: InFlight) -> None:
    """Roughly: in_flight[SEND] = copy of to_send.pop(...) on the sender's copy stream, after its compute."""
    action = item.action
    tensor = state.to_send.pop((action.kind, action.stage, action.microbatch))
    produced = device.Event()
    produced.record(streams[item.after])
    copy_stream = streams[item.stream]
    copy_stream.wait_event(produced)
    with device.stream(copy_stream):
        copied = tensor.clone()
    _keep_for(tensor, copy_stream)
    arrived = device.Event()
    arrived.record(copy_stream)
    in_flight[action] = (copied, arrived)


def receive(streams: Streams, state: StepState, item: Issue, in_flight: InFlight) -> None:
    """Roughly: inputs[s, i] or output_grads[s, i] = in_flight.pop(its SEND), once the copy has arrived."""
    action = item.action
    copied, arrived = in_flight.pop(item.waits_for)
    stream = streams[item.stream]
    stream.wait_event(arrived)
    _keep_for(copied, stream)
    key = (action.stage, action.microbatch)
    if action.kind is Kind.RECV_F:
        state.inputs[key] = copied.requires_grad_()
    else:
        state.output_grads[key] = copied


def run_step(
    device: ModuleType,
    contexts: list[StepContext],
    plan: tuple[Issue, ...],
    streams: Streams,
    optimizers: list[torch.optim.Optimizer],
    meter: StashMeter | None = None,
) -> None:
    """One training step of every virtual rank, issued in `plan`'s order, then each rank's SGD step."""
    states = [StepState() for _ in contexts]
    in_flight: InFlight = {}
    current = device.current_stream()
    began = device.Event()
    began.record(current)
    for stream in streams.values():
        stream.wait_event(began)
    for item in plan:
        action, rank = item.action, item.stream.rank
        with record_function(label(action)):
            if action.kind in (Kind.SEND_F, Kind.SEND_B):
                send(device, streams, states[rank], item, in_flight)
            elif action.kind in (Kind.RECV_F, Kind.RECV_B):
                receive(streams, states[rank], item, in_flight)
            else:
                with device.stream(streams[item.stream]):
                    HANDLERS[action.kind](contexts[rank], states[rank], action)
            if meter is not None and action.kind in STASHING:
                meter.sample({"forwards": states[rank].forwards, "weight_work": states[rank].weight_work})
    for rank, optimizer in enumerate(optimizers):
        stream = streams[Stream(COMPUTE, rank)]
        with device.stream(stream), record_function(OPTIMIZER_STEP):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        current.wait_stream(stream)
    leftovers = [f"rank {rank}: {'; '.join(s.leftovers())}" for rank, s in enumerate(states) if s.leftovers()]
    if leftovers or in_flight:
        raise RuntimeError(
            f"step ended with unused tensors ({', '.join(leftovers)}; in flight: {sorted(in_flight)})"
        )


def rank_optimizers(setup: RankSetup) -> list[torch.optim.Optimizer]:
    """The worker's optimizer, one per virtual rank over that rank's stages, with the same settings."""
    template = setup.optimizer
    return [
        type(template)(
            [
                parameter
                for stage in setup.schedule.stages_of(rank)
                for parameter in setup.stages[stage].parameters()
            ],
            **template.defaults,
        )
        for rank in range(setup.schedule.p)
    ]


def build_step(setup: RankSetup) -> Callable[[], None]:
    """run_step over the whole schedule in this one process; setup.stages holds every stage."""
    schedule: Schedule = setup.schedule
    request = setup.resolved.request
    first_inputs = split_microbatches(setup.batch, request.m)
    contexts = [
        StepContext(
            rank,
            schedule.n_stages,
            schedule.rank_of,
            setup.stages,
            None,
            first_inputs,
            host_stall_ms(request.injections, rank) / 1e3,
        )
        for rank in range(schedule.p)
    ]
    device = getattr(torch, setup.batch.device.type)  # torch.cuda (torch.cpu: the tests)
    streams = {Stream(kind, rank): device.Stream() for kind in (COMPUTE, COPY) for rank in range(schedule.p)}
    return partial(
        run_step, device, contexts, issue_plan(schedule), streams, rank_optimizers(setup), setup.meter
    )
