"""Each rank on its own: one trace file reduced to the small tables the analysis reads (tables), in a
pool of worker processes (pool; how many: workers), with a progress line for long runs (progress)."""
