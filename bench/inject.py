"""Part `inject`: delays injected on purpose (runners/inject.py) against the same run without them.

Each case is run in alternating A/B pairs (without, with the injection) and each figure the injection
should move or leave alone is read from both runs' summaries; a pair's delta is the injected run's
figure minus its baseline's. The part reports each figure's deltas, per pair and as ranges, without a
verdict: tests/test_inject_recovery.py holds the targets (each with the spread this part measured) and
asserts them on the medians of fewer pairs of the same cases.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.schema import Summary
from bench.runs import P, RunPlan, request
from bench.stats import stats
from runners.inject import Injection, parse_injections
from runners.launch import LaunchError, launch


@dataclass(frozen=True)
class Case:
    """One injection and the run it is made on: P=2, gloo on CPU, the native engine."""

    injection: str  # the --inject text
    preset: str
    schedule: str
    m: int

    @property
    def injected(self) -> Injection:
        (one,) = parse_injections(self.injection)
        return one

    def options(self, injected: bool) -> list[str]:
        """`python -m runners trace` options of this case's run with or without its injection (the
        runner's default steps, 3 profiled and 5 timed, as the bench's runs have)."""
        options = f"--sched {self.schedule} --p {P} --m {self.m} --preset {self.preset} --device cpu".split()
        return options + (["--inject", self.injection] if injected else [])


# The stall on the tiny preset: its 4 x 20 ms a step dwarf the rest of a rank's step (~1 ms busy).
HOST = Case("host:0:20", "tiny", "gpipe", 4)
# Four times stage 1's layers on the cpu preset: ~250 ms more work a step, ~90 ms of it imbalance.
SLOW = Case("slow:1:4", "cpu", "gpipe", 4)
CASES = {"host": HOST, "slow": SLOW}


def figures(case: Case, summary: Summary) -> dict[str, float]:
    """The figures `case`'s checks read from one run's summary (ms)."""
    injection = case.injected
    if injection.kind == "host":
        own = summary.rank_entry(injection.target)
        peer = summary.rank_entry((injection.target + 1) % summary.p)
        return {
            "launch_overhead": own.launch_overhead_ms,
            "busy": own.busy_ms,
            "peer_bubble": peer.bubble_ms,
        }
    waterfall = summary.waterfall_ms
    slowed = summary.rank_entry(injection.target)  # P ranks of one stage each: stage S is on rank S
    if slowed.cpu_contention_ms is None:
        raise ValueError(
            f"rank {injection.target} has no run-queue samples: the native CPU runner records them"
        )
    return {
        "imbalance": waterfall.imbalance,
        "small_batches": waterfall.small_batches,
        "interference": waterfall.interference,
        # the slowed rank's own slowdown and the share of it spent waiting for a core: tells a loaded
        # machine's run-queue delay (which grows with the longer stage) from the cells' own excess
        "slowed_rank_slowdown": slowed.slowdown_ms,
        "slowed_rank_cpu_contention": slowed.cpu_contention_ms,
    }


def injected_ms(case: Case, baseline_config: dict) -> float:
    """What the injection adds to a step: host, the stall m times; slow, the stage's work (K - 1) more
    times at full-batch efficiency (its baseline run's calibration)."""
    injection = case.injected
    if injection.kind == "host":
        return case.m * injection.amount
    own = baseline_config["calibration"][str(injection.target)]
    return (injection.amount - 1) * (own["F_ms"] + own["B_ms"])


def recovery(case: Case, baseline: list[tuple[Summary, dict]], injected: list[tuple[Summary, dict]]) -> dict:
    """Pair i is (baseline[i], injected[i]), each a run's summary and run.json: per figure its baseline,
    each pair's delta (ms) and that delta as a share of the pair's injected amount. No verdict: the targets
    are tests/test_inject_recovery.py's, which reads these same figures."""
    amounts = [injected_ms(case, config) for _, config in baseline]
    pairs = [(figures(case, a), figures(case, b)) for (a, _), (b, _) in zip(baseline, injected)]
    deltas = {figure: [b[figure] - a[figure] for a, b in pairs] for figure in pairs[0][0]}
    return {
        "injection": case.injection,
        "preset": case.preset,
        "schedule": case.schedule,
        "p": P,
        "m": case.m,
        "pairs": len(pairs),
        "injected_ms": stats(amounts).to_json(),
        "injected_per_pair_ms": amounts,
        "figures": [
            {
                "figure": figure,
                "baseline_ms": stats([a[figure] for a, _ in pairs]).to_json(),
                "delta_ms": stats(per_pair).to_json(),
                "share": stats([d / x for d, x in zip(per_pair, amounts)]).to_json(),
                "per_pair_ms": per_pair,
            }
            for figure, per_pair in deltas.items()
        ],
    }


def measured(run_dir: Path) -> tuple[Summary, dict]:
    """A run's summary and its run.json, what `recovery` reads of each run."""
    return analyze_pipeline(read_run(run_dir)).summary, json.loads((run_dir / "run.json").read_text())


def _run(plan: RunPlan, case: Case, injected: bool) -> tuple[Summary, dict]:
    inject = case.injection if injected else ""
    wanted = request(replace(plan, preset=case.preset), case.schedule, P, case.m, inject=inject)
    return measured(launch(wanted, plan.traces))


def inject_recovery(plan: RunPlan, pairs: int, progress: Callable[[str], None]) -> dict:
    """Every case in `pairs` alternating A/B pairs (a failed run costs its case, not the others)."""
    results = {}
    for name, case in CASES.items():
        baseline, injected = [], []
        try:
            for done in range(1, pairs + 1):
                baseline.append(_run(plan, case, False))
                injected.append(_run(plan, case, True))
                progress(f"  {name} {case.injection}: pair {done}/{pairs}")
        except LaunchError as error:
            results[name] = {"injection": case.injection, "failed": str(error)}
            progress(f"  {name}: failed: {error}")
            continue
        results[name] = recovery(case, baseline, injected)
    return results
