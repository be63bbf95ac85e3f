"""`python -m analysis report`: reports/index.html and a page per run (analysis.report)."""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.report import build_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", type=Path, default=Path("traces"), help="folder of run directories")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="where index.html goes")


def run(args: argparse.Namespace) -> int:
    index = build_report(args.traces, args.out)
    print(index)
    return 0
