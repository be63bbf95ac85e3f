"""The bubble by schedule geometry alone: the fraction of a step a rank idles at unit times."""

from __future__ import annotations


def formula_bubble(p: int, m: int, v: int = 1) -> float:
    """(p-1)/(v*m+p-1): p ranks, m microbatches, v chunks per rank (GPipe, 1F1B, interleaved)."""
    return (p - 1) / (v * m + p - 1)
