"""Point-to-point transfers between pipeline ranks, over explicit process groups (no module state).

One process group per channel: (activation or gradient) x (to a higher or a lower rank). NCCL runs
all p2p ops between two ranks of one group on one stream, so a send queued before a crossing recv
would wait forever for a peer whose matching recv sits behind its own send (large messages do not fit
NCCL's buffers). With one channel per direction and message kind, each stream carries messages in one
direction in the order both sides execute them, so no batching is needed to avoid that deadlock.
Gloo matches by tag, so every message also carries a tag naming it. With several pipelines (DP > 1,
runners/mesh.py) each pipeline has its own four groups, under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from runners.mesh import Mesh

# A peer that died or hung fails the run within minutes instead of gloo's default 30 (a step takes seconds).
PEER_TIMEOUT = timedelta(minutes=5)


@dataclass(frozen=True)
class PendingSend:
    """An isend in flight; wait() completes it. Holds the tensor so it lives until sent."""

    work: dist.Work
    tensor: torch.Tensor

    def wait(self) -> None:
        self.work.wait()


@dataclass(frozen=True)
class Links:
    """This rank's p2p channels within its pipeline: groups[(is_gradient, to_higher_rank)]. Peers are
    named by stage rank (their place in the pipeline); ranks maps them to global ranks."""

    groups: dict[tuple[bool, bool], dist.ProcessGroup]
    ranks: tuple[int, ...]  # the pipeline's global ranks, in stage order
    stage_rank: int  # this rank's place in it

    def send(self, tensor: torch.Tensor, dst: int, tag: int, is_gradient: bool) -> PendingSend:
        group = self.groups[(is_gradient, dst > self.stage_rank)]
        return PendingSend(dist.isend(tensor, dst=self.ranks[dst], group=group, tag=tag), tensor)

    def recv(self, buffer: torch.Tensor, src: int, tag: int, is_gradient: bool) -> torch.Tensor:
        """Receive into buffer and block until it has arrived (the wait is the caller's RECV span)."""
        group = self.groups[(is_gradient, self.stage_rank > src)]
        dist.irecv(buffer, src=self.ranks[src], group=group, tag=tag).wait()
        return buffer


def open_links(backend: str, timeout: timedelta, mesh: Mesh | None = None) -> Links:
    """Create every pipeline's four channel groups and keep this rank's; every rank must call this at
    the same point (collective: each rank creates every group, in the same order). mesh: the world's
    layout (default: one pipeline of every rank)."""
    mesh = mesh or Mesh(dist.get_world_size())
    stage_rank, replica = mesh.coordinates(dist.get_rank())
    groups = {}
    for is_gradient in (False, True):
        for upward in (True, False):
            name = f"pp_{'gradient' if is_gradient else 'activation'}_{'up' if upward else 'down'}"
            groups[(is_gradient, upward)], _ = dist.new_subgroups_by_enumeration(
                mesh.pipelines(), timeout=timeout, backend=backend, group_desc=name
            )
    return Links(groups, mesh.pipeline(replica), stage_rank)


def message_tag(sending_stage: int, is_gradient: bool, microbatch: int, n_stages: int) -> int:
    """A tag unique to one message within a step, computed alike by sender and receiver."""
    return (microbatch * n_stages + sending_stage) * 2 + int(is_gradient)
