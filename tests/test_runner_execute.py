"""The executor's SGD step must equal plain full-batch autograd, whatever the schedule splits the batch
into, on one rank and on two ranks over gloo; every action must appear as a PP:<action> span, the
sends be awaited in a span of their own before the optimizer's, the run-queue meter be sampled twice
inside every action, and an injected host stall sit inside every forward."""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.profiler import record_function

from runners import execute, runqueue
from runners.execute import StepContext, run_step
from runners.model import build_stages, loss_of, split_microbatches, stage_input
from runners.p2p import open_links
from runners.presets import Preset
from runners.runqueue import RunQueueMeter, run_delay_ns
from runners.schedules import Action, build, lower
from runners.schedules.trace_names import LABEL_PREFIX, OPTIMIZER_STEP, WAIT_SENDS

PRESET = Preset("test", width=16, layers_per_rank=2, rows=32, dtype="float64")
LR = 0.5


def reference_update(n_stages: int, v: int) -> dict[int, list[torch.Tensor]]:
    """Weights after one SGD step on the whole batch through all stages, by plain autograd."""
    stages = build_stages(PRESET, tuple(range(n_stages)), v, torch.device("cpu"))
    hidden = stage_input(PRESET, torch.device("cpu"))
    for stage_id in range(n_stages):
        hidden = stages[stage_id](hidden)
    loss_of(hidden, 1).backward()
    with torch.no_grad():
        return {s: [w - LR * w.grad for w in stage.parameters()] for s, stage in stages.items()}


def executed(
    schedule_name: str,
    m: int,
    v: int = 1,
    order: tuple[Action, ...] | None = None,
    run_queue: RunQueueMeter | None = None,
    host_stall_s: float = 0.0,
    p: int = 1,
    links=None,
):
    """Run one step of rank 0 of a schedule (p > 1: with fake links); return the stages (updated in
    place) and the schedule."""
    schedule = lower(build(schedule_name, p, m, v))
    stages = build_stages(PRESET, schedule.stages_of(0), v, torch.device("cpu"))
    ctx = StepContext(
        0,
        schedule.n_stages,
        schedule.rank_of,
        stages,
        links,
        split_microbatches(stage_input(PRESET, torch.device("cpu")), m),
        host_stall_s,
    )
    optimizer = torch.optim.SGD([p for s in stages.values() for p in s.parameters()], lr=LR)
    run_step(ctx, schedule.orders[0] if order is None else order, optimizer, run_queue=run_queue)
    return stages, schedule


# zb exercises the split backward (I then W), interleaved the in-memory hand-over between chunks.
@pytest.mark.parametrize("name,m,v", [("gpipe", 4, 1), ("1f1b", 1, 1), ("zb", 2, 1), ("interleaved", 2, 2)])
def test_one_step_equals_full_batch_sgd(name, m, v):
    stages, schedule = executed(name, m, v)
    expected = reference_update(schedule.n_stages, v)
    for stage_id, stage in stages.items():
        before = build_stages(PRESET, (stage_id,), v, torch.device("cpu"))[stage_id]
        for got, want, old in zip(stage.parameters(), expected[stage_id], before.parameters()):
            assert not torch.equal(got, old)  # the step moved the weights
            torch.testing.assert_close(got, want)


def test_every_action_is_a_labelled_span():
    schedule = lower(build("interleaved", 1, 2, 2))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        executed("interleaved", 2, 2)
    labels = [event.name for event in profiler.events() if event.name.startswith("PP:")]
    assert labels == [f"PP:{action}" for action in schedule.orders[0]]


SEND_WAITED = "test:send_waited"


class SlowSends:
    """Links whose sends take SEND_S to complete, each wait a SEND_WAITED span of its own, and whose
    receives get random data at once."""

    SEND_S = 0.005

    def send(self, tensor, dst, tag, is_gradient):
        return self

    def wait(self) -> None:
        with record_function(SEND_WAITED):
            time.sleep(self.SEND_S)

    def recv(self, buffer, src, tag, is_gradient):
        return buffer.normal_()


def inside(event, span) -> bool:
    return span.time_range.start <= event.time_range.start and event.time_range.end <= span.time_range.end


def overlaps(event, span) -> bool:
    return event.time_range.start < span.time_range.end and span.time_range.start < event.time_range.end


def test_sends_are_awaited_in_their_own_span_before_the_optimizer_step():
    """Waiting for sends is the schedule's p2p, not work outside it: its own span after the last
    action, not inside optimizer_step."""
    schedule = lower(build("gpipe", 2, 2))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        executed("gpipe", 2, p=2, links=SlowSends())
    events = sorted(profiler.events(), key=lambda event: event.time_range.start)
    (wait,) = [event for event in events if event.name == WAIT_SENDS]
    (optimizer,) = [event for event in events if event.name == OPTIMIZER_STEP]
    actions = [event for event in events if event.name.startswith(LABEL_PREFIX)]
    sends = sum(action.kind.name.startswith("SEND") for action in schedule.orders[0])
    assert sends == 2 and [event.name for event in actions] == [f"PP:{a}" for a in schedule.orders[0]]
    assert max(event.time_range.end for event in actions) <= wait.time_range.start
    assert wait.time_range.end <= optimizer.time_range.start  # one after the other, neither inside the other
    # every send is waited for inside WAIT_SENDS: none before it, none inside the optimizer's span
    waited = [event for event in events if event.name == SEND_WAITED]
    assert len(waited) == sends
    assert all(inside(event, wait) and not overlaps(event, optimizer) for event in waited)
    assert wait.time_range.elapsed_us() >= sends * SlowSends.SEND_S * 1e6


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat only")
def test_the_run_queue_is_sampled_at_the_start_and_end_of_every_action():
    meter = RunQueueMeter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        _, schedule = executed("interleaved", 2, 2, run_queue=meter)
    order = schedule.orders[0]
    assert len(meter.samples) == 2 * len(order)
    values = meter.values()
    assert [t for t, _ in values] == sorted(t for t, _ in values)
    assert [d for _, d in values] == sorted(d for _, d in values)  # cumulative: never decreases
    # both samples of an action lie inside its span: pair the i-th span with samples 2i and 2i+1
    spans = sorted(
        (event for event in profiler.events() if event.name.startswith(LABEL_PREFIX)),
        key=lambda event: event.time_range.start,
    )
    durations_ns = [(values[2 * i + 1][0] - values[2 * i][0]) for i in range(len(order))]
    for span, inside_ns in zip(spans, durations_ns):
        assert 0 <= inside_ns <= span.time_range.elapsed_us() * 1e3 + 1e3


def test_without_schedstat_the_meter_records_nothing(tmp_path):
    meter = RunQueueMeter(str(tmp_path / "absent"))
    executed("gpipe", 2, run_queue=meter)
    assert not meter.available and meter.samples == []


def test_a_run_queue_sample_is_one_pread_of_a_file_opened_once(tmp_path, monkeypatch):
    """What keeps a sample at about a microsecond, counted rather than timed: one pread of a file kept
    open, the line kept raw (parsed at export)."""
    schedstat = tmp_path / "schedstat"
    schedstat.write_bytes(b"19137413 221357 4\n")
    calls = Counter()

    def counted(name):
        def call(*args):
            calls[name] += 1
            return getattr(os, name)(*args)

        return call

    meter = RunQueueMeter(str(schedstat))
    counting = {name: counted(name) for name in ("open", "pread", "close")}
    monkeypatch.setattr(runqueue, "os", SimpleNamespace(**counting, O_RDONLY=os.O_RDONLY))
    for _ in range(100):
        meter.sample()
    assert calls == {"open": 1, "pread": 100}
    assert {line for _, line in meter.samples} == {b"19137413 221357 4\n"}
    assert meter.values()[0][1] == run_delay_ns(b"19137413 221357 4\n") == 221357
    meter.close()
    assert calls["close"] == 1


STALLED = "test:stalled"


def test_an_injected_host_stall_sits_inside_every_forward(monkeypatch):
    """The executor's sleeps, each seen as a STALLED span: one per forward, inside it, none in a backward."""
    stall_s, sleep = 0.02, time.sleep

    def marked_sleep(seconds: float) -> None:
        with record_function(STALLED):
            sleep(seconds)

    monkeypatch.setattr(execute, "time", SimpleNamespace(sleep=marked_sleep))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        executed("gpipe", 2, host_stall_s=stall_s)
    spans = {event.name: event for event in profiler.events() if event.name.startswith("PP:")}
    stalls = sorted(
        (event for event in profiler.events() if event.name == STALLED),
        key=lambda event: event.time_range.start,
    )
    assert sorted(spans) == ["PP:0B0", "PP:0B1", "PP:0F0", "PP:0F1"]
    assert [[inside(stall, spans[name]) for name in sorted(spans)] for stall in stalls] == [
        [False, False, True, False],
        [False, False, False, True],
    ]  # in sorted(spans)'s order: 0B0, 0B1, 0F0, 0F1
    assert all(spans[name].time_range.elapsed_us() >= stall_s * 1e6 for name in ("PP:0F0", "PP:0F1"))


def test_an_order_that_leaves_work_undone_is_an_error():
    """A forward whose backward never runs leaves a stashed activation: the step must say so."""
    schedule = lower(build("gpipe", 1, 2))
    truncated = tuple(a for a in schedule.orders[0] if str(a) != "0B1")
    with pytest.raises(RuntimeError, match=r"forwards: \[\(0, 1\)\]"):
        executed("gpipe", 2, order=truncated)


# Two ranks over gloo (started with torch.multiprocessing, not torchrun): p2p, tags and the hand-over
# between chunks must give the same update as one rank on the whole batch.
MULTI_RANK_CASES = [("gpipe", 4, 1), ("1f1b", 2, 1), ("zb", 2, 1), ("interleaved", 2, 2)]


def _two_rank_worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    links = open_links("gloo", timedelta(seconds=60))
    for name, m, v in MULTI_RANK_CASES:
        schedule = lower(build(name, 2, m, v))
        stages = build_stages(PRESET, schedule.stages_of(rank), v, torch.device("cpu"))
        ctx = StepContext(
            rank,
            schedule.n_stages,
            schedule.rank_of,
            stages,
            links,
            split_microbatches(stage_input(PRESET, torch.device("cpu")), m),
        )
        optimizer = torch.optim.SGD([p for s in stages.values() for p in s.parameters()], lr=LR)
        run_step(ctx, schedule.orders[rank], optimizer)
        torch.save(
            {s: [w.detach() for w in stage.parameters()] for s, stage in stages.items()},
            f"{out}/{name}-{rank}.pt",
        )
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_over_gloo_equal_full_batch_sgd(tmp_path):
    torch.multiprocessing.spawn(_two_rank_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for name, _m, v in MULTI_RANK_CASES:
        expected = reference_update(2 * v, v)
        got = {**torch.load(tmp_path / f"{name}-0.pt"), **torch.load(tmp_path / f"{name}-1.pt")}
        assert sorted(got) == list(range(2 * v)), name
        for stage_id, weights in got.items():
            for weight, want in zip(weights, expected[stage_id]):
                torch.testing.assert_close(
                    weight, want, msg=lambda text, where=f"{name} stage {stage_id}": f"{where}: {text}"
                )
