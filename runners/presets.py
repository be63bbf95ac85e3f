"""Model presets (torch-free, so the launcher can validate a request without importing torch).

A preset fixes the width, the layers each rank holds, the rows per batch and the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    name: str
    width: int  # D: every Linear is D x D
    layers_per_rank: int  # Linear+GELU pairs one rank holds, split over its v chunks
    rows: int  # rows in the whole batch; microbatches split it
    dtype: str  # torch dtype name


PRESETS = {
    # The seed experiment, for GPUs: 4 stages x 6 layers at width 4096, 8192 rows, bf16.
    "seed": Preset("seed", 4096, 6, 8192, "bfloat16"),
    # The default without GPUs: enough layers that a stage's full-batch F+B dwarfs a gloo hop and the
    # SGD step, so the m=1 bubble measures close to (p-1)/p; small enough that P=4 M=8 runs in seconds.
    "cpu": Preset("cpu", 512, 8, 512, "float32"),
    # For tests: seconds per run, shapes still distinct per stage.
    "tiny": Preset("tiny", 64, 2, 64, "float32"),
}


DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def preset_bytes(preset: Preset) -> int:
    """What one rank's stages hold at most: each layer's weight and its gradient, and, with the whole
    batch in flight (gpipe's stash, the calibration's whole-batch pass), each layer's input and its
    GELU's input for every row."""
    per_layer = 2 * preset.width * preset.width + 2 * preset.rows * preset.width
    return preset.layers_per_rank * per_layer * DTYPE_BYTES[preset.dtype]


def preset_problem(preset: Preset, m: int, v: int) -> str | None:
    """Why this preset cannot run m microbatches with v chunks per rank, or None when it can."""
    if preset.layers_per_rank % v:
        return f"preset {preset.name} has {preset.layers_per_rank} layers per rank; v={v} must divide it"
    if m > preset.rows:
        return (
            f"preset {preset.name} has {preset.rows} rows per batch; "
            f"m={m} microbatches would leave some empty"
        )
    return None


def microbatch_rows(rows: int, m: int) -> list[int]:
    """Rows of each microbatch: as even as possible, the first ones one row larger when m does not divide."""
    base, extra = divmod(rows, m)
    return [base + (i < extra) for i in range(m)]


# The microbatch counts whose microbatch sizes every run calibrates (the run's own m is added): the
# analysis compares a cell with the same work timed in isolation at the cell's own size.
CALIBRATED_MS = (1, 2, 4, 8, 16, 32)

# The chunks per rank `python -m analysis advise` tries by default; `--calibrate-advice` times their stages.
ADVISED_VS = (1, 2, 4)


def calibration_rows(rows: int, m: int) -> tuple[int, ...]:
    """The microbatch sizes to calibrate, largest (the whole batch) first: every size microbatch_rows
    gives for m = 1, 2, 4, ..., 32 and the run's own m, skipping an m with fewer than one row each."""
    sizes = {
        size for count in (*CALIBRATED_MS, m) if rows // count >= 1 for size in microbatch_rows(rows, count)
    }
    return tuple(sorted(sizes, reverse=True))
