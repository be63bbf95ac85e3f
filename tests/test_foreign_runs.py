"""Real pipelines this project did not write, on 2 gloo CPU ranks under torchrun, each profiled by its own
script (torch.profiler, wait=1 warmup=1 active=3, one rank{r}.json.gz per rank, no run.json) and then
analysed from the traces alone: torch.distributed.pipelining's ScheduleLoopedBFS; compute-only CSV
schedules loaded into torch's _PipelineScheduleRuntime (what torchtitan's pipeline_parallel_schedule_csv
does), one in our interleaved generator's order and one in an order none of our generators writes; and a
hand-written GPipe labelled with PP: record_functions whose backwards run in reverse. The scripts play an
outside user: they import torch only, never runners.

Each run must give the right p, m and v, every microbatch's F and B on its stage's rank, per-rank parts
that close on the step time and the schedule's name (custom with its nearest generator where no
generator writes the order). The last test holds that a blocking recv waiting on a late sender is
blocked on the peer, whether it waits inside the c10d::recv_ call, before its gloo:recv span opens (what
these runs showed the analysis once missed: it was read as launch overhead), or inside that span."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from analysis.cells.labelled import CELL_KEY
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.results import Analysis

pytestmark = pytest.mark.slow
P, M = 2, 4

# Profiles `step()` as the seed loop does and writes one trace per rank into `out`.
PROFILED = """
    sched = torch.profiler.schedule(wait=1, warmup=1, active=3)
    export = lambda prof: prof.export_chrome_trace(f"{out}/rank{rank}.json.gz")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=export) as prof:
        for _ in range(5):
            step()
            prof.step()
    dist.destroy_process_group()
"""

# torch.distributed.pipelining with two stages per rank (rank r holds stages r and r + p, one
# Linear + GELU each): ScheduleLoopedBFS without a CSV, else _PipelineScheduleRuntime loading it.
PIPELINING = """
    import sys
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleLoopedBFS, _PipelineScheduleRuntime

    D, ROWS = 256, 512
    out, m, csv = sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    n_stages = 2 * p
    modules = {}
    for s in (rank, rank + p):
        torch.manual_seed(s)
        modules[s] = nn.Sequential(nn.Linear(D, D), nn.GELU())
    stages = [PipelineStage(modules[s], s, n_stages, torch.device("cpu"), group=dist.group.WORLD)
              for s in sorted(modules)]
    loss = lambda output, target: (output - target).square().mean()
    if csv is None:
        schedule = ScheduleLoopedBFS(stages, m, loss_fn=loss)
    else:
        schedule = _PipelineScheduleRuntime(stages, m, loss_fn=loss)
        schedule._load_csv(csv)
    opt = torch.optim.SGD([q for module in modules.values() for q in module.parameters()], lr=1e-3)
    torch.manual_seed(1337)
    x, target = torch.randn(ROWS, D), torch.randn(ROWS, D)

    def step():
        schedule.step(*((x,) if 0 in modules else ()), target=target if n_stages - 1 in modules else None)
        opt.step()
        opt.zero_grad(set_to_none=True)
"""

# The seed's hand-written GPipe (blocking recv, isend forwards, backwards in reverse: B(m-1) first), with
# every action inside record_function("PP:{stage}{kind}{microbatch}"), torch.distributed.pipelining's form.
# Each SEND_B is posted SEND_DELAY_S late, so the previous rank's blocking RECV_B waits on it.
SEND_DELAY_S = 0.005
LABELLED_GPIPE = """
    import sys, time
    import torch, torch.distributed as dist, torch.nn as nn

    D, LAYERS, ROWS = 256, 2, 512
    out, m, SEND_DELAY_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1337 + rank)
    stage = nn.Sequential(*[nn.Sequential(nn.Linear(D, D, bias=False), nn.GELU()) for _ in range(LAYERS)])
    opt = torch.optim.SGD(stage.parameters(), lr=1e-4)
    label = lambda kind, i: torch.profiler.record_function(f"PP:{rank}{kind}{i}")

    def step():
        rows = ROWS // m
        ins, outs, reqs = [], [], []
        for i in range(m):
            if rank == 0:
                x = torch.randn(rows, D, requires_grad=True)
            else:
                x = torch.empty(rows, D)
                with label("RECV_F", i):
                    dist.recv(x, src=rank - 1)
                x.requires_grad_(True)
            with label("F", i):
                y = stage(x)
                if rank == p - 1:
                    y = y.float().square().mean() / m
            if rank < p - 1:
                with label("SEND_F", i):
                    reqs.append(dist.isend(y.detach(), dst=rank + 1))
            ins.append(x)
            outs.append(y)
        for r_ in reqs:
            r_.wait()
        for i in reversed(range(m)):
            if rank == p - 1:
                with label("B", i):
                    outs[i].backward()
            else:
                g = torch.empty_like(outs[i])
                with label("RECV_B", i):
                    dist.recv(g, src=rank + 1)
                with label("B", i):
                    outs[i].backward(g)
            if rank > 0:
                time.sleep(SEND_DELAY_S)
                with label("SEND_B", i):
                    dist.send(ins[i].grad, dst=rank - 1)
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


# Compute-only CSVs (one row per rank; torch lowers them, adding the SENDs and RECVs). INTERLEAVED is
# our interleaved generator's order for p=2, m=4, v=2; LOOPED_GPIPE runs each rank's stages GPipe-style
# one after the other, backwards in forward order (LoopedBFS's reversed): no generator writes it.
INTERLEAVED = [
    "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3".split(),
    "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3".split(),
]
LOOPED_GPIPE = [
    [f"{s}{kind}{i}" for s, kind in ((r, "F"), (r + P, "F"), (r + P, "B"), (r, "B")) for i in range(M)]
    for r in range(P)
]


def foreign_run(directory: Path, source: str, *args: str) -> Path:
    """Run `source` (a script, indented) under torchrun on P gloo ranks with the trace directory and
    `args`; the directory, holding one trace per rank and nothing else."""
    script = directory / "pipeline.py"
    script.write_text(textwrap.dedent(source + PROFILED))
    run = directory / "run"
    run.mkdir()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={P}",
        str(script),
        str(run),
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(f.name for f in run.iterdir()) == [f"rank{r}.json.gz" for r in range(P)]
    return run


def csv_run(directory: Path, rows: list[list[str]]) -> Path:
    csv = directory / "schedule.csv"
    csv.write_text("".join(",".join(row) + "\n" for row in rows))
    return foreign_run(directory, PIPELINING, str(M), str(csv))


CASES = {
    "looped-bfs": lambda d: foreign_run(d, PIPELINING, str(M)),
    "csv-interleaved": lambda d: csv_run(d, INTERLEAVED),
    "csv-looped-gpipe": lambda d: csv_run(d, LOOPED_GPIPE),
    "labelled-gpipe": lambda d: foreign_run(d, LABELLED_GPIPE, str(M), str(SEND_DELAY_S)),
}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """case name -> its run directory, each case run once for the module."""
    done: dict[str, Path] = {}

    def run(case: str) -> Path:
        if case not in done:
            done[case] = CASES[case](tmp_path_factory.mktemp(case))
        return done[case]

    return run


def check(run: Path, v: int, schedule: str, nearest: str | None) -> Analysis:
    """The analysis of `run`: p, m and v; every microbatch's F and B once on each stage's rank (stage s
    on rank s % P) in the median step; each rank's parts summing to the step time; the schedule's name."""
    result = analyze_pipeline(read_run(run))
    summary = result.summary
    assert (summary.p, summary.m, summary.v) == (P, M, v), summary
    median = result.cells.filter(pl.col("step") == summary.median_step)
    counts = median.group_by("rank", "stage", "kind", "microbatch").len()
    assert counts["len"].max() == 1, counts.filter(pl.col("len") > 1)
    per = counts.filter(pl.col("kind").is_in(["F", "B", "I", "W"])).group_by("rank", "stage", "kind").len()
    got = {(r, s, k): n for r, s, k, n in per.iter_rows()}
    assert got == {(s % P, s, k): M for s in range(P * v) for k in ("F", "B")}
    assert len(summary.ranks) == P
    for entry in summary.ranks:
        total = sum(getattr(entry, key) or 0.0 for key in summary.parts)
        assert total == pytest.approx(summary.step_time_ms, rel=1e-9, abs=1e-9), entry
    assert (summary.schedule, summary.nearest_schedule) == (schedule, nearest)
    return result


def test_looped_bfs_is_custom_with_every_forward_and_backward(traced):
    check(traced("looped-bfs"), 2, "custom", "interleaved")


@pytest.mark.parametrize(
    ("case", "schedule", "nearest"),
    [("csv-interleaved", "interleaved", None), ("csv-looped-gpipe", "custom", "interleaved")],
    ids=["interleaved", "looped-gpipe"],
)
def test_csv_schedule_in_torch_runtime(traced, case, schedule, nearest):
    check(traced(case), 2, schedule, nearest)


def test_labelled_gpipe_with_reversed_backwards_is_custom_nearest_gpipe(traced):
    result = check(traced("labelled-gpipe"), 1, "custom", "gpipe")
    assert result.summary.inferred_cells == 0  # every cell from its PP: label
    for order in result.schedule.orders:
        assert [a.microbatch for a in order if a.kind.value == "B"] == list(reversed(range(M)))


RECV_LABEL = re.compile(r"PP:(\d+)(RECV_[FB])(\d+)")
# A blocking receive waits in the c10d::recv_ call (on some runs: timing decides) and in its gloo:recv span
RECV_WAITS = ("c10d::recv_", "gloo:recv")


def union_us(spans: list[dict], end: float) -> float:
    """The us the spans cover, each clipped to `end`: a gloo:recv nests in its c10d::recv_ call, so a sum
    would count that time twice."""
    covered, reach = 0.0, float("-inf")
    for start, stop in sorted((w["ts"], min(w["ts"] + w["dur"], end)) for w in spans):
        covered += max(0.0, stop - max(start, reach))
        reach = max(reach, stop)
    return covered


def recv_wait_ns(run: Path) -> dict[tuple[int, int, int, str, int], float]:
    """Per PP RECV label (rank, step, stage, kind, microbatch): the ns its receive's calls and spans cover."""
    found = {}
    for rank in range(P):
        trace = json.loads(gzip.decompress((run / f"rank{rank}.json.gz").read_bytes()))
        spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        steps = [
            (int(e["name"][13:]), e["ts"], e["ts"] + e["dur"])
            for e in spans
            if e["name"].startswith("ProfilerStep#")
        ]
        waits = [e for e in spans if e["name"] in RECV_WAITS]
        for label in spans:
            match = RECV_LABEL.fullmatch(label["name"])
            if match is None:
                continue
            step = next((n for n, start, end in steps if start <= label["ts"] < end), None)
            end = label["ts"] + label["dur"]
            inside = [w for w in waits if w["tid"] == label["tid"] and label["ts"] <= w["ts"] <= end]
            stage, kind, microbatch = match.groups()
            if step is not None:
                found[(rank, step, int(stage), kind, int(microbatch))] = 1e3 * union_us(inside, end)
    return found


def test_a_blocking_recv_waiting_on_its_late_sender_is_blocked(traced):
    # Whether the wait falls in the c10d::recv_ call or in its gloo:recv span is up to timing (the call's
    # own wait is pinned on hand-timed spans in test_cells). The late SEND_B makes RECV_Bs wait (each step's
    # first, RECV_B(m-1), entered as soon as the forwards' sends are done, waits the delay and rank 1's F and B).
    run = traced("labelled-gpipe")
    waits = recv_wait_ns(run)
    assert max(ns for key, ns in waits.items() if key[3] == "RECV_B") >= SEND_DELAY_S * 1e9, waits
    cells = analyze_pipeline(read_run(run)).cells.filter(pl.col("kind").str.starts_with("RECV"))
    blocked = {tuple(row[:-1]): row[-1] for row in cells.select(*CELL_KEY, "blocked_ns").iter_rows()}
    short = {
        key: (round(blocked.get(key, 0) / 1e6, 3), round(ns / 1e6, 3))
        for key, ns in sorted(waits.items())
        if blocked.get(key, 0) < 0.9 * ns
    }
    assert not short, (
        f"RECV cells whose receive waited, not counted blocked (cell: blocked ms, wait ms): {short}"
    )
