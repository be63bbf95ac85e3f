"""A job of one or more pipelines (PP x DP), analysed: one pipeline's measurement (measure), the job
joined from its pipelines with its straggler (join), and the run directory in and out (run_dir); which
ranks form each pipeline is read with the traces (analysis.traces.layout).
"""
