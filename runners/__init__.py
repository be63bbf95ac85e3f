"""Run pipeline schedules on p ranks under torch.profiler (see runners/schedules for the pure-data half)."""
