"""Cells: one row per executed pipeline action (F, B, I, W, SEND_*, RECV_*) of one rank's trace.

In: a rank's event frame (analysis.traces). Out: `RankCells` (cells, the p2p waits inside them, step
windows, GPU kernels, work outside the schedule) from `PP:` labels (`labelled`), from the op stream
where labels are missing (`inferred` on CPU, `inferred_gpu` on GPU, sharing `op_stream`), with
DualPipeV's fused labels cut in two (`fused`); and the schedule the cells executed (`executed`).
"""
