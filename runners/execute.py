"""The native executor: runs one rank's lowered action order for one training step.

One dispatch table maps each action kind to a handler (DeepSpeed's instruction -> method idea); each
executed action is wrapped in record_function("PP:<action>") so traces name it in
torch.distributed.pipelining's form. RECV handlers block until the data is there, inside their span,
so waiting for a peer is visible as its own span. Sends are queued as PendingSend values and completed
at the end of the step. Each handler's docstring gives its effect on the StepState in one line, with
s the action's stage and i its microbatch, keys of StepState's dicts. Stage 0 reads its input from
first_inputs. dx(s, i) pops forwards[s, i] and output_grads[s, i] (none on the last stage, whose output
is the loss) and is the gradient of that forward's input. With the next (or previous) stage on the
same rank a tensor goes straight into inputs (output_grads) instead of to_send.

An F's and a B's compute are forward_work and backward_work, which the calibration (runners/measure.py)
times too, so both do the same work: the loss inside the last stage's F, no input gradient for stage 0.
After the last action the step waits for its sends in a WAIT_SENDS span, averages the gradients over
the DP group where there are several pipelines (runners/grad_sync.py), then takes the optimizer step in
its own span. A run-queue meter (runners/runqueue.py) is sampled at the start and end of every
action, inside its span; an injected host stall (runners/inject.py) sleeps at the start of every F.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from runners.grad_sync import GradSync, during_step
from runners.model import Stage, loss_of
from runners.p2p import Links, PendingSend, message_tag
from runners.runqueue import RunQueueMeter
from runners.schedules.actions import Action, Kind
from runners.schedules.trace_names import OPTIMIZER_STEP, WAIT_SENDS, label
from runners.stash import StashMeter

Key = tuple[int, int]  # (stage, microbatch)
# per Linear of a stage: (the module, its input, its output's gradient), what W needs after I
WeightWork = list[tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class StepContext:
    """What stays fixed across steps on one rank."""

    rank: int
    n_stages: int
    rank_of: Callable[[int], int]
    stages: dict[int, Stage]
    links: Links | None  # None when the pipeline has one rank
    # stage 0's input, one piece per microbatch; every activation and gradient between stages has the
    # shape of its microbatch's piece (a stage's output has its input's shape)
    first_inputs: tuple[torch.Tensor, ...]
    host_stall_s: float = 0.0  # slept at the start of every F, inside its span (an injected host stall)
    grad_sync: GradSync | None = None  # DP > 1: the gradients' all-reduce over the replicas of these stages

    @property
    def m(self) -> int:
        return len(self.first_inputs)

    def is_local(self, stage: int) -> bool:
        return self.rank_of(stage) == self.rank


@dataclass(frozen=True)
class Forward:
    """A forward kept for its backward: the stage input, its output (the loss on the last stage), taps."""

    input: torch.Tensor
    output: torch.Tensor
    taps: list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class StepState:
    """Tensors in flight during one step, keyed by (stage, microbatch); empty again when the step ends."""

    inputs: dict[Key, torch.Tensor] = field(default_factory=dict)  # activations for a stage's F
    forwards: dict[Key, Forward] = field(default_factory=dict)  # stashed for B / I
    output_grads: dict[Key, torch.Tensor] = field(default_factory=dict)  # gradients for B / I
    to_send: dict[tuple[Kind, int, int], torch.Tensor] = field(default_factory=dict)  # for SEND_F / SEND_B
    weight_work: dict[Key, WeightWork] = field(default_factory=dict)  # what W needs after I
    pending: list[PendingSend] = field(default_factory=list)

    def leftovers(self) -> list[str]:
        names = ("inputs", "forwards", "output_grads", "to_send", "weight_work")
        return [f"{name}: {sorted(getattr(self, name))}" for name in names if getattr(self, name)]


def forward_work(
    stage: Stage, x: torch.Tensor, last: bool, m: int
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]:
    """An F's compute: what its backward starts from (the output, or on the last stage the loss scaled
    for m microbatches), the Linears' taps, and the activation the next stage gets (None on the last)."""
    output, taps = stage.forward_with_taps(x)
    if last:
        return loss_of(output, m), taps, None
    return output, taps, output.detach()


def backward_work(output: torch.Tensor, output_grad: torch.Tensor | None) -> None:
    """A B's compute: every gradient the graph from the stage's input to `output` asks for (its
    weights', and its input's where the input requires one: not on stage 0)."""
    torch.autograd.backward(output, output_grad)


def forward(ctx: StepContext, state: StepState, action: Action) -> None:
    """Roughly: inputs[s+1, i] or to_send[SEND_F, s, i] = stage_s(inputs.pop((s, i))), kept in forwards."""
    if ctx.host_stall_s:
        time.sleep(ctx.host_stall_s)
    stage, microbatch = action.stage, action.microbatch
    x = ctx.first_inputs[microbatch] if stage == 0 else state.inputs.pop((stage, microbatch))
    output, taps, activation = forward_work(ctx.stages[stage], x, stage == ctx.n_stages - 1, ctx.m)
    state.forwards[(stage, microbatch)] = Forward(x, output, taps)
    if activation is None:
        return
    if ctx.is_local(stage + 1):  # interleaved with p=1: hand over without communication
        state.inputs[(stage + 1, microbatch)] = activation.requires_grad_()
    else:
        state.to_send[(Kind.SEND_F, stage, microbatch)] = activation


def _pass_input_grad(
    ctx: StepContext, state: StepState, stage: int, microbatch: int, grad: torch.Tensor
) -> None:
    if stage == 0:
        return
    if ctx.is_local(stage - 1):
        state.output_grads[(stage - 1, microbatch)] = grad
    else:
        state.to_send[(Kind.SEND_B, stage, microbatch)] = grad


def _output_grad(ctx: StepContext, state: StepState, key: Key) -> torch.Tensor | None:
    """The gradient flowing into a stage's output; None on the last stage, whose output is the loss."""
    return None if key[0] == ctx.n_stages - 1 else state.output_grads.pop(key)


def backward(ctx: StepContext, state: StepState, action: Action) -> None:
    """Roughly: output_grads[s-1, i] or to_send[SEND_B, s, i] = dx(s, i); each weight's .grad += its share."""
    key = (action.stage, action.microbatch)
    stashed = state.forwards.pop(key)
    backward_work(stashed.output, _output_grad(ctx, state, key))
    _pass_input_grad(ctx, state, *key, stashed.input.grad)


def input_work(
    stage: Stage, stashed: Forward, output_grad: torch.Tensor | None, first: bool
) -> tuple[WeightWork, torch.Tensor | None]:
    """An I's compute: the gradients of every Linear's output (what W needs) and of the stage's input
    (None on the first stage, whose input needs none)."""
    targets = [pre_activation for _, pre_activation in stashed.taps]
    if not first:
        targets.append(stashed.input)
    grads = torch.autograd.grad(stashed.output, targets, grad_outputs=output_grad)
    pairs = [(lin, tap[0].detach(), g) for lin, tap, g in zip(stage.linears, stashed.taps, grads)]
    return pairs, None if first else grads[-1]


@torch.no_grad()
def weight_work(pairs: WeightWork, accumulated: Callable[[torch.nn.Parameter], None] | None = None) -> None:
    """A W's compute: weight.grad += grad_out^T @ input per Linear; `accumulated` told of each (written
    outside autograd, so no hook saw it)."""
    for linear, layer_input, grad in pairs:
        weight_grad = grad.flatten(0, -2).T @ layer_input.flatten(0, -2)
        linear.weight.grad = weight_grad if linear.weight.grad is None else linear.weight.grad + weight_grad
        if accumulated is not None:
            accumulated(linear.weight)


def backward_input(ctx: StepContext, state: StepState, action: Action) -> None:
    """Roughly: output_grads[s-1, i] or to_send[SEND_B, s, i] = dx(s, i); weight_work[s, i] = what W needs."""
    key = (action.stage, action.microbatch)
    stashed = state.forwards.pop(key)
    pairs, input_grad = input_work(
        ctx.stages[action.stage], stashed, _output_grad(ctx, state, key), action.stage == 0
    )
    state.weight_work[key] = pairs
    if input_grad is not None:
        _pass_input_grad(ctx, state, *key, input_grad)


def backward_weight(ctx: StepContext, state: StepState, action: Action) -> None:
    """Roughly: weight.grad += grad_out^T @ input for each Linear's pair in weight_work.pop((s, i))."""
    weight_work(
        state.weight_work.pop((action.stage, action.microbatch)),
        None if ctx.grad_sync is None else ctx.grad_sync.accumulated,
    )


def _receive(ctx: StepContext, action: Action, src_stage: int, is_gradient: bool) -> torch.Tensor:
    buffer = torch.empty_like(ctx.first_inputs[action.microbatch])  # the message's shape, dtype, device
    tag = message_tag(src_stage, is_gradient, action.microbatch, ctx.n_stages)
    return ctx.links.recv(buffer, ctx.rank_of(src_stage), tag, is_gradient)


def _send(ctx: StepContext, state: StepState, action: Action, dst_stage: int, is_gradient: bool) -> None:
    tensor = state.to_send.pop((action.kind, action.stage, action.microbatch))
    tag = message_tag(action.stage, is_gradient, action.microbatch, ctx.n_stages)
    state.pending.append(ctx.links.send(tensor, ctx.rank_of(dst_stage), tag, is_gradient))


def send_forward(ctx: StepContext, state: StepState, action: Action) -> None:
    """Roughly: pending += isend(to_send.pop((SEND_F, s, i)), to the rank of stage s+1)."""
    _send(ctx, state, action, action.stage + 1, is_gradient=False)


def send_backward(ctx: StepContext, state: StepState, action: Action) -> None:
    """Roughly: pending += isend(to_send.pop((SEND_B, s, i)), to the rank of stage s-1)."""
    _send(ctx, state, action, action.stage - 1, is_gradient=True)


def recv_forward(ctx: StepContext, state: StepState, action: Action) -> None:
    """Roughly: inputs[s, i] = recv(from the rank of stage s-1), blocking until it has arrived."""
    activation = _receive(ctx, action, action.stage - 1, is_gradient=False)
    state.inputs[(action.stage, action.microbatch)] = activation.requires_grad_()


def recv_backward(ctx: StepContext, state: StepState, action: Action) -> None:
    """Roughly: output_grads[s, i] = recv(from the rank of stage s+1), blocking until it has arrived."""
    state.output_grads[(action.stage, action.microbatch)] = _receive(
        ctx, action, action.stage + 1, is_gradient=True
    )


HANDLERS: dict[Kind, Callable[[StepContext, StepState, Action], None]] = {
    Kind.F: forward,
    Kind.B: backward,
    Kind.I: backward_input,
    Kind.W: backward_weight,
    Kind.SEND_F: send_forward,
    Kind.RECV_F: recv_forward,
    Kind.SEND_B: send_backward,
    Kind.RECV_B: recv_backward,
}


# Actions that stash or free what backward needs; the meter samples inside their spans.
STASHING = (Kind.F, Kind.B, Kind.I, Kind.W)


def run_step(
    ctx: StepContext,
    order: tuple[Action, ...],
    optimizer: torch.optim.Optimizer,
    meter: StashMeter | None = None,
    run_queue: RunQueueMeter | None = None,
) -> None:
    """Execute one rank's order for one step, complete its sends, then take the SGD step."""
    state = StepState()
    sample_run_queue = run_queue.sample if run_queue is not None and run_queue.available else None
    with during_step(ctx.grad_sync):
        for action in order:
            with record_function(label(action)):
                if sample_run_queue:
                    sample_run_queue()
                HANDLERS[action.kind](ctx, state, action)
                if meter is not None and action.kind in STASHING:
                    meter.sample({"forwards": state.forwards, "weight_work": state.weight_work})
                if sample_run_queue:
                    sample_run_queue()
        with record_function(WAIT_SENDS):  # outside the optimizer's span: the sends belong to the schedule
            for send in state.pending:
                send.wait()
    with record_function(OPTIMIZER_STEP):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if state.leftovers():
        raise RuntimeError(
            f"rank {ctx.rank}: step ended with unused tensors ({'; '.join(state.leftovers())})"
        )
