"""What a reader of one run's numbers must know before comparing them: its flags and a note for each.

- `contended`: a CPU run with more rank threads (all its pipelines' ranks) than cores takes turns, and
  the wait for a core is measured as slower compute and longer bubbles (cpu_contention says how much).
- `noisy`: its profiled or its unprofiled step times spread, (max - min) / median, beyond
  `Rules.noisy_spread_max`: one step of it says little, and two such runs may differ by that much.
Runs on GPUs, and traces without run.json, are not judged on what they did not record.
"""

from __future__ import annotations

import statistics

from analysis.schema import Noise, Rules


def spread(samples: list[float]) -> float:
    """(max - min) / median; 0 for fewer than two samples."""
    if len(samples) < 2:
        return 0.0
    middle = statistics.median(samples)
    return (max(samples) - min(samples)) / abs(middle) if middle else 0.0


def noise(profiled_ms: list[float], config: dict) -> Noise:
    """The spread of the analysed (profiled) steps and of run.json's unprofiled ones, and what profiling
    cost: the profiled median over the unprofiled one."""
    unprofiled = [t for t in config.get("step_times_unprofiled_ms") or [] if isinstance(t, (int, float))]
    cost = statistics.median(profiled_ms) / statistics.median(unprofiled) if unprofiled else None
    return Noise(
        profiled_spread=spread(profiled_ms),
        unprofiled_spread=spread(unprofiled) if unprofiled else None,
        profiler_cost=cost,
    )


def flags(config: dict, found: Noise, rules: Rules) -> tuple[list[str], list[str]]:
    """The run's flags and one note per flag."""
    raised, notes = [], []
    ranks = config.get("world_size", config.get("p"))  # P x DP: every pipeline's ranks share the cores
    threads, nodes = config.get("threads_per_rank"), config.get("nodes") or 1
    cores = (config.get("host") or {}).get("cpu_count")
    counted = all(isinstance(n, int) for n in (ranks, threads, cores, nodes))
    if config.get("device") == "cpu" and counted and ranks * threads > cores * nodes:
        raised.append("contended")
        notes.append(
            f"{ranks} ranks x {threads} thread(s) on {cores * nodes} cores: ranks take turns, so slowdown and "
            f"the bubble include waiting for a core (cpu_contention); use P x DP <= {cores * nodes} to compare "
            "with the formula"
        )
    spreads = {"profiled": found.profiled_spread, "unprofiled": found.unprofiled_spread}
    wide = {name: s for name, s in spreads.items() if s is not None and s > rules.noisy_spread_max}
    if wide:
        raised.append("noisy")
        said = ", ".join(f"{name} steps spread {s:.0%}" for name, s in wide.items())
        notes.append(
            f"{said} (max - min over median; over {rules.noisy_spread_max:.0%} is flagged): the machine was "
            "busy or unsteady, so compare repeated runs"
        )
    return raised, notes
