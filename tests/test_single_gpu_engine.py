"""The single_gpu engine's step (runners.engines.single_gpu) run on CPU, where torch.cpu's stream and
event stand-ins do nothing: what it computes is checked without a GPU, the streams and events are not
(they need CUDA: scripts/gpu_check.sh, tests/test_gpu_runner.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from runners.engines import single_gpu
from runners.engines.protocol import RankSetup
from runners.model import build_stages, loss_of, stage_input
from runners.presets import PRESETS
from runners.request import Resolved, RunRequest
from runners.runqueue import RunQueueMeter
from runners.schedules import build, lower
from runners.schedules.single_gpu import SINGLE_GPU
from runners.stash import StashMeter

# float64, so one step's small updates are read without rounding; 64 rows split evenly for every m below
# (the seed's loss, a mean per microbatch over m, is the batch's mean only for equal microbatches)
PRESET = replace(PRESETS["tiny"], dtype="float64")


def one_step(name: str, p: int, m: int, v: int) -> tuple[dict, dict, StashMeter]:
    """The stages before and after one single_gpu step (SGD, lr 1: the update is minus the gradient),
    and the stash meter it sampled."""
    schedule = lower(build(name, p, m, v))
    stage_ids = tuple(range(schedule.n_stages))
    cpu = torch.device("cpu")
    stages, before = build_stages(PRESET, stage_ids, v, cpu), build_stages(PRESET, stage_ids, v, cpu)
    optimizer = torch.optim.SGD([q for stage in stages.values() for q in stage.parameters()], lr=1.0)
    resolved = Resolved(
        RunRequest(name, p, m, v, preset="tiny", device="cpu"), "cpu", "gloo", PRESET, SINGLE_GPU
    )
    meter = StashMeter()
    setup = RankSetup(
        resolved, schedule, 0, stages, stage_input(PRESET, cpu), optimizer, meter, RunQueueMeter()
    )
    single_gpu.build_step(setup)()
    return before, stages, meter


def batch_gradient(stages: dict) -> torch.Tensor:
    """The gradient of the seed's loss over the whole batch through every stage, flattened."""
    x = stage_input(PRESET, torch.device("cpu"))
    for stage in sorted(stages):
        x = stages[stage](x)
    loss_of(x, 1).backward()
    return torch.cat([q.grad.flatten() for stage in sorted(stages) for q in stages[stage].parameters()])


def flat(stages: dict) -> torch.Tensor:
    return torch.cat([q.detach().flatten() for stage in sorted(stages) for q in stages[stage].parameters()])


@pytest.mark.parametrize(
    "name,p,m,v",
    [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2), ("zb", 4, 8, 1), ("gpipe", 1, 1, 1)],
)
def test_one_step_of_p_ranks_in_one_process_takes_the_batch_gradient_step(name, p, m, v):
    before, after, _ = one_step(name, p, m, v)
    gradient = batch_gradient(before)
    assert gradient.norm() > 0
    update = flat(before) - flat(after)
    assert (update - gradient).norm() <= 1e-6 * gradient.norm()


def test_the_stash_meter_samples_each_virtual_rank_on_its_own():
    """gpipe p=2 m=2: each rank holds at most its own 2 microbatches, never the other rank's too."""
    _, _, meter = one_step("gpipe", 2, 2, 1)
    assert len(meter.samples) == 8  # one per F and B of 2 ranks x 2 microbatches
    assert max(held for _, held, _ in meter.samples) == 2 and meter.samples[-1][1] == 0


def test_run_json_says_why_the_streams_share_the_sms():
    facts = single_gpu.stream_facts()
    assert facts["sm_partition"].startswith("none")
    assert (
        isinstance(facts["green_contexts_in_torch"], bool)
        and "first n SMs" in facts["why_not_green_contexts"]
    )
