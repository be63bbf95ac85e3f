"""`python -m analysis <command>`: each command lives in its own module, imported only when used.

Bad input, and a place an output cannot be written, end as one line on stderr and exit code 2 (see
analysis.errors, analysis.files); so does a refused command line; `--debug` shows the traceback. A
stop signal (Ctrl-C, SIGTERM, SIGHUP) ends the command with one line and exit 128 + N, having removed
what it was writing.
Usable input with something dropped or assumed (analysis.errors.TraceWarning) is one `warning:` line
each, its untrusted text escaped as the error's is (analysis.errors.printable). Every command takes the
input limits' flags (analysis.traces.limits: `--max-file-mb` ...) and runs under them; those that analyse
runs take `--jobs N` (analysis.ranks.workers) or `--cluster ADDRESS` (analysis.ranks.cluster). `standalone`
gives the same behaviour to the entry points beside the product (`python -m synthetic`, `python -m bench`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Callable

from analysis.errors import InputError, printable
from analysis.files import cause
from analysis.ranks import cluster, workers
from analysis.traces import limits
from runners.arguments import OneLineParser
from runners.stop import Stopped, stopping

# command -> (module, help). Each module defines add_arguments(parser) and run(args) -> int.
COMMANDS = {
    "analyze": ("analysis.cli.analyze", "analyse one run directory: cells, gaps, summary.json"),
    "merge": ("analysis.cli.merge", "write one Perfetto-loadable trace of all ranks"),
    "predict": (
        "analysis.cli.predict",
        "predict one run's step time and bubble at other m: RUN/predict.json",
    ),
    "advise": (
        "analysis.cli.advise",
        "the schedule, m and v to run at the run's p, predicted from it: RUN/advice.json",
    ),
    "report": ("analysis.cli.report", "build reports/index.html from every run under traces/"),
    "hta": ("analysis.cli.hta", "Holistic Trace Analysis's figures beside ours: RUN/hta.json"),
    "whatif": ("analysis.cli.whatif", "an op-level run's straggler what-if figures: RUN/whatif.json"),
    "diff": ("analysis.cli.diff", "two analysed runs compared: what changed beyond their noise"),
}
# The commands that analyse runs from their files, so take --jobs or --cluster; the merge analyses
# the traces it has loaded already, in its own process.
ANALYSING = frozenset({"analyze", "predict", "advise", "report", "hta", "diff"})


# What `--help` tells a user (the module's docstring above is for whoever works on it).
DESCRIPTION = (
    "Analyse pipeline-parallel training traces (one Chrome trace per rank): `python -m analysis COMMAND "
    "--help` for one command. Bad input ends as one `error:` line and exit code 2 (--debug shows the "
    "traceback); a stop signal ends the command with one line and exit 128 + N, removing what it was "
    "writing. Every command takes the input limits' flags (--max-file-mb ...); those that analyse runs take "
    "--jobs N or --cluster ADDRESS."
)


def _parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=description)
    _add_debug(parser, default=False)
    return parser


def _add_debug(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument(
        "--debug", action="store_true", default=default, help="show tracebacks for input errors"
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser("python -m analysis", DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    # Import only the chosen command's module: a broken or slow module must not tax the others.
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        # also after the command; SUPPRESS keeps a --debug given before it
        _add_debug(sub, default=argparse.SUPPRESS)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            limits.add_arguments(sub)
            if name in ANALYSING:
                engines = sub.add_mutually_exclusive_group()
                workers.add_argument(engines)
                cluster.add_argument(engines)
            sub.set_defaults(run=module.run)
    return _run(parser.parse_args(argv))


def standalone(
    prog: str,
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
) -> int:
    """One command with the analysis CLI's error and warning lines."""
    parser = _parser(prog, description)
    add_arguments(parser)
    parser.set_defaults(run=run)
    return _run(parser.parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    """The command, its warnings as one line each once it has finished (a refused input prints its one
    error line alone: the warnings on the way there were about input that is not used)."""
    pending: list[str] = []

    def one_line(message, category, filename, lineno, file=None, line=None) -> None:
        """A warning as the user's line, not Python's two (file:line and the source line that raised it)."""
        pending.append(f"warning: {printable(message)}")

    with warnings.catch_warnings():
        if not args.debug:
            warnings.showwarning = one_line
        try:
            with (
                stopping(),
                limits.applied(limits.from_arguments(args)),
                workers.applied(getattr(args, "jobs", None)),
                cluster.applied(getattr(args, "cluster", None)),
            ):
                code = args.run(args)
            for line in pending:
                print(line, file=sys.stderr)
            return code
        except InputError as error:
            if args.debug:
                raise
            print(f"error: {error}", file=sys.stderr)
            return 2
        except OSError as error:  # a file system fault no write path named (each names its own)
            if args.debug:
                raise
            print(f"error: {printable(error.filename or '')}: {cause(error)}", file=sys.stderr)
            return 2
        except Stopped as stop:  # Ctrl-C, SIGTERM, SIGHUP: what was being written is removed on the way
            print(f"error: interrupted by {stop.name}", file=sys.stderr)
            return stop.exit_code
