"""`python -m analysis whatif RUN`: the straggler what-if figures of an op-level run -> RUN/whatif.json.

RUN holds `trace-<name>.parquet` and `meta-<name>.yaml` (analysis.traces.oplevel). The figures are the
StragglerAnalysis paper's (analysis.whatif.figures): S, S_stage (by_stage), S_w per replica
(by_dp_rank), S_t (by_optype), M_S and M_W, on the replay of the job's op graph with launch delays
removed; whatif.json holds them with the mean recorded step, its replay and the ideal step (ms).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from analysis.errors import InputError
from analysis.files import write_atomically
from analysis.traces.run_files import WHATIF_FILE
from analysis.whatif.figures import run_whatif


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN", help="a folder with trace-NAME.parquet, meta-NAME.yaml"
    )


def _worst(by: dict[str, float]) -> str:
    key = max(by, key=by.__getitem__)
    return f"{key} ({by[key]:.3f})"


def run(args: argparse.Namespace) -> int:
    found = run_whatif(args.run_dir)
    if found is None:
        raise InputError(args.run_dir, "holds no trace-<name>.parquet with its meta-<name>.yaml")
    target = Path(args.run_dir) / WHATIF_FILE
    write_atomically(target, msgspec.json.format(msgspec.json.encode(found)) + b"\n")
    print(
        f"{found.steps} steps: recorded {found.step_ms:.1f} ms, replayed {found.replay_ms:.1f} ms, "
        f"every op typical {found.ideal_ms:.1f} ms"
    )
    print(f"  S = {found.S:.3f}; M_S = {found.M_S:.3f}, M_W = {found.M_W:.3f}")
    print(
        f"  worst stage {_worst(found.by_stage)}, replica {_worst(found.by_dp_rank)}, op type {_worst(found.by_optype)}"
    )
    print(f"written: {target}")
    return 0
