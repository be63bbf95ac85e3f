"""`python -m runners trace|sweep`: validate the request, run it under torchrun, report where it went.

Bad requests end as one line on stderr and exit 2 before any process starts; a failed run ends as
one line and exit 1, a run stopped by signal N (Ctrl-C, SIGTERM, SIGHUP, to this process, to its
parent or to torchrun) as one line and exit 128 + N, leaving its directory without "complete": true.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from runners.arguments import OneLineParser, whole_number
from runners.launch import LaunchError, launch
from runners.request import (
    SEED_P,
    RequestError,
    Resolved,
    add_request_arguments,
    default_p,
    mode_line,
    request_from,
    resolve,
)
from runners.rundir import LATEST
from runners.stop import die_with_parent

GPU_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")  # NVIDIA, ROCm


def _gpus() -> int:
    """This machine's GPUs; without a GPU driver it is 0 without importing torch (seconds per run)."""
    if not any(Path(path).exists() for path in GPU_DRIVER_PATHS):
        return 0
    import torch

    return torch.cuda.device_count()


def _add_arguments(parser: argparse.ArgumentParser, sweep: bool) -> None:
    add_request_arguments(parser, microbatches=not sweep)
    parser.add_argument(
        "--p",
        type=whole_number,
        default=None,
        help=f"pipeline ranks, one process each (default: {SEED_P} on CUDA, else min({SEED_P}, usable cores))",
    )
    parser.add_argument("--traces", type=Path, default=Path("traces"), help="where run directories go")
    if sweep:
        parser.add_argument("--ms", required=True, help='microbatch counts, e.g. "1 2 4 8"')
    else:
        parser.add_argument(
            "--run-dir-to",
            type=Path,
            help="also write the complete run's directory to this file, one line (make trace passes "
            "/dev/fd/3 and analyses that run, whatever traces/latest points at by then)",
        )


def _step_ms(run_dir: Path) -> float:
    return json.loads((run_dir / "run.json").read_text())["step_time_unprofiled_ms"]


def _p(args: argparse.Namespace) -> int:
    """--p, else the default for this machine, said once."""
    if args.p is not None:
        return args.p
    cores = len(os.sched_getaffinity(0))
    p = default_p(args.device, _gpus, cores)
    if p < SEED_P:
        print(f"P={p}: one rank per usable core ({cores}); --p {SEED_P} (make: P={SEED_P}) runs the seed's 4")
    return p


def _check_model(resolved: Resolved) -> None:
    """--model's stages, built and run on the meta device before any process starts (runners/
    stage_factory.py); it imports torch, so only a run with --model waits for that."""
    if resolved.request.model is not None:
        from runners.stage_factory import checked_sample_shape

        checked_sample_shape(resolved)


def _say_mode(resolved: Resolved) -> None:
    """One line where the run is not one process per rank (single_gpu), before it starts."""
    line = mode_line(resolved)
    if line:
        print(line, flush=True)


def _check_run_dir_to(path: Path | None) -> None:
    """--run-dir-to takes a pipe (make's /dev/fd/3) or a new file in a folder that is there: never a file
    or folder someone has, which is left as it is."""
    if path is not None and (path.is_file() or path.is_dir() or not path.parent.is_dir()):
        raise RequestError(
            f"--run-dir-to {path}: not a pipe or a new file in an existing folder; left as it is"
        )


def trace(args: argparse.Namespace) -> int:
    _check_run_dir_to(args.run_dir_to)
    resolved = resolve(request_from(args, _p(args)), _gpus)
    _check_model(resolved)
    request = resolved.request
    model = f" model={request.model}" if request.model else ""
    print(
        f"running {request.schedule} p={request.p}{f' dp={request.dp}' if request.dp > 1 else ''} m={request.m} "
        f"v={request.v} preset={resolved.preset.name}{model} on {resolved.device} ({resolved.backend}) ...",
        flush=True,
    )
    _say_mode(resolved)
    run_dir = launch(resolved, args.traces)
    latest = args.traces / LATEST
    pointed = (
        f"{latest} points at it" if latest.resolve() == run_dir else f"{latest} is not moved (not a link)"
    )
    print(f"traces: {run_dir} (step {_step_ms(run_dir):.1f} ms unprofiled); {pointed}", flush=True)
    if args.run_dir_to is not None:
        try:
            args.run_dir_to.write_text(f"{run_dir}\n")
        except OSError as error:
            raise RequestError(
                f"--run-dir-to {args.run_dir_to}: cannot write it ({error.strerror})"
            ) from None
    return 0


def microbatch_counts(text: str) -> list[int]:
    try:
        counts = [whole_number(word) for word in text.replace(",", " ").split()]
    except argparse.ArgumentTypeError as error:
        raise RequestError(f"--ms: {error}") from None
    if not counts:
        raise RequestError("--ms is empty")
    return counts


def sweep(args: argparse.Namespace) -> int:
    """One run per m; every request is validated before the first run starts."""
    p = _p(args)
    resolved = [resolve(request_from(args, p, m), _gpus) for m in microbatch_counts(args.ms)]
    for run in resolved:
        _check_model(run)
    _say_mode(resolved[0])
    began = time.monotonic()
    for done, run in enumerate(resolved, start=1):
        run_dir = launch(run, args.traces)
        elapsed = time.monotonic() - began
        eta = elapsed / done * (len(resolved) - done)
        print(
            f"[{done}/{len(resolved)}] m={run.request.m} step={_step_ms(run_dir):.1f} ms  {run_dir.name}  "
            f"elapsed {elapsed:.0f} s, ETA {eta:.0f} s",
            flush=True,
        )
    return 0


def parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m runners", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, function, help_text in (
        ("trace", trace, "run one schedule under the profiler into traces/<run_id>/"),
        ("sweep", sweep, "run `trace` for each microbatch count in --ms"),
    ):
        sub = commands.add_parser(name, help=help_text)
        _add_arguments(sub, sweep=name == "sweep")
        sub.set_defaults(run=function)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    die_with_parent()  # make's SIGTERM ends its recipe's shell, not this process: its run must end too
    try:
        return args.run(args)
    except RequestError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except LaunchError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:  # before or between runs: nothing of a run is running
        print("error: interrupted by SIGINT", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
