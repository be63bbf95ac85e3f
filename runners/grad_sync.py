"""The data-parallel gradient sync: each stage's gradients averaged over its DP group, in buckets as
DDP does, between a step's last backward and its optimizer step.

A rank's parameters are taken in reverse order of their stages' registration (the order backward
finishes them, as DDP's reducer assumes) and cut into buckets of about BUCKET_CAP_BYTES. Each bucket is
flattened into one tensor, divided by the group's size and all-reduced (sum), so the optimizer steps
on the replicas' mean gradient, as under DDP; the result is copied back into the gradients. Buckets
are launched in index order on every rank (collectives must be issued in the same order across the
group), each launch waiting for the buckets before it.

Two timings (run.json `dp_overlap`):
- after the backward (default): all buckets are launched and waited for in the DP_GRAD_SYNC span,
  after the schedule's last action;
- overlapped: a post-accumulate-grad hook counts each parameter's accumulations; at its m-th (the last
  microbatch's) the gradient is final, and a bucket whose gradients are all final is launched from the
  hook, inside the backward that finished it. The DP_GRAD_SYNC span then holds only the waits. An
  engine that writes a weight gradient outside autograd (the native executor's W) reports it with
  `accumulated`.

The hooks act only inside `during_step`, so the calibration's passes between steps do not count.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.profiler import record_function

from runners.mesh import Mesh
from runners.p2p import PEER_TIMEOUT
from runners.schedules.trace_names import DP_GRAD_SYNC

DP_GROUP = "dp"  # the DP groups' group_desc (Kineto's distributedInfo.pg_config)

# DDP's default cap (25 MB) would make one bucket of every stage of the cpu and tiny presets (8 MB and
# 32 KB a rank), and one bucket cannot overlap anything: it is ready only when the backward ends. A real
# model's stage holds hundreds of MB, many buckets. 16 KiB is one weight of the tiny preset (64 x 64
# fp32), so each Linear of the tiny and cpu presets is a bucket of its own, as each 32 MB weight of the
# seed preset is under either cap: 2 to 8 buckets a rank, the last ones launched while earlier layers'
# backward still runs.
BUCKET_CAP_BYTES = 16 * 1024


def bucket_assignment(sizes: list[int], cap: int = BUCKET_CAP_BYTES) -> list[list[int]]:
    """Consecutive indices of `sizes` (bytes, in launch order) cut into buckets: a bucket closes as soon
    as it holds at least `cap` bytes (DDP's rule), the last one holds what remains."""
    buckets: list[list[int]] = [[]]
    held = 0
    for index, size in enumerate(sizes):
        buckets[-1].append(index)
        held += size
        if held >= cap:
            buckets.append([])
            held = 0
    return [bucket for bucket in buckets if bucket]


class GradSync:
    """One rank's gradient buckets over its DP group (built collectively: the group exists already)."""

    def __init__(
        self,
        parameters: list[torch.nn.Parameter],
        group: dist.ProcessGroup,
        accumulations: int,
        overlap: bool,
    ) -> None:
        """parameters: in the order backward finishes them; accumulations: how many times a step adds
        into each gradient (m, one per microbatch)."""
        self.parameters = parameters
        self.group = group
        self.replicas = dist.get_world_size(group)
        self.accumulations = accumulations
        self.overlap = overlap
        sizes = [p.numel() * p.element_size() for p in parameters]
        self.buckets = [[parameters[i] for i in bucket] for bucket in bucket_assignment(sizes)]
        self.bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.armed = False
        self.counts: dict[int, int] = {}
        self.waiting: list[int] = []  # per bucket, parameters not yet final
        self.in_flight: list[tuple[dist.Work, torch.Tensor]] = []
        if overlap:
            hook = _weakly(self)
            for parameter in parameters:
                parameter.register_post_accumulate_grad_hook(hook)

    def accumulated(self, parameter: torch.Tensor) -> None:
        """One more accumulation into parameter.grad; at the step's last, launch what became ready."""
        if not self.armed:
            return
        key = id(parameter)
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] == self.accumulations:
            self.waiting[self.bucket_of[key]] -= 1
            while len(self.in_flight) < len(self.buckets) and self.waiting[len(self.in_flight)] == 0:
                self._launch(len(self.in_flight))

    def _launch(self, bucket: int) -> None:
        flat = torch.cat([p.grad.flatten() for p in self.buckets[bucket]])
        flat.div_(self.replicas)
        self.in_flight.append((dist.all_reduce(flat, group=self.group, async_op=True), flat))

    def _reduce(self) -> None:
        """Launch the buckets not launched yet, wait for all, copy the means into the gradients."""
        for bucket in range(len(self.in_flight), len(self.buckets)):
            self._launch(bucket)
        for bucket, (work, flat) in zip(self.buckets, self.in_flight):
            work.wait()
            for parameter, mean in zip(bucket, flat.split([p.numel() for p in bucket])):
                parameter.grad.copy_(mean.view_as(parameter.grad))

    @contextlib.contextmanager
    def during_step(self) -> Iterator[None]:
        """Around a step's schedule: count accumulations inside; on leaving, the DP_GRAD_SYNC span."""
        self.counts, self.in_flight = {}, []
        self.waiting = [len(bucket) for bucket in self.buckets]
        self.armed = self.overlap
        try:
            yield
        finally:
            self.armed = False
        with record_function(DP_GRAD_SYNC):
            self._reduce()
        self.in_flight = []


def _weakly(sync: GradSync) -> Callable[[torch.Tensor], None]:
    """sync.accumulated as a hook that does not keep the sync alive. Its own method would close a cycle
    (sync -> parameters -> hook -> sync) that only the garbage collector frees, at the interpreter's
    exit, after destroy_process_group, where freeing gloo's group aborted a rank ("terminate called
    without an active exception": 8 of 60 two-rank runs)."""
    alive = weakref.ref(sync)

    def accumulated(parameter: torch.Tensor) -> None:
        owner = alive()
        if owner is not None:
            owner.accumulated(parameter)

    return accumulated


def during_step(sync: GradSync | None) -> contextlib.AbstractContextManager:
    """The sync's step context, or nothing when there is one pipeline (no DP group, no span)."""
    return sync.during_step() if sync is not None else contextlib.nullcontext()


def open_grad_sync(
    mesh: Mesh, backend: str, stages: dict[int, torch.nn.Module], accumulations: int, overlap: bool
) -> GradSync | None:
    """This rank's sync over its DP group ("dp"), or None for one pipeline. Collective: every rank
    creates every DP group, in the same order."""
    if mesh.dp == 1:
        return None
    group, _ = dist.new_subgroups_by_enumeration(
        mesh.dp_groups(), timeout=PEER_TIMEOUT, backend=backend, group_desc=DP_GROUP
    )
    parameters = [p for _, stage in sorted(stages.items()) for p in stage.parameters()]
    return GradSync(parameters[::-1], group, accumulations, overlap)
