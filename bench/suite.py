"""`python -m bench`: every benchmark side by side in one run -> bench/results.json, bench/RESULTS.md.

Parts (--only picks some): throughput (ours vs HTA vs typed decoding on a generated trace set),
executor (native vs torch engine), profiler (profiled / unprofiled step), sim (the typical step vs measured
step), seed (the seed's m sweep at p=2 and p=4), bubble (gpipe p=2 m=1 against the formula's 1/2,
repeated, with each rank's slowdown, whole and less its cpu_contention, and what the idle before a
pass costs it: bench/cold.py), inject (injected delays against what the analysis recovers, A/B pairs),
predict (one m=4 run's predicted step at other m against runs there), advice (one gpipe m=4 run's
advice, its top 3 candidates and the start run 3 times each), foreign (advise from the rank traces
alone against the same runs' calibrated advice, measured runs and the synthetic generator's steps), dp
(a synthetic PP x DP job of --dp-mesh ranks analysed, CPU- and GPU-shaped: time, peak RSS, recovery),
ranks (synthetic PP x DP jobs of 8 x --ranks-dp ranks analysed by --jobs 1, --jobs and --cluster
local:N: time and driver memory per rank, same output). profiler, sim and seed read the same p=2 sweep.
A run of some parts replaces their sections of results.json and RESULTS.md and keeps the others'.
Generated traces and runs live in a temporary directory that is deleted at the end (--keep keeps it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from analysis.cli import standalone
from analysis.errors import InputError
from analysis.files import write_atomically
from analysis.traces.run_files import trace_files
from bench.advice import advice_check
from bench.dp_scale import dp_scale
from bench.foreign import foreign_accuracy
from bench.inject import inject_recovery
from bench.predict import prediction_accuracy
from bench.rank_scale import rank_scale
from bench.report import render
from bench.runs import (
    RunPlan,
    executor_overhead,
    m1_bubble,
    profiler_overhead,
    request,
    seed_optimum,
    sweep,
    typical_step_accuracy,
)
from bench.throughput import ThroughputPlan, throughput
from runners.launch import launch
from runners.rundir import REPO_ROOT, git_revision, host_facts

PARTS = (
    "throughput",
    "executor",
    "profiler",
    "sim",
    "seed",
    "bubble",
    "inject",
    "predict",
    "advice",
    "foreign",
    "dp",
    "ranks",
)
SWEEP_PARTS = {"profiler", "sim", "seed"}
# per run of the parts that launch runs: profiled steps, and timed steps (each followed by a calibration round)
PROFILED_STEPS, TIMED_STEPS = 3, 5
PACKAGES = ("torch", "polars", "pyarrow", "msgspec", "isal", "HolisticTraceAnalysis")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts: {', '.join(PARTS)}")
    parser.add_argument(
        "--sizes-mb",
        default="50 140 500 1000",
        help="the throughput ladder: trace set sizes (uncompressed MB) for the fewest ranks, e.g. '50 500'",
    )
    parser.add_argument("--ranks", default="4 8 16", help="rank counts of the throughput sets")
    parser.add_argument(
        "--gzip", action="store_true", help="throughput: the sets written as .json.gz, as our runner writes"
    )
    parser.add_argument(
        "--ranks-mb", type=float, default=140.0, help="the size of the sets of the other rank counts"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="repeats of our analysis and of decoding per size"
    )
    parser.add_argument(
        "--pairs", type=int, default=2, help="native/torch run pairs per executor config (A B A B)"
    )
    parser.add_argument(
        "--hta-timeout", type=float, default=600.0, help="seconds before HTA's load is stopped"
    )
    parser.add_argument(
        "--sources",
        type=Path,
        nargs="+",
        help="run directories to replicate for throughput, one per rank count (default: fresh tiny runs)",
    )
    parser.add_argument(
        "--ms", default=" ".join(map(str, range(1, 17))), help="microbatch counts of the p=2 sweep"
    )
    parser.add_argument("--executor-ms", default="4 8", help="microbatch counts of the native vs torch runs")
    parser.add_argument("--p4-ms", default="1 2 4 8 16", help="microbatch counts of the seed's p=4 sweep")
    parser.add_argument("--bubble-runs", type=int, default=6, help="gpipe p=2 m=1 runs of the bubble part")
    parser.add_argument("--inject-pairs", type=int, default=5, help="A/B pairs per case of the inject part")
    parser.add_argument(
        "--predict-ms", default="1 2 8 16", help="microbatch counts the predict part predicts"
    )
    parser.add_argument(
        "--dp-mesh",
        type=int,
        nargs=2,
        default=(8, 8),
        metavar=("P", "DP"),
        help="the dp part's synthetic job",
    )
    parser.add_argument("--dp-m", type=int, default=16, help="microbatches per step of the dp part's job")
    parser.add_argument(
        "--ranks-dp",
        default="2 8 32",
        help="the ranks part's pipelines per job (8 ranks each): 16, 64, 256 ranks",
    )
    parser.add_argument(
        "--ranks-cluster-workers",
        type=int,
        default=2,
        help="worker processes of the ranks part's LocalCluster",
    )
    parser.add_argument(
        "--predict-repeats", type=int, default=3, help="repeats of the predict part (each: m=4 and every m)"
    )
    parser.add_argument(
        "--advice-repeats", type=int, default=3, help="runs of each configuration the advice part checks"
    )
    parser.add_argument(
        "--foreign-repeats",
        type=int,
        default=3,
        help="runs of each configuration the foreign part advises from",
    )
    parser.add_argument(
        "--preset",
        default="cpu",
        help="model preset of the runs (cpu, or tiny for a smoke run; the inject part's cases name their own)",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "bench", help="where results.json and RESULTS.md go"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated traces and runs")


def _parts(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown or not chosen:
        raise InputError(
            None,
            f"--only: unknown part(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(PARTS)}",
        )
    return [part for part in PARTS if part in chosen]


def _counts(text: str, option: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(word) for word in text.replace(",", " ").split())
    except ValueError:
        raise InputError(None, f"{option} must be whole numbers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise InputError(None, f"{option} needs microbatch counts >= 1, got {text!r}")
    return counts


def machine() -> dict:
    memory_kib = (
        next(
            (
                int(line.split()[1])
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")
            ),
            0,
        )
        if Path("/proc/meminfo").exists()
        else 0
    )
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            None,
        )
        if Path("/proc/cpuinfo").exists()
        else None
    )
    return host_facts() | {
        "cpu": cpu,
        "cores_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory_kib / 2**20, 1),
        "load_average_at_start": os.getloadavg(),
    }


def versions() -> dict:
    found = {}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (every option spelled out)."""
    options = {
        "only": args.only,
        "sizes-mb": args.sizes_mb,
        "ranks": args.ranks,
        "ranks-mb": args.ranks_mb,
        "repeats": args.repeats,
        "pairs": args.pairs,
        "hta-timeout": args.hta_timeout,
        "ms": args.ms,
        "p4-ms": args.p4_ms,
        "executor-ms": args.executor_ms,
        "bubble-runs": args.bubble_runs,
        "inject-pairs": args.inject_pairs,
        "predict-ms": args.predict_ms,
        "predict-repeats": args.predict_repeats,
        "advice-repeats": args.advice_repeats,
        "foreign-repeats": args.foreign_repeats,
        "preset": args.preset,
    }
    command = "python -m bench " + " ".join(
        f"--{key} '{value}'" if " " in str(value) else f"--{key} {value}" for key, value in options.items()
    )
    command += " --gzip" if args.gzip else ""
    # the runs' names only: a committed record names no folder outside the repository
    return command + (" --sources " + " ".join(path.name for path in args.sources) if args.sources else "")


def _progress(began: float) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"[{time.monotonic() - began:6.0f} s] {line}", flush=True)

    return say


def _throughput(args, workdir: Path, say) -> dict:
    """Replicate a run per rank count (given, else a tiny 1f1b run at m = 2p recorded now)."""
    if args.sources:
        sources = {len(trace_files(path)): path.resolve() for path in args.sources}
    else:
        sources = {}
        for p in _counts(args.ranks, "--ranks"):
            say(f"throughput: recording a tiny 1f1b p={p} m={2 * p} run to replicate")
            tiny = RunPlan(workdir / f"source-p{p}", "tiny", 3, 1)
            sources[p] = launch(request(tiny, "1f1b", p, 2 * p), tiny.traces).resolve()
    try:
        sizes = tuple(sorted(float(word) for word in args.sizes_mb.replace(",", " ").split()))
    except ValueError:
        raise InputError(None, f"--sizes-mb must be sizes in MB, got {args.sizes_mb!r}") from None
    plan = ThroughputPlan(
        sources, sizes, args.ranks_mb, args.repeats, args.hta_timeout, workdir, REPO_ROOT, args.gzip
    )
    return throughput(plan, say)


class Record:
    """This run's results and, for each section it finished, how it was measured (its provenance);
    saved after each section, so an interrupted bench keeps what it finished."""

    def __init__(self, command: str, save: Callable[[Record], None]) -> None:
        self.command, self.save = command, save
        self.results: dict = {}
        self.sections: dict[str, dict] = {}

    @contextlib.contextmanager
    def section(self, name: str):
        """Around one section's measurement: the results keys it adds are its own."""
        began, before = time.monotonic(), set(self.results)
        entry = {
            "command": self.command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "git_revision": git_revision(),  # its runs import the tree as it is when they start
            "load_average_at_start": os.getloadavg(),
        }
        yield self.results
        self.sections[name] = entry | {
            "seconds": round(time.monotonic() - began),
            "load_average_at_end": os.getloadavg(),
            "keys": sorted(set(self.results) - before),
        }
        self.save(self)


def measure(args: argparse.Namespace, parts: list[str], workdir: Path, say, record: Record) -> None:
    """Run the chosen parts in order, one section each (profiler and sim share the sweep's)."""
    plan = RunPlan(workdir / "runs", args.preset, PROFILED_STEPS, TIMED_STEPS)
    ms, p4_ms = _counts(args.ms, "--ms"), _counts(args.p4_ms, "--p4-ms")
    executor_ms = _counts(args.executor_ms, "--executor-ms")
    predict_ms = _counts(args.predict_ms, "--predict-ms")
    if "throughput" in parts:
        with record.section("throughput") as results:
            results["throughput"] = _throughput(args, workdir, say)
    if SWEEP_PARTS & set(parts):
        with record.section("sweep") as results:
            say("sweep: p=2, gpipe and 1f1b")
            rows, skipped = sweep(plan, ("gpipe", "1f1b"), 2, ms, say)
            results |= {"sweep": rows, "skipped": skipped}
            if rows:  # every run may have failed (see skipped)
                results |= {"profiler": profiler_overhead(rows), "sim": typical_step_accuracy(rows)}
    if "seed" in parts:
        with record.section("seed") as results:
            say("seed: gpipe p=4 (4 single-threaded ranks on the usable cores)")
            seed_rows = [row for row in results["sweep"] if row["schedule"] == "gpipe"]
            seed_rows += sweep(plan, ("gpipe",), 4, p4_ms, say)[0]
            results["seed"] = {"rows": seed_rows, "optimum_m": seed_optimum(seed_rows)}
    if "bubble" in parts:
        with record.section("bubble") as results:
            say(f"bubble: gpipe p=2 m=1, {args.bubble_runs} runs")
            results["bubble"] = m1_bubble(plan, args.bubble_runs, say)
    if "executor" in parts:
        with record.section("executor") as results:
            say("executor: native vs torch, p=2, A B A B")
            configs = tuple((schedule, m) for schedule in ("gpipe", "1f1b") for m in executor_ms)
            results["executor"] = executor_overhead(plan, configs, args.pairs, say)
    if "inject" in parts:
        with record.section("inject") as results:
            say(f"inject: host stall and slow stage, {args.inject_pairs} A/B pairs each")
            results["inject"] = inject_recovery(plan, args.inject_pairs, say)
    if "predict" in parts:
        with record.section("predict") as results:
            say(
                f"predict: gpipe and 1f1b p=2, m=4 predicted at {args.predict_ms}, {args.predict_repeats} repeats"
            )
            results["predict"] = prediction_accuracy(plan, predict_ms, args.predict_repeats, say)
    if "advice" in parts:
        with record.section("advice") as results:
            say(
                f"advice: gpipe p=2 m=4 advised, the top 3 and the start run {args.advice_repeats} times each"
            )
            results["advice"] = advice_check(plan, args.advice_repeats, say)
    if "foreign" in parts:
        with record.section("foreign") as results:
            say(f"foreign: gpipe and 1f1b p=2 m=4,8 advised without run.json, {args.foreign_repeats} repeats")
            results["foreign"] = foreign_accuracy(plan, args.foreign_repeats, workdir, say)
    if "dp" in parts:
        with record.section("dp") as results:
            p, dp = args.dp_mesh
            results["dp"] = [
                dp_scale(workdir, p, dp, args.dp_m, shape, args.repeats, REPO_ROOT, say)
                for shape in ("cpu", "gpu")
            ]
    if "ranks" in parts:
        with record.section("ranks") as results:
            dps = _counts(args.ranks_dp, "--ranks-dp")
            results["ranks"] = rank_scale(workdir, dps, args.ranks_cluster_workers, REPO_ROOT, say)


def _previous(out: Path, say) -> tuple[dict, str]:
    """The results.json and RESULTS.md that this run adds its sections to (empty where there are none; an
    unreadable results.json is said and left out)."""
    document: dict = {}
    try:
        document = json.loads((out / "results.json").read_text())
    except FileNotFoundError:
        pass
    except ValueError as error:
        say(f"warning: {out / 'results.json'} is not JSON ({error}); its results are not kept")
    text = (out / "RESULTS.md").read_text() if (out / "RESULTS.md").exists() else ""
    return (document if isinstance(document, dict) else {}), text


def merged(previous: dict, record: Record) -> tuple[dict, dict]:
    """(results, provenance by section): the earlier document's with the sections this run finished
    replaced, their results keys included."""
    earlier = previous.get("measured_by", {})
    replaced = {key for name in record.sections for key in earlier.get(name, {}).get("keys", [])}
    finished = {key for entry in record.sections.values() for key in entry["keys"]}
    results = {k: v for k, v in previous.get("results", {}).items() if k not in replaced | finished}
    results |= {k: v for k, v in record.results.items() if k in finished}
    return results, earlier | record.sections


def _writer(
    out: Path, document: dict, began: float, previous: tuple[dict, str]
) -> Callable[[Record, bool], None]:
    """Writes results.json and RESULTS.md (each atomically): the earlier ones with this run's sections so far."""
    earlier, text = previous

    def write(record: Record, complete: bool) -> None:
        out.mkdir(parents=True, exist_ok=True)
        results, measured_by = merged(earlier, record)
        now = document | {
            "results": results,
            "measured_by": measured_by,
            "complete": complete,
            "seconds": round(time.monotonic() - began),
            "load_average_at_end": os.getloadavg(),
        }
        markdown = render(now, record.sections, text)
        for name, data in (("results.json", json.dumps(now, indent=1) + "\n"), ("RESULTS.md", markdown)):
            write_atomically(out / name, data.encode())

    return write


def run(args: argparse.Namespace) -> int:
    parts = _parts(args.only)
    for option, text in (
        ("--ms", args.ms),
        ("--p4-ms", args.p4_ms),
        ("--executor-ms", args.executor_ms),
        ("--predict-ms", args.predict_ms),
    ):
        _counts(text, option)  # refuse bad counts before anything runs
    began = time.monotonic()
    say = _progress(began)
    workdir = Path(tempfile.mkdtemp(prefix="bench."))
    say(f"bench: {', '.join(parts)}; scratch in {workdir}")
    document = {
        "command": _command(args),
        "parts": parts,
        "machine": machine(),
        "versions": versions(),
        "git_revision": git_revision(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write = _writer(args.out, document, began, _previous(args.out, say))
    record = Record(document["command"], lambda finished: write(finished, False))
    try:
        measure(args, parts, workdir, say, record)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    write(record, True)
    say(f"wrote {args.out / 'RESULTS.md'} and {args.out / 'results.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench", __doc__, add_arguments, run, argv)
