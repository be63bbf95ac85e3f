"""A PP x DP job as an outside user writes one: torch only, no runners, no run.json.

    python -m torch.distributed.run --standalone --nproc_per_node=4 scripts/mesh_pp_dp.py OUT [PP] [M]

A DeviceMesh ("cpu", gloo) of shape (PP, world / PP) named ("pp", "dp"), pp outermost as torchtitan
lays it out; each pipeline is torch.distributed.pipelining's Schedule1F1B over the mesh's pp group (one
Linear + GELU stage per rank); after each step every rank all-reduces its gradients over the mesh's dp
group (one flat bucket, as a hand-written DDP does), then steps its optimizer. Profiled with
torch.profiler (wait=1, warmup=1, active=3); one OUT/rank{global rank}.json.gz per rank.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

D, ROWS = 256, 512


def main() -> None:
    out = sys.argv[1]
    pp = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    m = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (pp, world // pp), mesh_dim_names=("pp", "dp"))
    pp_group, dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
    stage_index = mesh["pp"].get_local_rank()
    torch.manual_seed(stage_index)
    module = nn.Sequential(nn.Linear(D, D), nn.GELU())
    stage = PipelineStage(module, stage_index, pp, torch.device("cpu"), group=pp_group)
    schedule = Schedule1F1B(stage, m, loss_fn=lambda output, target: (output - target).square().mean())
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)
    torch.manual_seed(1337 + mesh["dp"].get_local_rank())  # each replica its own data
    x, target = torch.randn(ROWS, D), torch.randn(ROWS, D)
    first, last = stage_index == 0, stage_index == pp - 1

    def step() -> None:
        schedule.step(*((x,) if first else ()), target=target if last else None)
        grads = [p.grad for p in module.parameters()]
        bucket = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(bucket, group=dp_group, async_op=True).wait()
        torch.nn.utils.vector_to_parameters(bucket / dp_group.size(), grads)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sched = torch.profiler.schedule(wait=1, warmup=1, active=3)

    def export(prof) -> None:
        prof.export_chrome_trace(f"{out}/rank{rank}.json.gz")

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, schedule=sched, on_trace_ready=export) as prof:
        for _ in range(5):
            step()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
