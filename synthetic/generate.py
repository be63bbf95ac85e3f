"""Synthetic pipeline traces with known injected delays: the ground truth the analysis must recover.

    traces, truth = synthesize(build("1f1b", 4, 8), durations_us={"F": 1000, "B": 2000},
                               p2p_latency_us=50, launch_gap_us=10, small_gemm=1.1, slowdown=1.2, shape="gpu")

The lowered schedule is replayed by runners.schedules.simulate with the chosen compute durations (the
reference time x small_gemm x slowdown: synthetic.truth), the p2p latency on every cross-rank edge and
the launch gap before every compute action but a rank's first (a device's step begins with its first
work: idle before that cannot be told from the previous step's); each step is one replay, steps back
to back. Per rank and step the truth splits the step exactly (synthetic.truth.RankTruth); on GPU with
more than one step (one before the last is analysed) the window ends with the next step's host getting
to its first launch, launch_overhead where the rank is idle by then (next_head).
Clock offsets shift a rank's timestamps only, never the truth.

labels=False writes the same run without `PP:` labels, as torch.profiler records a hand-written loop
or torch's Schedule1F1B: the ops of each action instead (synthetic.shapes), with autograd's sequence
numbers; the truth and every kernel, launch and step span are the labelled run's. Only schedules of F
and B with stage s on rank s can be written so (OptionError otherwise).

batched=True (GPU, unlabelled) issues each SEND with the RECV right after it in its rank's order as
torch.distributed.batch_isend_irecv does: one NCCL kernel carries both, from the moment the rank
reached the pair until both halves are done (the received data arrived and the sent data reached its
receiver), and the next action waits for all of it (synthetic.batched replays that; simulate cannot).
The truth of a rank's pair: it idles from reaching the pair until the kernel ends (the launch gap of
the compute after comes on top); that wait is bubble until both partners were ready (the peer had
begun the SEND this RECV takes, and the receiver of this SEND had reached its RECV: both moments are
the start of a kernel of theirs) and p2p_wait after. An unpaired RECV keeps the rule above. So a hop
a batched sender waits for is p2p_wait on the sender as well as on its receiver.

step_ns, when longer than the replay, is the step's length: every rank idles after its last action
until then (synthetic.data_parallel puts the gradient sync there).

shape="single_gpu" writes the same replay as one process of P ranks on one GPU (synthetic.single_gpu):
one trace file, a compute and a copy stream per rank, the truth per virtual rank unchanged.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from dataclasses import asdict, replace
from itertools import accumulate
from pathlib import Path
from typing import Any, NamedTuple

from analysis.files import write_atomically
from analysis.traces.kineto import STEP_PREFIX
from runners.schedules import Action, Kind, Schedule, lower, simulate
from runners.schedules.dependencies import matching_send
from runners.schedules.single_gpu import PROCESSES, SINGLE_GPU
from synthetic import batched as batching
from synthetic import shapes, single_gpu
from synthetic.truth import (
    DEFAULT_US,
    ROWS_PER_MICROBATCH,
    Durations,
    Factors,
    RankTruth,
    Work,
    calibration,
    calibration_by_rows,
    dims,
    rank_truth,
)

BASE_TIME_NS = 1_700_000_000 * 10**9  # written as baseTimeNanoseconds; ts counts from ORIGIN_NS after it
ORIGIN_NS = 10 * 10**9  # leaves room for negative clock offsets
STEP_HEAD_NS = 10_000  # GPU: host time in a step before its first launch (data, zero_grad)


class OptionError(ValueError):
    """Options the generator cannot write (say, labels=False for a schedule a trace without labels
    cannot express); the message says why in one line."""


def check_options(schedule: Schedule, shape: str, labels: bool, batched: bool) -> None:
    """OptionError unless the run can be written with these labels and p2p batching."""
    if shape == SINGLE_GPU and (batched or not labels):
        raise OptionError(
            f"shape {SINGLE_GPU} is written labelled, without batching: one process's stages are told apart "
            "by their PP labels, and its p2p is copies, not NCCL"
        )
    if batched and (labels or shape != "gpu"):
        raise OptionError(
            "batched p2p is written GPU-shaped and unlabelled only (shape='gpu', labels=False): "
            "batch_isend_irecv is NCCL's, and a PP label per action would have no kernel of its own"
        )
    if labels:
        return
    kinds = {a.kind for order in schedule.orders for a in order if a.kind.is_compute}
    if not kinds <= {Kind.F, Kind.B}:
        raise OptionError(
            f"{schedule.name}: an unlabelled trace is written only for F and B: its "
            f"{'/'.join(sorted(k.value for k in kinds - {Kind.F, Kind.B}))} cannot be told from B without labels"
        )
    if schedule.v != 1 or any(schedule.rank_of(stage) != stage for stage in range(schedule.n_stages)):
        raise OptionError(
            f"{schedule.name}: an unlabelled trace is written only for one stage per rank (stage s on "
            f"rank s), not v={schedule.v} placed {schedule.placement}: without labels nothing names the stage"
        )


class Synthetic(NamedTuple):
    traces: dict[int, dict[str, Any]]  # rank -> Chrome trace document
    truth: dict[int, RankTruth]
    # rank -> one step's cells on the true clock (step 0); a batched RECV starts when its data arrived and
    # ends with its pair's kernel
    cells: dict[int, list[shapes.Cell]]


def synthesize(
    schedule: Schedule,
    *,
    durations_us: Durations = DEFAULT_US,
    p2p_latency_us: float = 0.0,
    launch_gap_us: float = 0.0,
    small_gemm: Factors = 1.0,
    slowdown: Factors = 1.0,
    clock_offset_ns: Mapping[int, int] | None = None,
    steps: int = 3,
    shape: str = "cpu",
    run_id: str = "synthetic",
    labels: bool = True,
    batched: bool = False,
    host_in_labels: bool = False,
    step_ns: int | None = None,
) -> Synthetic:
    check_options(schedule, shape, labels, batched)
    lowered = schedule if schedule.lowered else lower(schedule)
    latency, gap = round(p2p_latency_us * 1000), round(launch_gap_us * 1000)

    work = Work(durations_us, small_gemm, slowdown)

    def duration(_rank: int, action: Action) -> float:
        return work.measured_ns(action, lowered.m) if action.kind.is_compute else 0

    firsts = {order[0] for order in lowered.orders}

    def launch_gap(_rank: int, action: Action) -> int:
        return gap if action.kind.is_compute and action not in firsts else 0

    pairs = batching.pairs(lowered) if batched else {}
    if batched:
        try:
            rows = batching.replay(lowered, duration, latency, launch_gap, pairs)
        except batching.BatchedError as error:
            raise OptionError(str(error)) from None
        step_ns = max(max(end for *_, end in rows), step_ns or 0)
    else:
        timeline = simulate(lowered, duration=duration, latency=lambda *_: latency, gap=launch_gap)
        rows, step_ns = timeline.rows, max(round(timeline.makespan), step_ns or 0)
    cells = _cells(lowered, rows, gap)
    truth = {r: rank_truth(r, step_ns, cells, work, lowered.m, gap, pairs) for r in cells}
    if shape in ("gpu", SINGLE_GPU) and steps > 1:  # the analysed step is one before the last
        truth = {r: _with_next_head(truth[r], cells[r], step_ns, pairs) for r in cells}
    offsets = clock_offset_ns or {}
    drawn = sends_until_received(cells) if shape == "gpu" else cells
    if host_in_labels and (shape != "cpu" or not labels):
        raise OptionError(
            "host_in_labels draws the launch gaps inside CPU labels: shape cpu, with labels only"
        )
    if shape == SINGLE_GPU:
        if gap or any(offsets.values()):
            raise OptionError(
                f"shape {SINGLE_GPU}: one process has one clock and one host thread for every rank, so "
                "no clock offsets and no launch gaps"
            )
        return Synthetic(
            {0: _single_gpu_document(lowered, cells, latency, step_ns, steps, run_id)}, truth, cells
        )
    style = _Style(shape, labels, pairs, lowered.m, host_in_labels)
    traces = {
        r: _document(lowered, r, drawn[r], step_ns, steps, style, offsets.get(r, 0), run_id) for r in cells
    }
    return Synthetic(traces, truth, cells)


def _single_gpu_document(
    schedule: Schedule, cells, latency: int, step_ns: int, steps: int, run_id: str
) -> dict[str, Any]:
    """The one trace of a single_gpu run (synthetic.single_gpu)."""
    shifts = [ORIGIN_NS + step * step_ns for step in range(steps)]
    try:
        events = single_gpu.events(schedule, cells, latency, step_ns, shifts, STEP_HEAD_NS)
    except single_gpu.HostBehindError as error:
        raise OptionError(str(error)) from None
    return _header(0, 1, True, run_id) | {"traceEvents": events}


def _header(rank: int, world_size: int, on_gpu: bool, run_id: str) -> dict[str, Any]:
    """Everything of a rank's trace document but its events."""
    gpu = [{"id": rank, "name": "Synthetic GPU", "totalGlobalMem": 80 * 2**30, "computeMajor": 9}]
    return {
        "schemaVersion": 1,
        "deviceProperties": gpu if on_gpu else [],
        "distributedInfo": {"backend": "nccl" if on_gpu else "gloo", "rank": rank, "world_size": world_size},
        "run_id": run_id,
        "baseTimeNanoseconds": BASE_TIME_NS,
        "traceName": f"synthetic rank{rank}",
    }


class _Style(NamedTuple):
    shape: str
    labels: bool
    pairs: dict[Action, Action]  # batched: RECV -> the SEND issued with it
    m: int
    host_in_labels: (
        bool  # CPU: each compute label opens where its launch gap begins (host time in the action)
    )

    def sequence(self, step: int, action: Action) -> int:
        """Autograd's sequence number of the first forward op of (step, microbatch): distinct per
        rank; its second forward op has the next one."""
        return 1 + 2 * (step * self.m + action.microbatch)


def sends_until_received(cells: dict[int, list[shapes.Cell]]) -> dict[int, list[shapes.Cell]]:
    """GPU: each SEND's NCCL kernel runs until its receiver has the data, as an isend does on its own
    stream, overlapping whatever the sender computes next (the truth does not change: the sender never
    waits for it, unless batched). A RECV's start is its data's arrival (its end too, unless batched)."""
    received = {
        matching_send(c.action): c.start
        for rank in cells.values()
        for c in rank
        if c.action.kind.is_comm and c.action.kind.value.startswith("RECV")
    }
    return {
        r: [replace(c, end=max(c.end, received.get(c.action, c.end))) for c in rank_cells]
        for r, rank_cells in cells.items()
    }


def _cells(schedule: Schedule, rows, gap: int) -> dict[int, list[shapes.Cell]]:
    cells: dict[int, list[shapes.Cell]] = {r: [] for r in range(schedule.p)}
    for rank, action, start, end in rows:  # by rank, then in order
        free = cells[rank][-1].end if cells[rank] else 0
        late = not cells[rank] or (
            action.kind.is_compute and gap > 0
        )  # nothing queued ahead of a first action
        cells[rank].append(shapes.Cell(action, free, round(start), round(end), late))
    return cells


def _document(
    schedule: Schedule, rank: int, cells, step_ns: int, steps: int, style: _Style, offset: int, run_id: str
) -> dict[str, Any]:
    pid, device, shape = 4000 + rank, rank, style.shape
    events = shapes.metadata(pid, pid, "python", f"thread {pid} (python)")
    shifts = [ORIGIN_NS + offset + step * step_ns for step in range(steps)]
    moved = [
        [shapes.Cell(c.action, c.issue + s, c.start + s, c.end + s, c.late) for c in cells] for s in shifts
    ]
    if shape == "gpu":
        events += shapes.metadata(
            device, shapes.COMPUTE_STREAM, f"GPU {device}", f"stream {shapes.COMPUTE_STREAM}"
        )
        events += shapes.metadata(device, shapes.COMM_STREAM, f"GPU {device}", f"stream {shapes.COMM_STREAM}")
        if not style.labels:
            autograd = pid + shapes.AUTOGRAD_TID_OFFSET
            events += shapes.metadata(pid, autograd, "python", f"thread {autograd} (pt_autograd_0)")[1:]
        events += _gpu_steps(moved, pid, device, shifts[-1] + step_ns, style)
    else:
        for step, (shift, step_cells) in enumerate(zip(shifts, moved)):
            events.append(
                shapes.span(f"{STEP_PREFIX}{step}", "user_annotation", pid, pid, shift, shift + step_ns)
            )
            events += [
                event
                for cell in step_cells
                for event in (
                    shapes.cpu_cell(cell, pid, style.host_in_labels)
                    if style.labels
                    else shapes.cpu_cell_unlabelled(cell, pid, style.sequence(step, cell.action))
                )
            ]
    return _header(rank, schedule.p, shape == "gpu", run_id) | {"traceEvents": events}


def next_head(cells: list[shapes.Cell], step_ns: int, pairs: Mapping[Action, Action]) -> tuple[int, int]:
    """GPU: the next step's host getting to its first launch (STEP_HEAD_NS, then the first unit's host
    spans up to its launch), on this step's clock: a step before the last has it in its device window,
    which closes at the next step's first kernel."""
    first = _units(cells, pairs)[0]
    device_start = first[0].start if first[0].action.kind.is_compute else first[0].issue
    return step_ns + shapes.host_start(first, device_start) - STEP_HEAD_NS, step_ns + device_start


def _with_next_head(
    truth: RankTruth, cells: list[shapes.Cell], step_ns: int, pairs: Mapping[Action, Action]
) -> RankTruth:
    """`truth` with the next head (next_head) launch_overhead where the compute stream is idle by then,
    not drain bubble."""
    start, end = next_head(cells, step_ns, pairs)
    last = max(cell.end for cell in cells if not cell.action.kind.value.startswith("SEND"))
    moved = max(0, end - max(start, last))
    return replace(
        truth, launch_overhead_ns=truth.launch_overhead_ns + moved, bubble_ns=truth.bubble_ns - moved
    )


def _units(cells: list[shapes.Cell], pairs: Mapping[Action, Action]) -> list[tuple[shapes.Cell, ...]]:
    """A rank's cells as what the host launches one kernel for: a cell, or a batched SEND and RECV."""
    units: list[tuple[shapes.Cell, ...]] = []
    for cell in cells:
        if cell.action in pairs:
            units[-1] += (cell,)
        else:
            units.append((cell,))
    return units


def _peer(action: Action) -> int:
    """The rank a comm action on stage s (rank s) receives from or sends to."""
    return action.stage + (-1 if action.kind in (Kind.RECV_F, Kind.SEND_B) else 1)


def _gpu_steps(
    steps: list[list[shapes.Cell]], pid: int, device: int, last_end: int, style: _Style
) -> list[dict[str, Any]]:
    """Every step's launches and kernels, and host ProfilerStep spans that hold their launches.

    As in real GPU traces the host runs ahead of the device: step k's host span begins STEP_HEAD_NS
    before its first label (not before the previous step's last) and ends where step k+1's begins, while
    the device may still run step k's kernels; the last ends with the pipeline's step (the profiler
    synchronises before it stops).
    """
    units = [_units(step, style.pairs) for step in steps]
    launches = shapes.host_launches([unit for step in units for unit in step])
    bounds = list(accumulate((len(step) for step in units), initial=0))
    per_step = [launches[a:b] for a, b in zip(bounds, bounds[1:])]
    heads = [shapes.host_start(step[0], ends[0]) - STEP_HEAD_NS for step, ends in zip(units, per_step)]
    begins = heads[:1] + [
        max(head, ends[-1] + shapes.LABEL_PAD_NS) for head, ends in zip(heads[1:], per_step)
    ]
    events = []
    for step, (step_units, ends) in enumerate(zip(units, per_step)):
        finish = begins[step + 1] if step + 1 < len(steps) else last_end
        events.append(shapes.span(f"{STEP_PREFIX}{step}", "user_annotation", pid, pid, begins[step], finish))
        for number, (unit, launch_end) in enumerate(zip(step_units, ends)):
            correlation, cell = bounds[step] + number + 1, unit[0]
            if style.labels:
                events += shapes.gpu_cell(cell, pid, device, correlation, launch_end)
            elif len(unit) == 2:
                peers = (_peer(unit[0].action), _peer(unit[1].action))
                events += shapes.pair_cell(*unit, pid, device, correlation, launch_end, peers)
            else:
                sequence, peer = style.sequence(step, cell.action), _peer(cell.action)
                events += shapes.gpu_cell_unlabelled(
                    cell, pid, device, correlation, launch_end, sequence, peer
                )
    return events


def write_run(directory: str | Path, schedule: Schedule, **options: Any) -> Synthetic:
    """rank{r}.json.gz per rank, truth.json (the injected parts) and run.json, written last with complete."""
    result = synthesize(schedule, **options)  # refused options leave no directory behind
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for rank, document in result.traces.items():
        write_atomically(directory / f"rank{rank}.json.gz", gzip.compress(json.dumps(document).encode(), 6))
    truth = [asdict(t) for t in result.truth.values()]
    write_atomically(directory / "truth.json", json.dumps(truth, indent=1).encode())
    config = run_config(schedule, result.truth, options)
    write_atomically(directory / "run.json", json.dumps(config, indent=1).encode())
    return result


def run_config(
    schedule: Schedule, truth: Mapping[int, RankTruth], options: Mapping[str, Any]
) -> dict[str, Any]:
    """run.json of a synthetic run written with `options` (synthesize's)."""
    shape = options.get("shape", "cpu")
    on_gpu = shape in ("gpu", SINGLE_GPU)
    work = Work(
        options.get("durations_us", DEFAULT_US), options.get("small_gemm", 1.0), options.get("slowdown", 1.0)
    )
    step_ms = next(iter(truth.values())).step_ns / 1e6
    config = {
        "schedule": schedule.name,
        "p": schedule.p,
        "m": schedule.m,
        "v": schedule.v,
        "engine": "synthetic",
        "preset": None,
        "device": "cuda" if on_gpu else "cpu",
        "backend": "nccl" if on_gpu else "gloo",
        "mode": SINGLE_GPU if shape == SINGLE_GPU else PROCESSES,
        "dtype": "float32",
        "run_id": options.get("run_id", "synthetic"),
        "dims": dims(schedule),
        "rows_per_microbatch": ROWS_PER_MICROBATCH,  # a microbatch's work is the same at any m
        "calibration": calibration(schedule, work),
        "calibration_by_rows": calibration_by_rows(schedule, work),
        "step_time_unprofiled_ms": step_ms,
        "step_times_unprofiled_ms": [step_ms] * 3,
        "complete": True,
    }
    return config
