"""`python -m analysis hta RUN`: Holistic Trace Analysis's figures of the run beside ours.

Runs HTA on the run's rank traces (analysis.hta.run), writes RUN/hta.json for the report and prints,
per rank, HTA's temporal and idle-time breakdowns and top kernels, ours over the same windows, and one
line on where the two agree and where they differ and why. Where our analysis refuses the traces (no
schedule in them), HTA's figures are printed and written anyway, with the reason ours are missing.

A run without GPU kernels (a CPU run) is refused, exit 2: every HTA breakdown starts from GPU kernels
(on such a trace HTA itself fails with an IndexError), so there is nothing to print or to write, and an
empty hta.json would only make the report show an empty table; a refusal is what make and scripts see.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.errors import InputError
from analysis.hta import compare as hta_compare
from analysis.hta import figures as hta_figures
from analysis.hta import run as hta_run
from analysis.job.run_dir import analysis_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="run directory with GPU rank traces")


def run(args: argparse.Namespace) -> int:
    figures = hta_run.run_hta(args.run_dir)
    written = hta_figures.write(args.run_dir, figures)
    try:
        analysis = analysis_of(args.run_dir)
    except InputError as error:
        analysis, unavailable = None, error
    ranks = [[rank.rank, *(field.value(rank) for field in hta_compare.HTA_FIELDS)] for rank in figures.ranks]
    print(
        f"Holistic Trace Analysis {figures.hta_version}, {len(figures.ranks)} GPU rank trace(s) ({hta_compare.WINDOWS})"
    )
    print(text_table(["rank", *(field.header for field in hta_compare.HTA_FIELDS)], ranks))
    if figures.ranks_without_kernels:
        print(f"  no GPU kernels, left out: rank(s) {', '.join(map(str, figures.ranks_without_kernels))}")
    print("top kernels by time (HTA's kernel breakdown)")
    for rank in figures.ranks:
        for kernel in rank.top_kernels:
            name = hta_figures.short_name(kernel.name)
            print(f"  rank {rank.rank}  {kernel.total_ms:10.3f} ms  {kernel.kernel_type:13s}  {name}")
    if analysis is None:
        print(f"ours: unavailable: {unavailable}")
    else:
        summary = analysis.summary
        ours = hta_compare.ours_beside(analysis)
        print(
            f"ours: {summary.schedule} p={summary.p} m={summary.m}, {summary.steps_analyzed} analysed step(s), "
            f"median step {summary.step_time_ms:.3f} ms"
        )
        rows = [
            [rank, *(field.value(o) for field in hta_compare.OURS_FIELDS)] for rank, o in sorted(ours.items())
        ]
        print(text_table(["rank", *(field.header for field in hta_compare.OURS_FIELDS)], rows))
        print(hta_compare.verdict(figures, ours))
    print(f"written: {written}")
    return 0


def text_table(headers: list[str], rows: list[list]) -> str:
    """Right-aligned columns, each as wide as its header or widest cell."""
    cells = [headers, *([hta_compare.shown(value) for value in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in cells)
