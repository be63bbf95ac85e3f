"""The stage model of the seed experiment: a stack of Linear(D, D, bias=False) + GELU per stage.

Sizes come from a preset (runners/presets.py). With v chunks per rank the rank's layers are split
evenly over its chunks, so every schedule runs the same model and their step times compare.
"""

from __future__ import annotations

import torch
from torch import nn

from runners.presets import Preset, microbatch_rows

STAGE_SEED = 1337  # stage s's weights come from torch.manual_seed(STAGE_SEED + s), whatever rank holds it


class Stage(nn.Module):
    """One pipeline stage (a chunk, with interleaving): `layers` x (Linear(D, D, bias=False), GELU)."""

    def __init__(self, width: int, layers: int):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_taps(x)[0]

    def forward_with_taps(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The output plus each Linear's (input, output): what a split backward needs for weight gradients."""
        taps = []
        hidden = x
        for linear in self.linears:
            pre_activation = linear(hidden)
            taps.append((hidden, pre_activation))
            hidden = nn.functional.gelu(pre_activation)
        return hidden, taps


def build_stages(
    preset: Preset,
    stage_ids: tuple[int, ...],
    v: int,
    device: torch.device,
    layer_factors: dict[int, int] | None = None,
) -> dict[int, Stage]:
    """This rank's stages, seeded by stage index so a stage's weights do not depend on the rank layout.
    layer_factors: stage -> K, a stage made K times heavier on purpose (runners/inject.py `slow`)."""
    layers = preset.layers_per_rank // v
    stages = {}
    for stage_id in stage_ids:
        torch.manual_seed(STAGE_SEED + stage_id)
        count = layers * (layer_factors or {}).get(stage_id, 1)
        stages[stage_id] = Stage(preset.width, count).to(device=device, dtype=getattr(torch, preset.dtype))
    return stages


def stage_input(
    preset: Preset, device: torch.device, sample_shape: tuple[int, ...] | None = None, seed: int = 0
) -> torch.Tensor:
    """The batch that enters stage 0 (fixed per run, so every step does identical work): preset.rows
    samples of sample_shape each, (width,) unless a custom model says otherwise (runners/stage_factory.py)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    batch = torch.randn(preset.rows, *(sample_shape or (preset.width,)), generator=generator)
    return batch.to(device=device, dtype=getattr(torch, preset.dtype))


def split_microbatches(batch: torch.Tensor, m: int) -> tuple[torch.Tensor, ...]:
    return torch.split(batch, microbatch_rows(batch.shape[0], m))


def loss_of(output: torch.Tensor, m: int) -> torch.Tensor:
    """The seed's loss on the last stage, scaled so m microbatches sum to one batch's loss."""
    return output.float().square().mean() / m
