"""A CPU run of synthetic.executor_sim's steps whose work varies from step to step, as a real machine's
does: the pairs of runs that decide whether `diff` tells a change from noise.

    write_noisy_run(DIR, build("gpipe", 4, 4), seed=1, jitter=0.05, host=HostTime(stalls=...))

Each step is its own simulate_step with every compute action's work (synthetic.truth.Work's measured
time) times a factor drawn uniformly from [1 - jitter, 1 + jitter] by a generator seeded with `seed`:
two seeds are two runs of one configuration. Steps follow each other; each rank's events are
synthetic.executor_events.cpu_rank_events of its step. No truth.json: the per-step truth is
synthetic.executor_trace's.
"""

from __future__ import annotations

import random
from pathlib import Path
from statistics import median

from runners.schedules import Schedule, lower
from synthetic.executor_events import STEP_PREFIX, cpu_rank_events
from synthetic.executor_sim import RENDEZVOUS, HostTime, StepRun, Transport, simulate_step
from synthetic.executor_trace import rank_document, run_config, write_json, write_trace
from synthetic.truth import DEFAULT_US, Durations, Work

METADATA_EVENTS = 2  # cpu_rank_events opens with the process and thread names (shapes.metadata)


def _steps(schedule: Schedule, work: Work, transport, host, seed: int, steps: int, jitter: float):
    rng = random.Random(seed)
    runs: list[StepRun] = []
    for _ in range(steps):
        factors = {
            action: 1 + rng.uniform(-jitter, jitter)
            for order in schedule.orders
            for action in order
            if action.kind.is_compute
        }
        work_ns = lambda action, f=factors: round(work.measured_ns(action, schedule.m) * f[action])  # noqa: E731
        runs.append(simulate_step(schedule, work_ns, transport, host))
    return runs


def write_noisy_run(
    directory: str | Path,
    schedule: Schedule,
    *,
    seed: int,
    jitter: float = 0.05,
    steps: int = 8,
    durations_us: Durations = DEFAULT_US,
    transport: Transport | None = None,
    host: HostTime | None = None,
    run_id: str = "synthetic-noisy",
) -> list[StepRun]:
    """rank{r}.json.gz and run.json (last, with complete); returns each step's simulation."""
    transport = transport or Transport(RENDEZVOUS)
    lowered = schedule if schedule.lowered else lower(schedule)
    work = Work(durations_us)
    runs = _steps(lowered, work, transport, host or HostTime(), seed, steps, jitter)
    starts = [sum(run.step_ns for run in runs[:k]) for k in range(steps)]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(lowered.p):
        events = []
        for k, (run, start) in enumerate(zip(runs, starts)):
            step_events = cpu_rank_events(run, rank, 1, clock_ns=start)
            for event in step_events:
                if event.get("name") == f"{STEP_PREFIX}0":
                    event["name"] = f"{STEP_PREFIX}{k}"
            events += step_events if k == 0 else step_events[METADATA_EVENTS:]
        document = rank_document(
            runs[0], rank, 1, run_id, {"rank": rank, "world_size": lowered.p}, events=events
        )
        write_trace(directory / f"rank{rank}.json.gz", document)
    config = run_config(schedule, work, round(median(run.step_ns for run in runs)), transport, run_id)
    config["step_times_unprofiled_ms"] = [run.step_ns / 1e6 for run in runs]
    write_json(directory / "run.json", config)
    return runs
