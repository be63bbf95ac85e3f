"""`python -m analysis diff A B [--json FILE] [--markdown] [--fail-on RULES]`: two analysed runs compared
(analysis.diff), either analysed first where it has no current analysis.

Prints every figure's change, significant first and largest first (or, `--markdown`, a pull-request
comment); `--json FILE` writes diff.json (analysis.diff.output). `--fail-on` (analysis.diff.rules)
exits 1 when a significant change breaks a rule, naming each; bad input exits 2. Every diff is also kept
in B's run directory (RUN/diffs/<A>.json, analysis.diff.stored), where the report finds it and draws
the pair's page; where B's directory is read-only that is a warning, not a failed diff (a CI's gate holds).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from analysis.diff import output, rules
from analysis.diff.compare import diff
from analysis.diff.stored import write_diff
from analysis.errors import TraceWarning
from analysis.files import OutputError
from analysis.job.run_dir import analysis_of
from analysis.traces.run_files import run_in


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path, metavar="A", help="the run before (a run directory)")
    parser.add_argument("b", type=Path, metavar="B", help="the run after")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write diff.json here")
    parser.add_argument("--markdown", action="store_true", help="print a pull-request comment, not the table")
    parser.add_argument(
        rules.FLAG,
        dest="fail_on",
        metavar="RULES",
        help="exit 1 when a significant change breaks one: e.g. step_time:+5%%,p2p_wait:+2ms,"
        "bubble_measured:+0.02, or @FILE with one a line",
    )


def run(args: argparse.Namespace) -> int:
    gate = rules.read_rules(args.fail_on) if args.fail_on is not None else []  # refused before analysing
    a, b = run_in(args.a), run_in(args.b)  # a folder of runs stands for its latest, once
    found = diff(analysis_of(a), analysis_of(b))
    print(output.markdown(found, args.a, args.b) if args.markdown else output.table(found, args.a, args.b))
    if args.json is not None:
        print(f"written: {output.write_json(args.json, found, args.a, args.b)}", file=sys.stderr)
    # stored under the runs' own names, not a link's (traces/latest): the names the report lists them by
    try:
        kept = write_diff(b, output.stored(found, a.resolve(), b.resolve()))
        print(f"stored for the report: {kept}", file=sys.stderr)
    except OutputError as error:
        warnings.warn(f"{error}; the report has no page of this pair", TraceWarning, stacklevel=2)
    breaking = rules.broken(found.changes, gate)
    for rule, change in breaking:
        print(f"fail: {rule.text}: {output.describe(change)}", file=sys.stderr)
    return 1 if breaking else 0
