"""What the idle before a pass costs it: stage 0's F and B timed right after each other (as the calibration
times them) and after the idles a pipeline puts before them, with the time by operator name.

At m=1 on p=2 every compute cell but the last stage's B follows an idle stretch: rank 0's B waits in a
gloo recv while rank 1 runs its F and B, rank 1's F in one while rank 0 runs its F. The calibration runs
its passes back to back, so whatever the machine charges a pass for the idle before it lands in
slowdown. This measures that charge outside the pipeline, with two gloo ranks as a P=2 run has them
(runners.worker.set_up_torch: the run's threads per rank and denormal flag), rank 0 doing the
executor's own work for stage 0 (runners.measure.microbatch_passes) inside a profiler session with the
calibration's settings, each pass timed by the union of its operators' spans (busy time's rule) and by
its thread's CPU time (which leaves out time spent waiting for a core). Before each pass, one of:

- back to back: nothing (the calibration);
- asleep: IDLE_S in time.sleep;
- recv, peer idle: IDLE_S in a gloo recv while the peer sleeps (the wait itself, nothing evicted);
- recv, peer works: in a gloo recv while the peer runs stage 1's F and B (the m=1 pipeline's shape);
- cache evicted: no idle, but EVICT_BYTES written first (the peer's work without the wait).

All conditions run in every round, in an order shuffled per round, so that each sees the same machine;
each figure is the median over rounds of its ratio to the same round's back-to-back pass. The first
round allocates and is left out.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import record_function

from bench.stats import stats
from runners.measure import microbatch_passes, op_union_ms
from runners.model import build_stages, stage_input
from runners.presets import PRESETS
from runners.profile import session
from runners.schedules.trace_names import OPERATOR_CATEGORY
from runners.worker import set_up_torch

IDLE_S = 0.05  # about the m=1 bubble of the cpu preset at p=2: the other rank's F and B
EVICT_BYTES = 128 * 2**20  # written to evict the last-level cache: several times any one host's share
BACK_TO_BACK, ASLEEP, PEER_IDLE, PEER_WORKS, EVICTED = (
    "back to back",
    "asleep",
    "recv, peer idle",
    "recv, peer works",
    "cache evicted",
)
CONDITIONS = (BACK_TO_BACK, ASLEEP, PEER_IDLE, PEER_WORKS, EVICTED)
PEER_WAITS = (PEER_IDLE, PEER_WORKS)  # rank 0 waits in a recv that the peer sends after its part
KINDS = ("F", "B")
TOP_OPS = 3  # operator names listed per condition: the largest excess over back to back
ATEN = "aten::"  # the operators listed by name
SPAN = "cold pass "  # each timed pass's span: SPAN + "<round>|<condition>|<kind>"


def _order(round_index: int) -> list[str]:
    """The conditions of one round in an order both ranks derive alike."""
    order = list(CONDITIONS)
    random.Random(round_index).shuffle(order)
    return order


def op_times_ms(events, prefix: str = SPAN) -> dict[str, tuple[float, dict[str, float]]]:
    """Per user annotation starting with `prefix`: the union of its operators' spans in ms (busy time's
    rule, runners.measure.op_union_ms) and each aten operator name's total ms (not autograd's wrappers
    around them; inclusive: a nested operator counts under its own name and inside its caller's)."""
    unions = op_union_ms(events, prefix)
    spans = [e for e in events if e.is_user_annotation() and e.name().startswith(prefix)]
    ops = [e for e in events if e.activity_type() == OPERATOR_CATEGORY and e.name().startswith(ATEN)]
    by_name: dict[str, dict[str, float]] = {span.name(): defaultdict(float) for span in spans}
    for span in spans:
        for op in ops:
            if (
                op.start_thread_id() == span.start_thread_id()
                and span.start_ns() <= op.start_ns() < span.end_ns()
            ):
                by_name[span.name()][op.name()] += (min(op.end_ns(), span.end_ns()) - op.start_ns()) / 1e6
    return {name: (unions[name], dict(by_name[name])) for name in unions}


def _rank(rank: int, preset_name: str, rounds: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    set_up_torch(2)
    preset = PRESETS[preset_name]
    stage = build_stages(preset, (rank,), 1, torch.device("cpu"))[rank]
    batch = stage_input(preset, torch.device("cpu"))
    forward, reset, passes = microbatch_passes(stage, batch, rank == 0, rank == 1, 1, accumulate=False)
    backward = passes["B_ms"]
    token = torch.zeros(1)
    if rank == 1:
        for index in range(rounds):
            for condition in _order(index):
                dist.barrier()
                for _ in KINDS:
                    if condition == PEER_IDLE:
                        time.sleep(IDLE_S)
                    elif condition == PEER_WORKS:
                        forward()
                        reset()
                        backward()
                        stage.zero_grad(set_to_none=True)
                    if condition in PEER_WAITS:
                        dist.send(token, 0)
                        dist.recv(token, 0)  # rank 0's pass is over: the ranks take turns, as at m=1
        dist.destroy_process_group()
        return
    evict = torch.zeros(EVICT_BYTES // 4)
    before: dict[str, Callable[[], object]] = {
        BACK_TO_BACK: lambda: None,
        ASLEEP: lambda: time.sleep(IDLE_S),
        PEER_IDLE: lambda: dist.recv(token, 1),
        PEER_WORKS: lambda: dist.recv(token, 1),
        EVICTED: lambda: evict.add_(1.0),
    }
    cpu_ms: dict[str, float] = {}
    with session(False, False) as profiler:
        for index in range(rounds):
            for condition in _order(index):
                dist.barrier()
                for kind, work in zip(KINDS, (forward, backward)):
                    before[condition]()
                    name = f"{SPAN}{index}|{condition}|{kind}"
                    began = time.thread_time_ns()
                    with record_function(name):
                        work()
                    cpu_ms[name] = (time.thread_time_ns() - began) / 1e6
                    if condition in PEER_WAITS:
                        dist.send(token, 1)
                    if kind == "F":
                        reset()
                stage.zero_grad(set_to_none=True)
    times = op_times_ms(profiler.profiler.kineto_results.events())
    Path(out).write_text(json.dumps({name: [*times[name], cpu_ms[name]] for name in cpu_ms}))
    dist.destroy_process_group()


def _summary(passes: dict[str, list], rounds: int) -> dict:
    """Medians over rounds (the first left out) per condition and kind, and ratios to back to back."""

    def each(condition: str, kind: str) -> list[list]:
        return [passes[f"{SPAN}{index}|{condition}|{kind}"] for index in range(1, rounds)]

    result: dict = {
        "ms": {},
        "cpu_ms": {},
        "over_back_to_back": {},
        "cpu_over_back_to_back": {},
        "op_excess_ms": {},
    }
    for condition in CONDITIONS:
        for key in result:
            result[key][condition] = {}
        for kind in KINDS:
            mine, base = each(condition, kind), each(BACK_TO_BACK, kind)
            result["ms"][condition][kind] = stats([union for union, _, _ in mine]).to_json()
            result["cpu_ms"][condition][kind] = stats([cpu for _, _, cpu in mine]).to_json()
            result["over_back_to_back"][condition][kind] = stats(
                [a[0] / b[0] for a, b in zip(mine, base)]
            ).to_json()
            result["cpu_over_back_to_back"][condition][kind] = stats(
                [a[2] / b[2] for a, b in zip(mine, base)]
            ).to_json()
            names = {name for _, by_name, _ in mine + base for name in by_name}
            excess = {
                name: statistics.median(a[1].get(name, 0.0) - b[1].get(name, 0.0) for a, b in zip(mine, base))
                for name in names
            }
            top = sorted(excess, key=lambda name: -abs(excess[name]))[:TOP_OPS]
            result["op_excess_ms"][condition][kind] = {name: excess[name] for name in top}
    return result


def cold_passes(preset_name: str, pairs: int) -> dict:
    """`pairs` rounds of every condition (module doc) for stage 0 of the preset: per condition and kind
    (F, B) the op-union and CPU ms, their ratios to the same round's back-to-back pass, and the operator
    names with the largest median excess over it."""
    rounds = pairs + 1  # the first round allocates: left out
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "passes.json"
        mp.spawn(_rank, (preset_name, rounds, str(Path(folder) / "store"), str(out)), nprocs=2, join=True)
        passes = json.loads(out.read_text())
    return {"idle_ms": IDLE_S * 1e3, "pairs": pairs, "conditions": list(CONDITIONS)} | _summary(
        passes, rounds
    )
