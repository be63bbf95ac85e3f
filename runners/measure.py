"""Timings for run.json: each stage's F and B in isolation at several microbatch sizes (the reference
efficiencies for the analysis) and the step time without the profiler.

Calibration times one microbatch of r rows through one stage, forward then backward, for every r of
runners.presets.calibration_rows (the whole batch, the microbatch sizes of m = 2, 4, ..., 32 and of the
run's own m). Each pass is the executor's own work (runners/execute.py forward_work, backward_work):
the last stage's forward includes the loss, stage 0's backward computes no input gradient, other
stages' do, and a microbatch smaller than the batch adds its weight gradients to ones already there, as
every microbatch of a step but the first does (the whole batch, an m=1 step's only microbatch, starts
from none). An injected host stall is not in it (it is the executor's, not the stage's); an injected
`slow` stage is (it is the stage's own work).

A pass is timed as the analysis measures a cell's busy time (run.json's `calibration_timing`): on a GPU
by CUDA events around it (`cuda_events`: the device's time, close to its kernels'); on CPU, inside a
profiler session, by the union of its operators' spans (`op_union`: OPERATOR_CATEGORY events on its
thread that start inside it, clipped to it, as analysis.cells.labelled.operator_spans reads a cell), so
the host time between operators (Python, dispatch) is left out of both, less the share of the pass
spent runnable but waiting for a core (its run-queue delay, runners.runqueue, sampled at its start and
end and spread evenly over it, the rule by which the analysis takes a cell's cpu_contention out of its
busy time): a cell keeps that wait in busy time and the analysis names it as slowdown's cpu_contention,
so the isolated work it is compared with must not hold the calibration's own wait (on a loaded machine
it doubled a pass's op union); on CPU without a profiler by the wall clock (`wall`, host time and
waits included). Calibration runs one rank at a time, with a barrier between
ranks, so CPU ranks sharing cores do not slow each other down; each rank's turn may run inside a
profiler session with the profiled steps' settings (its trace discarded), so the calibration pays the
profiler's per-op cost as the profiled cells do. It is sampled between the timed steps, just
before the profiled ones, so it sees the machine as the steps did: where its speed drifts (a shared VM),
a calibration taken in one burst before the first step or after the profiled ones times a different
machine from the one the steps ran on, and the whole-batch cells of an m=1 run, which should match it,
do not. With DP > 1 pipelines only the first pipeline's ranks calibrate (its replicas hold the same
stages), so run.json's calibration stays one entry per stage and costs what one pipeline's does.

What `--calibrate-advice` times besides is runners.advice_calibration's.
"""

from __future__ import annotations

import bisect
import contextlib
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
from torch.profiler import record_function

from runners.execute import Forward, WeightWork, backward_work, forward_work, input_work, weight_work
from runners.model import Stage
from runners.runqueue import RunQueueMeter, uncontended_ms
from runners.schedules.trace_names import OPERATOR_CATEGORY

Times = dict[str, list[float]]  # {"F_ms": [...], "B_ms": [...]}
Samples = dict[str, Times]  # stage index text -> times (the whole batch: run.json's calibration)
RowSamples = dict[str, dict[str, Times]]  # stage index text -> microbatch rows text -> times
Session = Callable[[], AbstractContextManager]  # around each rank's turn (a profiler session, or nothing)
Reading = Callable[[], float]  # a pass's time in ms, read once its clock can tell (op_union: at session end)
Clock = Callable[[Callable[[], object]], Reading]  # runs one pass and gives its reading

# run.json's calibration_timing: how each pass was timed
CUDA_EVENTS, OP_UNION, WALL = "cuda_events", "op_union", "wall"
PASS_PREFIX = "calibration pass "  # the op_union clock's span around each pass, in the discarded trace


def time_ms(work: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    work()
    return (time.perf_counter() - began) * 1e3


def timing_rule(device: torch.device, profiled: bool) -> str:
    """How the calibration times a pass on `device`, inside a profiler session or not (module doc)."""
    if device.type == "cuda":
        return CUDA_EVENTS
    return OP_UNION if profiled else WALL


def union_ns(spans: Iterable[tuple[int, int]]) -> int:
    """The length of the union of spans (start, end), as analysis.cells.spans.union merges them: in
    start order a piece opens past the latest end so far (touching spans are one piece)."""
    total, piece = 0, None
    for start, end in sorted(spans):
        if piece is None or start > piece[1]:
            total += 0 if piece is None else piece[1] - piece[0]
            piece = [start, end]
        else:
            piece[1] = max(piece[1], end)
    return total + (0 if piece is None else piece[1] - piece[0])


def op_union_ms(events: Iterable, prefix: str = PASS_PREFIX) -> dict[str, float]:
    """Per user annotation whose name starts with `prefix` among a profiler session's Kineto events, the
    union of its operators' spans in ms: the OPERATOR_CATEGORY events on its thread that start inside it,
    each clipped to its end (analysis.cells.labelled.operator_spans); a span with no operator is all
    work."""
    spans, ops = [], defaultdict(list)
    for event in events:
        if event.activity_type() == OPERATOR_CATEGORY:
            ops[event.start_thread_id()].append((event.start_ns(), event.end_ns()))
        elif event.is_user_annotation() and event.name().startswith(prefix):
            spans.append(event)
    for thread_ops in ops.values():
        thread_ops.sort()
    times = {}
    for span in spans:
        begin, end = span.start_ns(), span.end_ns()
        thread_ops = ops[span.start_thread_id()]
        first = bisect.bisect_left(thread_ops, (begin,))
        last = bisect.bisect_left(thread_ops, (end,))
        inside = [(start, min(stop, end)) for start, stop in thread_ops[first:last]]
        times[span.name()] = (union_ns(inside) if inside else end - begin) / 1e6
    return times


def direct_clock(device: torch.device) -> Clock:
    """CUDA events on a GPU, the wall clock on CPU: the reading is known when the pass returns."""

    def clock(work: Callable[[], object]) -> Reading:
        ms = time_ms(work, device)
        return lambda: ms

    return clock


class OpUnionClock:
    """Each pass inside a span of its own (PASS_PREFIX + its number) in `profiler`'s session; its reading
    is the union of its operators' spans (op_union_ms) less the share of it spent waiting for a core
    (`run_queue` sampled at the pass's start and end, runners.runqueue.uncontended_ms), known once the
    session has ended."""

    def __init__(self, profiler: torch.profiler.profile, run_queue: RunQueueMeter | None = None) -> None:
        self.profiler, self.passes, self.times = profiler, 0, None
        self.run_queue = run_queue or RunQueueMeter()

    def __call__(self, work: Callable[[], object]) -> Reading:
        name = f"{PASS_PREFIX}{self.passes}"
        self.passes += 1
        self.run_queue.sample()
        with record_function(name):
            work()
        self.run_queue.sample()
        return lambda: self.read()[name]

    def read(self) -> dict[str, float]:
        if self.times is None:
            unions = op_union_ms(self.profiler.profiler.kineto_results.events())
            # (time_ns, run delay ns) at each pass's start and end; none where the kernel keeps no schedstat
            ends = self.run_queue.values()
            waits = {
                f"{PASS_PREFIX}{n}": (end[1] - start[1], end[0] - start[0])
                for n, (start, end) in enumerate(zip(ends[::2], ends[1::2]))
            }
            self.times = {
                name: uncontended_ms(ms, *waits[name]) if name in waits else ms for name, ms in unions.items()
            }
        return self.times


def pass_clock(timing: str, device: torch.device, profiler: object) -> Clock:
    """The clock of `timing` (timing_rule) for a rank's turn, given what its session's entry returned."""
    if timing not in (timing_rule(device, profiled=True), timing_rule(device, profiled=False)):
        raise ValueError(f"no {timing} timing on {device}")
    if timing != OP_UNION:
        return direct_clock(device)
    if not isinstance(profiler, torch.profiler.profile):
        raise ValueError(f"{OP_UNION} timing needs a profiler session, not {profiler!r}")
    return OpUnionClock(profiler)


def microbatch_passes(
    stage: Stage,
    rows: torch.Tensor,
    is_first: bool,
    is_last: bool,
    m: int,
    accumulate: bool,
    split: bool = False,
) -> tuple[Callable[[], None], Callable[[], None], dict[str, Callable[[], None]]]:
    """(forward, reset, backward passes by kind) for one microbatch `rows` through `stage`, as the executor
    runs them: forward, then reset (untimed: the state the executor's backward finds), then B, or with
    `split` I then W. m scales the last stage's loss as the executor's does; accumulate: the weight
    gradients exist already."""
    x = rows.detach() if is_first else rows.detach().clone().requires_grad_()
    output_grad = None if is_last else torch.randn_like(rows)  # a stage keeps its input's shape
    held: list[Forward] = []
    pairs: list[WeightWork] = []
    parameters = list(stage.parameters())

    def forward() -> None:
        held.append(Forward(x, *forward_work(stage, x, is_last, m)[:2]))

    def reset() -> None:
        x.grad = None
        for parameter in parameters:
            if not accumulate:
                parameter.grad = None
            elif parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)

    def backward() -> None:
        backward_work(held.pop().output, output_grad)

    def backward_input() -> None:
        pairs.append(input_work(stage, held.pop(), output_grad, is_first)[0])

    def backward_weight() -> None:
        weight_work(pairs.pop())

    passes = {"I_ms": backward_input, "W_ms": backward_weight} if split else {"B_ms": backward}
    return forward, reset, passes


def stage_samples(
    stage: Stage,
    batch: torch.Tensor,
    rows: int,
    is_first: bool,
    is_last: bool,
    repeats: int,
    warmup: bool,
    clock: Clock | None = None,
    split: bool = False,
) -> dict[str, list[Reading]]:
    """F and B (with `split`: I and W) readings of one microbatch of `rows` rows through one stage on
    `clock` (default: direct_clock; after one untimed warm-up if asked: the first pass at a size
    allocates). Leaves the stage's gradients unset, as a step ends."""
    clock = clock or direct_clock(batch.device)
    total = batch.shape[0]
    forward, reset, backward = microbatch_passes(
        stage, batch[:rows], is_first, is_last, max(1, total // rows), rows < total, split
    )
    readings: dict[str, list[Reading]] = {"F_ms": [], **{kind: [] for kind in backward}}
    for _ in range(repeats + warmup):
        readings["F_ms"].append(clock(forward))
        reset()
        for kind, work in backward.items():
            readings[kind].append(clock(work))
    stage.zero_grad(set_to_none=True)
    return {kind: times[warmup:] for kind, times in readings.items()}


def calibration_samples(
    stages: dict[int, Stage],
    batch: torch.Tensor,
    n_stages: int,
    row_counts: tuple[int, ...] | None = None,
    repeats: int = 1,
    warmup: bool = True,
    session: Session | None = None,
    ranks: tuple[int, ...] | None = None,
    timing: str | None = None,
    split: bool = False,
) -> RowSamples:
    """Every stage's F and B (`split`: I and W) samples at every microbatch size (default: the whole
    batch only), measured
    rank after rank (`ranks`, global; default every rank), each rank's turn inside `session`, timed by
    `timing` (timing_rule; default without the profiler's: CUDA events or the wall clock; op_union needs
    a profiler `session`), gathered on every rank (collective: every rank calls it)."""
    row_counts = row_counts or (batch.shape[0],)
    timing = timing or timing_rule(batch.device, profiled=False)
    mine: RowSamples = {}
    for rank in range(dist.get_world_size()) if ranks is None else ranks:
        if rank == dist.get_rank():
            with (session or contextlib.nullcontext)() as profiler:
                clock = pass_clock(timing, batch.device, profiler)
                readings = {
                    str(s): {
                        str(rows): stage_samples(
                            stage, batch, rows, s == 0, s == n_stages - 1, repeats, warmup, clock, split
                        )
                        for rows in row_counts
                    }
                    for s, stage in stages.items()
                }
            mine = {  # read once the session has ended (op_union: its events exist only then)
                stage: {
                    rows: {kind: [read() for read in kinds] for kind, kinds in times.items()}
                    for rows, times in by_rows.items()
                }
                for stage, by_rows in readings.items()
            }
        dist.barrier()
    gathered: list[RowSamples] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, mine)
    return dict(
        sorted(
            ((key, value) for part in gathered for key, value in part.items()), key=lambda item: int(item[0])
        )
    )


def pooled(rounds: list[RowSamples]) -> RowSamples:
    """Several rounds' samples as one."""
    return {
        stage: {
            rows: {kind: [ms for samples in rounds for ms in samples[stage][rows][kind]] for kind in times}
            for rows, times in by_rows.items()
        }
        for stage, by_rows in rounds[0].items()
    }


def medians(times: Times) -> dict[str, float]:
    return {kind: statistics.median(ms) for kind, ms in times.items()}


def calibration_by_rows(samples: RowSamples) -> dict[str, dict[str, dict[str, float]]]:
    """run.json's calibration_by_rows: per stage and microbatch size the median of each kind's samples."""
    return {
        stage: {rows: medians(times) for rows, times in by_rows.items()} for stage, by_rows in samples.items()
    }


def at_rows(samples: RowSamples, rows: int) -> Samples:
    """The samples of one microbatch size, per stage (the whole batch: run.json's calibration_samples_ms)."""
    return {stage: by_rows[str(rows)] for stage, by_rows in samples.items()}


def calibration(samples: Samples) -> dict[str, dict[str, float]]:
    """run.json's calibration: per stage the median of each kind's whole-batch samples."""
    return {stage: medians(times) for stage, times in samples.items()}


def timed_step(step: Callable[[], None], device: torch.device) -> float:
    """One unprofiled step's time in ms: the ranks start together, and the slowest rank's time counts."""
    dist.barrier()
    elapsed = torch.tensor([time_ms(step, device)], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return round(elapsed.item(), 3)
