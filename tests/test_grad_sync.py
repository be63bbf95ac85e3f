"""The DP gradient sync: DDP's bucket rule, and over two gloo ranks the mean gradient, its buckets
launched in the last backward or after it."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist

from runners.grad_sync import BUCKET_CAP_BYTES, GradSync, bucket_assignment

M = 2  # accumulations a step


@pytest.mark.parametrize(
    "sizes,cap,expected",
    [
        ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
        ([4, 4, 4], 8, [[0, 1], [2]]),  # the last bucket holds what remains
        ([20, 1, 1], 8, [[0], [1, 2]]),  # a parameter over the cap is a bucket of its own
        ([1, 1], 100, [[0, 1]]),
    ],
)
def test_a_bucket_closes_once_it_holds_the_cap(sizes, cap, expected):
    assert bucket_assignment(sizes, cap) == expected


def test_each_weight_of_the_tiny_and_cpu_presets_is_its_own_bucket():
    assert bucket_assignment([64 * 64 * 4] * 2) == [[0], [1]]
    assert bucket_assignment([512 * 512 * 4] * 8) == [[i] for i in range(8)]
    assert bucket_assignment([BUCKET_CAP_BYTES // 4] * 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False))


def accumulate(net: torch.nn.Module, replica: int) -> None:
    """M backward passes on this replica's own data."""
    generator = torch.Generator().manual_seed(replica)
    for _ in range(M):
        net(torch.randn(8, 64, generator=generator)).square().mean().backward()


def _worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    results = {}
    for overlap in (False, True):
        net = model()
        sync = GradSync(list(net.parameters())[::-1], dist.group.WORLD, M, overlap)
        with sync.during_step():
            accumulate(net, rank)
            launched_in_backward = len(sync.in_flight)
        results[overlap] = (launched_in_backward, [p.grad.clone() for p in net.parameters()])
    torch.save(results, f"{out}/{rank}.pt")
    # The hooks must not keep the sync (and its group) alive: a cycle freed only by the garbage collector
    # at exit, after destroy_process_group, aborted ranks there.
    gone = weakref.ref(sync)
    gc.disable()
    del net, sync
    assert gone() is None, "the sync outlived its model: its hooks hold it in a cycle"
    gc.enable()
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_replicas_step_on_their_mean_gradient(tmp_path):
    torch.multiprocessing.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    local = []
    for replica in (0, 1):
        net = model()
        accumulate(net, replica)
        local.append([p.grad for p in net.parameters()])
    mean = [(a + b) / 2 for a, b in zip(*local)]
    assert not torch.allclose(local[0][0], local[1][0])  # the replicas' data differ
    for rank in (0, 1):
        results = torch.load(tmp_path / f"{rank}.pt")
        for overlap, (launched, grads) in results.items():
            assert launched == (2 if overlap else 0), overlap  # two 16 KiB weights: two buckets
            for got, want in zip(grads, mean):
                torch.testing.assert_close(got, want)
