"""Synthetic pipeline traces with known injected delays: the ground truth the analysis must recover.

Not part of the product: the tests and the benchmarks use it (`python -m synthetic OUT ...` writes a
run directory). `generate` replays a schedule with chosen durations, p2p latency, launch gaps,
slowdowns and clock offsets and writes CPU- or GPU-shaped Kineto traces with the per-rank truth;
`shapes` holds the Kineto event shapes (labelled and unlabelled), `batched` the replay of
batch_isend_irecv's coalesced SEND and RECV.
"""

from synthetic.generate import (
    DEFAULT_US,
    OptionError,
    RankTruth,
    Synthetic,
    calibration,
    check_options,
    synthesize,
    write_run,
)

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
