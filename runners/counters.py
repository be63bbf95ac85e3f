"""Names of the counter tracks the runner adds to each rank's trace (torch-free: the analysis reads them).

Each is a Chrome counter event ("ph": "C") on the profiler's clock; the comments name its args.
"""

STASH_COUNTER = "PP stash"  # args: microbatches, activation_bytes (what the executor holds for backward)
CUDA_PEAK_COUNTER = "PP cuda step peak"  # args: peak_bytes_above_step_start (the allocator's, per step)
