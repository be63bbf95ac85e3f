"""The `native` engine: this project's executor (runners/execute.py) running the rank's lowered order."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from runners.engines.protocol import RankSetup
from runners.execute import StepContext, run_step
from runners.inject import host_stall_ms
from runners.model import split_microbatches
from runners.p2p import PEER_TIMEOUT, open_links


def build_step(setup: RankSetup) -> Callable[[], None]:
    """run_step over this rank's order, with p2p channels to its pipeline's peers (none when p is 1), any
    host stall injected on this rank, the DP sync, and the stash and run-queue meters."""
    request = setup.resolved.request
    links = open_links(setup.resolved.backend, PEER_TIMEOUT, request.mesh) if request.p > 1 else None
    ctx = StepContext(
        setup.rank,
        setup.schedule.n_stages,
        setup.schedule.rank_of,
        setup.stages,
        links,
        split_microbatches(setup.batch, request.m),
        setup.resolved.preset.width,
        host_stall_ms(request.injections, setup.global_rank) / 1e3,
        setup.grad_sync,
    )
    order = setup.schedule.orders[setup.rank]
    return partial(run_step, ctx, order, setup.optimizer, setup.meter, setup.run_queue)
