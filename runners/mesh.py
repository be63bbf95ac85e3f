"""The PP x DP mesh: which global rank is which stage of which pipeline (torch-free).

Laid out as torchtitan's device mesh with pp outermost: world = p * dp, and global rank
g = stage_rank * dp + replica (stage_rank 0..p-1 is the rank's place in its pipeline, replica 0..dp-1 the
pipeline it belongs to). Pipeline j holds [j + dp * s for s in range(p)] in stage order; the DP group of
stage rank s, the ranks holding the same stages whose gradients are averaged, is [s * dp + j for j in
range(dp)]. With dp = 1 the one pipeline is the whole world and global rank == stage rank.
"""

from __future__ import annotations

from dataclasses import dataclass

DIM_NAMES = ("pp", "dp")


@dataclass(frozen=True)
class Mesh:
    p: int  # stage ranks per pipeline (the pipeline's depth)
    dp: int = 1  # pipelines (data-parallel replicas)

    @property
    def world_size(self) -> int:
        return self.p * self.dp

    def global_rank(self, stage_rank: int, replica: int) -> int:
        return stage_rank * self.dp + replica

    def coordinates(self, global_rank: int) -> tuple[int, int]:
        """(stage_rank, replica) of a global rank."""
        return divmod(global_rank, self.dp)

    def pipeline(self, replica: int) -> tuple[int, ...]:
        """The global ranks of one pipeline, in stage order."""
        return tuple(self.global_rank(stage_rank, replica) for stage_rank in range(self.p))

    def dp_group(self, stage_rank: int) -> tuple[int, ...]:
        """The global ranks that hold stage rank `stage_rank`'s stages, one per pipeline."""
        return tuple(self.global_rank(stage_rank, replica) for replica in range(self.dp))

    def pipelines(self) -> list[tuple[int, ...]]:
        return [self.pipeline(replica) for replica in range(self.dp)]

    def dp_groups(self) -> list[tuple[int, ...]]:
        return [self.dp_group(stage_rank) for stage_rank in range(self.p)]

    def facts(self) -> dict:
        """run.json's description of the mesh."""
        return {
            "dp": self.dp,
            "world_size": self.world_size,
            "mesh": {"dim_names": list(DIM_NAMES), "shape": [self.p, self.dp]},
            "pipelines": [list(ranks) for ranks in self.pipelines()],
        }


def dp_problem(dp: int) -> str | None:
    """Why dp replicas cannot run, or None when they can."""
    return None if dp >= 1 else f"DP={dp}: the number of pipelines must be at least 1"


def world_problem(world: int, dp: int) -> str | None:
    """Why a world of `world` ranks cannot hold dp pipelines of equal depth, or None when it can."""
    return dp_problem(dp) or (
        None
        if world % dp == 0
        else f"a world of {world} ranks does not split into DP={dp} pipelines of equal depth"
    )
