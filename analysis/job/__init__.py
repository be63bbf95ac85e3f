"""A job of one or more pipelines (PP x DP), analysed: its layout (layout: which ranks form each pipeline,
the process groups and what each spans), one pipeline's measurement (measure), the job joined from its
pipelines with its straggler (join), and the run directory in and out (run_dir).
"""
