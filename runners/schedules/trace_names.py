"""The names the runner writes into traces and the analysis reads back: the contract between the halves.

Every executed action runs inside `record_function(label(action))`, torch.distributed.pipelining's
compact form with a `PP:` prefix (`PP:0F3`, `PP:1RECV_B0`; the stage is the global stage). The runner
adds two Chrome counter tracks ("ph": "C") on the profiler's clock; the comments name their args.
"""

from __future__ import annotations

from .actions import Action

LABEL_PREFIX = "PP:"
STASH_COUNTER = "PP stash"  # args: microbatches, activation_bytes (what the executor holds for backward)
CUDA_PEAK_COUNTER = "PP cuda step peak"  # args: peak_bytes_above_step_start (the allocator's, per step)


def label(action: Action) -> str:
    """The trace label of an executed action: `PP:` + its compact form."""
    return f"{LABEL_PREFIX}{action}"
