"""Reading traces: Kineto Chrome trace files -> one polars event frame per rank, exact integer ns.

In: a trace file (.json, .json.gz, a legacy bare event array) or a run directory of them, with its
run.json. Out: `RawTrace` (the frame plus the undecoded pieces the merge copies verbatim) and
`RunTraces` (every rank of one run, checked to belong together); `memory` reads the traces' memory
events. Bad input is an `analysis.errors.InputError` naming the file.
"""
