"""A pre-norm transformer block per stage: `--model runners.examples.transformer_block:stage`.

Each sample is a sequence of SEQUENCE tokens of the preset's width, so every activation between stages
is (rows, SEQUENCE, width): the block's `sample_shape`. The block is GPT-2's: x + attention(norm(x)),
then x + MLP(norm(x)), causal self-attention with heads of HEAD_WIDTH features (one head where the
width is smaller) and a 4x GELU MLP. On CPU use the tiny preset (width 64, 64 rows: tens of
milliseconds a stage's forward and backward on one core); the cpu preset's (width 512, 512 rows of 16
tokens) take seconds.
"""

from __future__ import annotations

import torch
from torch import nn

from runners.stage_factory import StageInfo

SEQUENCE = 16  # tokens per sample
HEAD_WIDTH = 64  # features per attention head
MLP_RATIO = 4  # the MLP's hidden width over the model's


class Block(nn.Module):
    def __init__(self, width: int, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.sample_shape = (SEQUENCE, width)
        self.heads = max(1, width // HEAD_WIDTH)
        options = {"device": device, "dtype": dtype}
        self.attention_norm = nn.LayerNorm(width, **options)
        self.qkv = nn.Linear(width, 3 * width, bias=False, **options)
        self.attention_out = nn.Linear(width, width, bias=False, **options)
        self.mlp_norm = nn.LayerNorm(width, **options)
        self.mlp_in = nn.Linear(width, MLP_RATIO * width, bias=False, **options)
        self.mlp_out = nn.Linear(MLP_RATIO * width, width, bias=False, **options)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        rows, tokens, width = x.shape
        qkv = self.qkv(x).view(rows, tokens, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (rows, heads, tokens, head width)
        mixed = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attention_out(mixed.transpose(1, 2).reshape(rows, tokens, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp_out(nn.functional.gelu(self.mlp_in(self.mlp_norm(x))))


def stage(info: StageInfo) -> nn.Module:
    """One block per stage, whatever the stage's place in the pipeline."""
    return Block(info.width, info.device, info.dtype)
