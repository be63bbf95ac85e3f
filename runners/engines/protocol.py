"""What an engine is given and what it returns: RankSetup in, a step function out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from runners.grad_sync import GradSync
from runners.model import Stage
from runners.request import Resolved
from runners.runqueue import RunQueueMeter
from runners.schedules import Schedule
from runners.stash import StashMeter


@dataclass(frozen=True)
class RankSetup:
    """What an engine gets to build its step function from, on one rank."""

    resolved: Resolved
    schedule: Schedule  # lowered
    rank: int  # the stage rank: this rank's place in its pipeline (the global rank when DP = 1)
    stages: dict[int, Stage]  # stage index -> module, this rank's only
    batch: torch.Tensor  # the whole batch that enters stage 0
    optimizer: torch.optim.Optimizer
    meter: StashMeter  # each engine samples its stash here (torch's through runners.stash.SavedMeter)
    run_queue: RunQueueMeter  # the native executor samples it around every action; torch's cannot
    replica: int = 0  # which pipeline (runners/mesh.py)
    grad_sync: GradSync | None = None  # DP > 1: what averages the gradients over the replicas

    @property
    def global_rank(self) -> int:
        return self.resolved.request.mesh.global_rank(self.rank, self.replica)


# Called once per rank, collectively (an engine may create process groups); the step function it
# returns runs one training step, optimizer step included, each time it is called.
StepBuilder = Callable[[RankSetup], Callable[[], None]]
