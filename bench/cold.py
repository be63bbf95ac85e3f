"""What idling costs the next pass: one stage's F and B timed right after each other (as the calibration
times them) and after the thread has slept as long as a bubble (as a pipeline's cell after one).

At m=1 on p=2 every compute cell follows an idle stretch: rank 0's B waits for rank 1's F and B, rank
1's F for rank 0's F. The calibration runs its passes back to back, so whatever the machine charges a
pass for the idle before it (caches refilled, a vCPU or clock woken) lands in slowdown. This measures
that charge outside any pipeline: one process, one thread (a rank's share at P=2 on 2 cores), the
preset's stage 0 doing the executor's own work (runners.measure.microbatch_passes), warm and cold pairs
alternating so that both see the same machine.
"""

from __future__ import annotations

import time

import torch

from bench.stats import stats
from runners.measure import microbatch_passes
from runners.model import build_stages, stage_input
from runners.presets import PRESETS

IDLE_S = 0.05  # about the m=1 bubble of the cpu preset at p=2: the other rank's F and B


def _timed(work) -> float:
    began = time.perf_counter()
    work()
    return (time.perf_counter() - began) * 1e3


def cold_passes(preset_name: str, pairs: int) -> dict:
    """`pairs` warm and cold (F, B) pairs of stage 0 on the whole batch: each pass's time after the
    other pass (warm) or after IDLE_S asleep (cold), and the cold / warm ratio of each pair."""
    preset = PRESETS[preset_name]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stage = build_stages(preset, (0,), 1, torch.device("cpu"))[0]
        batch = stage_input(preset, torch.device("cpu"))
        forward, reset, passes = microbatch_passes(stage, batch, True, False, 1, accumulate=False)
        backward = passes["B_ms"]
        times: dict[str, list[float]] = {"F warm": [], "B warm": [], "F cold": [], "B cold": []}
        for index in range(pairs + 1):  # the first pair allocates: left out
            for temperature in ("warm", "cold"):
                if temperature == "cold":
                    time.sleep(IDLE_S)
                forward_ms = _timed(forward)
                reset()
                if temperature == "cold":
                    time.sleep(IDLE_S)
                backward_ms = _timed(backward)
                if index:
                    times[f"F {temperature}"].append(forward_ms)
                    times[f"B {temperature}"].append(backward_ms)
    finally:
        torch.set_num_threads(threads)
    ratios = {
        kind: stats(
            [cold / warm for cold, warm in zip(times[f"{kind} cold"], times[f"{kind} warm"])]
        ).to_json()
        for kind in ("F", "B")
    }
    return {
        "idle_ms": IDLE_S * 1e3,
        "pairs": pairs,
        "ms": {name: stats(values).to_json() for name, values in times.items()},
        "cold_over_warm": ratios,
    }
