"""Which torch.distributed.pipelining class runs each schedule name (torch-free, like runners/request.py).

`zb` is torch's ScheduleInterleavedZeroBubble (ZB1P); `zbv` and `dualpipev` exist for this engine only
and place exactly two stages per rank in a V (rank r holds stages r and 2p-1-r), not round-robin, so
the worker must give them those stages (runners.torch_engine.build_schedule runs them at p=2 on gloo).
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
