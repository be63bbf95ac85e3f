"""Synthetic pipeline traces with known injected delays: the ground truth the analysis must recover.

Not part of the product: the tests and the benchmarks use it (`python -m synthetic OUT ...` writes a
run directory; `cli`). The tests grade numbers against the independent `executor_*` modules (their own
event-driven replay of the executors, importing neither the analysis nor its replay;
docs/ARCHITECTURE.md section 4). `generate`, built on the analysis's replay, replays a schedule with
chosen durations, p2p latency, launch gaps, small-GEMM and slowdown factors and clock offsets and writes
CPU- or GPU-shaped Kineto traces with the per-rank truth (`truth`: what the injected time is made of,
and the calibration the run.json carries); `shapes` holds the Kineto event shapes (labelled and
unlabelled), `batched` the replay of batch_isend_irecv's coalesced SEND and RECV, `orders` orders no
generator writes, `single_gpu` one process's trace of P ranks as streams of one GPU, `phase_labels` one
rank of a big job in the shape of DeepSeek's DualPipe trace (a framework's phase labels, no `PP:` label),
`noisy` a run whose work varies from step to step, seeded (the pairs of runs `diff` is tested on).
"""

from synthetic.generate import OptionError, Synthetic, check_options, synthesize, write_run
from synthetic.truth import DEFAULT_US, RankTruth, calibration

__all__ = [
    "DEFAULT_US",
    "OptionError",
    "RankTruth",
    "Synthetic",
    "calibration",
    "check_options",
    "synthesize",
    "write_run",
]
