"""Your own model: every pipeline stage built by a factory of yours (`--model package.module:factory`).

The contract. `factory(info: StageInfo) -> torch.nn.Module` is called once for each stage a rank holds,
after torch.manual_seed(STAGE_SEED + stage) (so a stage's weights do not depend on the rank layout),
with the stage's index, the number of stages and the preset's width, dtype and device. The module maps
a (rows, *sample_shape) tensor to one of the same shape and dtype: every activation between stages has
that shape, and stage 0 reads a fixed random batch of the preset's rows in it. `sample_shape` is the
module's attribute of that name, (width,) where it has none (a transformer's is (sequence, width)).
Rows are samples: microbatches split them. The last stage's output goes into the seed's loss (the mean
of its squares), and every stage trains its parameters with the run's SGD.

Why one shape for every boundary: it is the built-in stack's contract ((rows, width) throughout), so the
native executor sizes its receive buffers and the calibration its output gradients from the stage-0
microbatch, as they did; and the module, which knows its shape, says it, so the factory keeps one
argument. A model whose boundaries differ (token ids into an embedding on stage 0, logits out of the
last) does not fit: that needs a shape per boundary.

Checked before any process starts, and again by each worker (checked_sample_shape): the module
imports, the factory exists, and on the meta device (no memory, no compute) every stage builds, has
parameters, and maps a microbatch of its sample_shape to one of the same shape and dtype that
backward can start from, each stage's sample_shape being its predecessor's. The first problem is one
line (RequestError), as a bad request is.

What the executors ask of a stage beyond forward. The native executor's F calls forward_with_taps,
which ModuleStage gives any module: its output and no taps. The taps are what the native executor's
split backward needs (W computes each Linear's weight gradient from its input and its output's
gradient, kept by I), so a schedule that splits backwards into I and W (zb) is refused on the native
engine with a custom model (runners.request.model_problem); torch's engine splits any module's backward
(autograd on the stage's input first, its parameters later). `slow:S:K` (runners/inject.py) builds stage
S as K of the factory's modules in a row: K times the work, as K times its layers is for the built-in
stack. The stash counter sees a custom stage's input and output only, not what its autograd graph
saves, so its peak activations read low; the CUDA allocator's step peak counts them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from runners.model import STAGE_SEED, build_stages
from runners.presets import microbatch_rows
from runners.request import RequestError, Resolved
from runners.schedules import build

META = torch.device("meta")


@dataclass(frozen=True)
class StageInfo:
    """What a factory is told about the stage it builds."""

    stage: int  # its index, 0 .. n_stages - 1 (with v chunks per rank, a rank holds several)
    n_stages: int
    width: int  # the preset's width
    dtype: torch.dtype  # the preset's dtype, the batch's and every activation's
    device: torch.device  # where to build it (the meta device while it is checked)


Factory = Callable[[StageInfo], nn.Module]


class ModuleStage(nn.Module):
    """A factory's module with what the native executor and the calibration call: forward_with_taps."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    def forward_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list]:
        """The output and no taps: a split backward is refused for a custom model (the docstring above)."""
        return self.module(x), []


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def load_factory(entry_point: str) -> Factory:
    """The factory `package.module:factory` names (its syntax checked by runners.request.model_problem)."""
    module_name, _, name = entry_point.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module: any import-time failure is a bad request
        raise RequestError(
            f"--model {entry_point}: cannot import {module_name} ({_first_line(error)})"
        ) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise RequestError(f"--model {entry_point}: {module_name} has no function {name}")
    return factory


def _built(factory: Factory, info: StageInfo, entry_point: str) -> nn.Module:
    try:
        module = factory(info)
    except Exception as error:  # the user's factory
        raise RequestError(f"--model {entry_point}: stage {info.stage}: {_first_line(error)}") from None
    if not isinstance(module, nn.Module):
        raise RequestError(
            f"--model {entry_point}: stage {info.stage}'s factory returned {type(module).__name__}, "
            "not a torch.nn.Module"
        )
    return module


def _sample_shape(module: nn.Module, width: int) -> object:
    """The module's sample_shape as a tuple where it is a sequence; anything else as it is, to be refused."""
    sample = getattr(module, "sample_shape", (width,))
    return tuple(sample) if isinstance(sample, (tuple, list)) else sample


def _stage_problem(
    module: nn.Module, sample: object, rows: int, dtype: torch.dtype, first: bool
) -> str | None:
    """Why this stage cannot run in the pipeline (on the meta device), or None when it can. first: stage
    0, whose input asks for no gradient."""
    if not (isinstance(sample, tuple) and sample and all(isinstance(n, int) and n > 0 for n in sample)):
        return f"has sample_shape {sample!r}; it must be a tuple of positive whole numbers"
    if not any(parameter.requires_grad for parameter in module.parameters()):
        return "has no trainable parameters"
    x = torch.empty(rows, *sample, dtype=dtype, device=META, requires_grad=not first)
    shape = tuple(x.shape)
    try:
        output = module(x)
    except Exception as error:  # the user's forward
        return f"cannot take a {shape} {dtype} input ({_first_line(error)})"
    if not isinstance(output, torch.Tensor):
        return f"returned {type(output).__name__} for a {shape} input, not a tensor"
    if (tuple(output.shape), output.dtype) != (shape, dtype):
        return (
            f"maps a {shape} {dtype} input to {tuple(output.shape)} {output.dtype}; every stage's output "
            "must have its input's shape and dtype (the next stage's input)"
        )
    if output.grad_fn is None:
        return "returned an output that backward cannot start from (no autograd graph)"
    return None


def checked_sample_shape(resolved: Resolved) -> tuple[int, ...]:
    """The shape of one sample of every activation: (width,) for the built-in stack; for --model the
    sample_shape its stages agree on, each stage built and run on the meta device first."""
    request, preset = resolved.request, resolved.preset
    if request.model is None:
        return (preset.width,)
    factory = load_factory(request.model)
    n_stages = build(request.schedule, request.p, request.m, request.v).n_stages
    dtype, rows = getattr(torch, preset.dtype), microbatch_rows(preset.rows, request.m)[-1]
    shape: tuple[int, ...] | None = None
    for stage in range(n_stages):
        with META:  # tensors the factory creates without a device land on meta too
            module = _built(factory, StageInfo(stage, n_stages, preset.width, dtype, META), request.model)
        sample = _sample_shape(module, preset.width)
        if shape is not None and sample != shape:
            problem = f"takes samples of shape {sample} but stage {stage - 1} gives {shape}"
        else:
            problem = _stage_problem(module, sample, rows, dtype, first=stage == 0)
        if problem:
            raise RequestError(f"--model {request.model}: stage {stage} {problem}")
        shape = sample
    return shape


def rank_stages(
    resolved: Resolved,
    stage_ids: tuple[int, ...],
    n_stages: int,
    device: torch.device,
    layer_factors: dict[int, int] | None = None,
) -> dict[int, nn.Module]:
    """This rank's stages: the preset's Linear+GELU stack, or --model's factory's seeded by stage index.
    layer_factors: stage -> K, the stage K times heavier (runners/inject.py `slow`): K times its layers,
    or K of the factory's modules in a row."""
    request, preset = resolved.request, resolved.preset
    if request.model is None:
        return build_stages(preset, stage_ids, request.v, device, layer_factors)
    factory = load_factory(request.model)
    dtype = getattr(torch, preset.dtype)
    stages = {}
    for stage in stage_ids:
        torch.manual_seed(STAGE_SEED + stage)
        info = StageInfo(stage, n_stages, preset.width, dtype, device)
        copies = [_built(factory, info, request.model) for _ in range((layer_factors or {}).get(stage, 1))]
        module = copies[0] if len(copies) == 1 else nn.Sequential(*copies)
        stages[stage] = ModuleStage(module.to(device))
    return stages
