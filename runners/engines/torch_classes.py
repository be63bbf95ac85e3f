"""Which torch.distributed.pipelining class runs each schedule name, by name only: torch-free, so the
launcher can refuse a schedule the chosen engine does not run before torch is imported.

`zb` is torch's ScheduleInterleavedZeroBubble (ZB1P); `zbv` and `dualpipev` place exactly two stages
per rank in a V (rank r holds stages r and 2p-1-r; runners.schedules' "v" placement, which gives the
worker those stages). They run on the torch engine only: the native executor does not run them.
"""

from __future__ import annotations

TORCH_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
MULTI_STAGE = frozenset({"interleaved", "zb", "zbv", "dualpipev"})  # classes taking a list of stages
TORCH_ONLY = frozenset({"zbv", "dualpipev"})  # schedule names only the torch engine runs
# Classes that compute weight gradients outside autograd (torch's stage_backward_weight assigns .grad),
# so no post-accumulate-grad hook sees them final: the DP sync cannot overlap their last backward.
SPLIT_BACKWARD = frozenset({"zb", "zbv", "dualpipev"})
