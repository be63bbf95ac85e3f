"""The `torch` engine: the same stage model, split and microbatches through torch.distributed.pipelining.

Each rank wraps its Stage modules (runners/model.py, seeded by stage index as for the native engine) in
PipelineStage objects and hands them to torch's schedule class; torch then splits the batch into m
microbatches, runs its own action table and does its own p2p. The loss is the seed's (mean of squares)
and torch's `scale_grads` divides the summed gradients by m, which is what the native engine's loss/m
does, so both engines compute the same step.

With DP > 1 pipelines (runners/mesh.py) each pipeline's stages get their own process group ("pp"; the
default group when there is one pipeline), torch's stage maps stage indices to ranks within it, and
the DP sync (runners/grad_sync.py) runs after torch's step, before the optimizer's. When the sync
overlaps the last backward, the 1/m is in the loss (the native engine's loss_of) instead of torch's
scale_grads, which would divide the gradients after their buckets were launched.

What torch's traces contain differs by class (the analysis reads each form): ScheduleGPipe labels
`Forward i`/`Backward i`, Schedule1F1B labels nothing, the multi-stage runtime labels every action
`PP:<action>` but its RECV only posts the receive; the wait happens inside the consuming F or B.

Injections (runners/inject.py): `slow` is the model's own (the stage holds K times its layers), so it
applies here as in the native engine; a `host` stall is a forward pre-hook on the rank's stage modules,
so it runs inside torch's forward action before the stage's ops (in the F's label where the class writes
one; Schedule1F1B writes none, so there it is host time between ops). torch's action loop cannot be
instrumented from outside, so its traces carry no run-queue counter, and torch waits for its sends
inside its own step, not in a span of ours (the replay has them as the sends' delivery). Its gradient
scaling runs in its own `PP:<stage>REDUCE_GRAD` label, which the analysis counts as work outside the
schedule; the worker's step-end barrier (runners.worker) is labelled for both engines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from runners.engines.protocol import RankSetup
from runners.engines.torch_classes import MULTI_STAGE, TORCH_CLASSES
from runners.grad_sync import GradSync, during_step
from runners.inject import host_stall_ms
from runners.mesh import Mesh
from runners.model import Stage, loss_of
from runners.p2p import PEER_TIMEOUT
from runners.schedules.trace_names import OPTIMIZER_STEP
from runners.stash import SavedMeter, StashMeter

PIPELINE_GROUP = "pp"  # each pipeline's group when there are several (torchtitan's name for the dim)


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The seed's loss for one microbatch; torch's scale_grads supplies the 1/m. target is unused."""
    return output.float().square().mean()


def pipeline_group(mesh: Mesh, backend: str, timeout: timedelta = PEER_TIMEOUT) -> dist.ProcessGroup:
    """This rank's pipeline's group: the default group for one pipeline, else one group per pipeline
    (every rank creates every one, in the same order)."""
    if mesh.dp == 1:
        return dist.group.WORLD
    group, _ = dist.new_subgroups_by_enumeration(
        mesh.pipelines(), timeout=timeout, backend=backend, group_desc=PIPELINE_GROUP
    )
    return group


def build_schedule(
    name: str,
    stages: dict[int, Stage],
    n_stages: int,
    m: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    m_in_loss: bool = False,
) -> torch_schedules.PipelineScheduleSingle | torch_schedules.PipelineScheduleMulti:
    """torch's schedule object for this rank's stages (stage index -> module) over the pipeline's group
    (default: the world). m_in_loss: divide each microbatch's loss by m instead of torch's scale_grads."""
    pipeline_stages = [
        PipelineStage(module, stage_index, n_stages, device, group=group or dist.group.WORLD)
        for stage_index, module in sorted(stages.items())
    ]
    schedule_class = getattr(torch_schedules, TORCH_CLASSES[name])
    loss = (lambda output, _target: loss_of(output, m)) if m_in_loss else _loss
    options = {"loss_fn": loss, "scale_grads": not m_in_loss}
    if name in MULTI_STAGE:
        return schedule_class(pipeline_stages, m, **options)
    (stage,) = pipeline_stages
    return schedule_class(stage, m, **options)


def step_function(
    schedule: torch_schedules.PipelineScheduleSingle | torch_schedules.PipelineScheduleMulti,
    stages: dict[int, Stage],
    n_stages: int,
    batch: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    meter: StashMeter,
    grad_sync: GradSync | None = None,
) -> Callable[[], None]:
    """One training step: torch's schedule over the whole batch, the DP sync if any, then the same SGD
    step as native; what the schedule holds for backward sampled into `meter`."""
    saved = SavedMeter.on(stages, meter)
    inputs = (batch,) if 0 in stages else ()
    # torch splits the target alongside the batch and hands each piece to the loss; ours ignores it.
    target = torch.empty(batch.shape[0], 0, device=batch.device) if n_stages - 1 in stages else None

    def step() -> None:
        saved.begin_step()
        with during_step(grad_sync), torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            schedule.step(*inputs, target=target)
        with torch.profiler.record_function(OPTIMIZER_STEP):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def stall_before_forward(stages: dict[int, Stage], ms: float) -> None:
    """Every forward of these modules through their __call__ (torch's stage calls them so) sleeps ms first.
    The calibration calls forward_with_taps directly, so it does not stall."""

    def stall(_module: torch.nn.Module, _args: tuple) -> None:
        time.sleep(ms / 1e3)

    for module in stages.values():
        module.register_forward_pre_hook(stall)


def build_step(setup: RankSetup) -> Callable[[], None]:
    """This rank's stages under torch's schedule class for the requested schedule name."""
    request = setup.resolved.request
    stall_ms = host_stall_ms(request.injections, setup.global_rank)
    if stall_ms:
        stall_before_forward(setup.stages, stall_ms)
    n_stages = setup.schedule.n_stages
    group = pipeline_group(request.mesh, setup.resolved.backend)
    schedule = build_schedule(
        request.schedule, setup.stages, n_stages, request.m, setup.batch.device, group, request.dp_overlap
    )
    return step_function(
        schedule, setup.stages, n_stages, setup.batch, setup.optimizer, setup.meter, setup.grad_sync
    )
