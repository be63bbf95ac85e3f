"""`python -m synthetic OUT --schedule 1f1b --p 4 --m 8 ...`: write a synthetic run directory
(synthetic.generate) with the analysis CLI's one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.cli import standalone
from analysis.errors import InputError
from runners.schedules import SCHEDULES, ScheduleError, build
from runners.schedules.single_gpu import SINGLE_GPU
from synthetic.data_parallel import write_job
from synthetic.generate import OptionError, write_run
from synthetic.truth import DEFAULT_US


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="run directory to write")
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    parser.add_argument("--p", type=int, default=4, help="pipeline ranks")
    parser.add_argument("--m", type=int, default=8, help="microbatches per step")
    parser.add_argument("--v", type=int, default=1, help="chunks per rank (interleaved)")
    parser.add_argument(
        "--shape",
        choices=("cpu", "gpu", SINGLE_GPU),
        default="cpu",
        help=f"{SINGLE_GPU}: P ranks in one process",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--f-us", type=float, default=DEFAULT_US["F"], help="forward time per microbatch")
    parser.add_argument("--b-us", type=float, default=DEFAULT_US["B"], help="backward time per microbatch")
    parser.add_argument("--p2p-latency-us", type=float, default=0.0)
    parser.add_argument("--launch-gap-us", type=float, default=0.0)
    parser.add_argument(
        "--small-gemm", type=float, default=1.0, help="isolated time / reference time (m > 1)"
    )
    parser.add_argument("--slowdown", type=float, default=1.0, help="measured time / isolated time")
    parser.add_argument("--clock-offset-ms", type=float, nargs="*", default=[], help="one per rank")
    parser.add_argument(
        "--no-labels",
        dest="labels",
        action="store_false",
        help="no PP: labels, only the ops torch records (a hand-written loop; F and B, stage s on rank s)",
    )
    parser.add_argument(
        "--batched", action="store_true", help="GPU, with --no-labels: a SEND and the RECV after it batched"
    )
    parser.add_argument("--dp", type=int, default=1, help="pipelines (data-parallel replicas): P x DP ranks")
    parser.add_argument("--slow-pipeline", type=int, default=0, help="with --dp: the slower replica")
    parser.add_argument("--slow-factor", type=float, default=1.0, help="with --dp: its compute x this")
    parser.add_argument("--sync-us", type=float, default=0.0, help="with --dp: the all-reduce's transfer")


def run(args: argparse.Namespace) -> int:
    if args.steps < 1 or min(args.small_gemm, args.slowdown, args.f_us, args.b_us) <= 0:
        raise InputError(None, "steps must be >= 1 and durations and factors positive")
    if args.clock_offset_ms and len(args.clock_offset_ms) != args.p:
        raise InputError(
            None, f"--clock-offset-ms needs {args.p} values (one per rank), got {len(args.clock_offset_ms)}"
        )
    try:
        schedule = build(args.schedule, args.p, args.m, args.v)
    except ScheduleError as error:
        raise InputError(None, str(error)) from None
    durations = {"F": args.f_us, "B": args.b_us, "I": args.b_us / 2, "W": args.b_us / 2}
    offsets = {r: round(ms * 1e6) for r, ms in enumerate(args.clock_offset_ms)}
    options = {
        "durations_us": durations,
        "p2p_latency_us": args.p2p_latency_us,
        "launch_gap_us": args.launch_gap_us,
        "small_gemm": args.small_gemm,
        "slowdown": args.slowdown,
        "clock_offset_ns": offsets,
        "steps": args.steps,
        "shape": args.shape,
        "run_id": args.out.name,
        "labels": args.labels,
        "batched": args.batched,
    }
    if args.dp < 1 or not 0 <= args.slow_pipeline < args.dp or args.slow_factor <= 0 or args.sync_us < 0:
        raise InputError(
            None, "--dp must be >= 1, --slow-pipeline one of its replicas, --slow-factor positive"
        )
    job = {"slow_pipeline": args.slow_pipeline, "slow_factor": args.slow_factor, "sync_us": args.sync_us}
    try:
        if args.dp == 1:
            result = write_run(args.out, schedule, **options)
        else:
            result = write_job(args.out, schedule, args.dp, **options, **job)
    except OptionError as error:
        raise InputError(None, str(error)) from None
    step_ms = next(iter(result.truth.values())).step_ns / 1e6
    print(
        f"wrote {args.out}: {args.schedule} p={args.p} m={args.m} v={args.v} dp={args.dp} {args.shape}, "
        f"step {step_ms:.3f} ms"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m synthetic", __doc__, add_arguments, run, argv)
