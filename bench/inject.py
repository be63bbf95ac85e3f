"""Part `inject`: delays injected on purpose (runners/inject.py) against the same run without them.

Each case is run in alternating A/B pairs (without, with the injection) and each figure the injection
should move or leave alone is read from both runs' summaries; a pair's delta is the injected run's
figure minus its baseline's, and a check compares the pairs' deltas with the injected amount. The same
cases and checks are what tests/test_inject_recovery.py asserts, on fewer pairs (medians only).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from analysis.job.measure import analyze_run
from analysis.job.run_dir import read_run
from analysis.schema import Summary
from bench.runs import P, RunPlan, request
from bench.stats import stats, verdict
from runners.inject import Injection, parse_injections
from runners.launch import LaunchError, launch

# Noise bounds of the SLOW case's waterfall terms for a median over 3 pairs, measured on this 2-core VM
# under other work (load average 1.3 to 7): the 95th percentile of |median of 3 deltas - median| drawn
# from 9 measured A/B pairs was 99.7 ms for small_gemm and 101.7 ms for slowdown (their pair deltas ranged
# -78..160 and -67..195 ms: the machine's speed swings up to 2.7x between the calibration and the steps,
# which moves time between the two); imbalance between baselines (A/A, 12 runs) moved 28 ms at the 95th
# percentile. A misattributed slow stage would move ~250 ms (its added work) out of imbalance.
IMBALANCE_NOISE_MS = 30.0
SLOW_TERMS_NOISE_MS = 100.0


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


@dataclass(frozen=True)
class Check:
    """One figure's pair deltas, as `compared(delta_ms, injected_ms)`, against a target."""

    figure: str
    rule: str  # what is compared with the target, for the report
    compared: Callable[[float, float], float]
    target: float
    lower_is_better: bool = True


HOST_CHECKS = (
    # host time inside an action is launch_overhead on CPU: all of the stall, and nothing else
    Check("launch_overhead", "abs(delta / injected - 1)", lambda d, x: abs(d / x - 1), 0.15),
    # the stall is no work: compute + small_gemm + slowdown stay where they were
    Check("compute_parts", "abs(delta) / injected", lambda d, x: abs(d) / x, 0.10),
    # the next rank waits for every stalled forward (gpipe): a producer that has not sent is bubble
    Check("peer_bubble", "delta / injected", lambda d, x: d / x, 0.5, lower_is_better=False),
)
SLOW_CHECKS = (
    # the added work is real and its own calibration has it: it reads as imbalance ...
    Check("imbalance", "delta ms", lambda d, _: d, IMBALANCE_NOISE_MS, lower_is_better=False),
    # ... and not as small-GEMM loss or slowdown, beyond what the same pairs move by noise
    Check("small_gemm", "delta ms", lambda d, _: d, SLOW_TERMS_NOISE_MS),
    Check("slowdown", "delta ms", lambda d, _: d, SLOW_TERMS_NOISE_MS),
)
CHECKS = {"host": HOST_CHECKS, "slow": SLOW_CHECKS}


def figures(case: Case, summary: Summary) -> dict[str, float]:
    """The figures `case`'s checks read from one run's summary (ms)."""
    injection = case.injected
    if injection.kind == "host":
        own = summary.rank_entry(injection.target)
        peer = summary.rank_entry((injection.target + 1) % summary.p)
        return {
            "launch_overhead": own.launch_overhead_ms,
            "compute_parts": own.compute_ms + own.small_gemm_ms + own.slowdown_ms,
            "peer_bubble": peer.bubble_ms,
        }
    waterfall = summary.waterfall_ms
    return {
        "imbalance": waterfall.imbalance,
        "small_gemm": waterfall.small_gemm,
        "slowdown": waterfall.slowdown,
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
    """Pair i is (baseline[i], injected[i]), each a run's summary and run.json: per check the deltas
    (ms), the compared figure against its target and a verdict."""
    amounts = [injected_ms(case, config) for _, config in baseline]
    pairs = [(figures(case, a), figures(case, b)) for (a, _), (b, _) in zip(baseline, injected)]
    checks = []
    for check in CHECKS[case.injected.kind]:
        deltas = [b[check.figure] - a[check.figure] for a, b in pairs]
        compared = stats([check.compared(d, x) for d, x in zip(deltas, amounts)])
        checks.append(
            {
                "figure": check.figure,
                "rule": check.rule,
                "baseline_ms": stats([a[check.figure] for a, _ in pairs]).to_json(),
                "delta_ms": stats(deltas).to_json(),
                "compared": compared.to_json(),
                "target": check.target,
                "lower_is_better": check.lower_is_better,
                "verdict": verdict(compared, check.target, check.lower_is_better),
            }
        )
    return {
        "injection": case.injection,
        "preset": case.preset,
        "schedule": case.schedule,
        "p": P,
        "m": case.m,
        "pairs": len(pairs),
        "injected_ms": stats(amounts).to_json(),
        "checks": checks,
    }


def measured(run_dir: Path) -> tuple[Summary, dict]:
    """A run's summary and its run.json, what `recovery` reads of each run."""
    return analyze_run(read_run(run_dir)).summary, json.loads((run_dir / "run.json").read_text())


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
