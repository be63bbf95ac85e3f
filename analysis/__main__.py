"""`python -m analysis <command>`: each command lives in its own module, imported only when used.

Bad input ends as one line on stderr and exit code 2 (see analysis.errors); `--debug` shows the traceback.
Usable input with something dropped or assumed (analysis.load.TraceWarning) is one `warning:` line each.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from analysis.errors import InputError

# command -> (module, help). Each module defines add_arguments(parser) and run(args) -> int.
COMMANDS = {
    "analyze": ("analysis.summary", "analyse one run directory: cells, gaps, summary.json"),
    "merge": ("analysis.merge", "write one Perfetto-loadable trace of all ranks"),
    "report": ("analysis.report", "build reports/index.html from every run under traces/"),
    "synth": ("analysis.synthetic", "write synthetic Kineto traces with known injected delays"),
    "bench": ("analysis.bench", "measure analysis speed, executor and profiler overhead"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for input errors")
    commands = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    # Import only the chosen command's module: a broken or slow module must not tax the others.
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        if not args.debug:
            warnings.showwarning = _one_line
        return _run(args)


def _one_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the user's line, not Python's two (file:line and the source line that raised it)."""
    print(f"warning: {message}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.run(args)
    except InputError as error:
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
