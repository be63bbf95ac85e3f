"""The PP x DP mesh's arithmetic, pp outermost as torchtitan lays it out (torch-free)."""

from __future__ import annotations

import pytest

from runners.mesh import Mesh, world_problem


def test_two_pipelines_of_two_stages():
    mesh = Mesh(2, 2)
    assert mesh.world_size == 4
    assert mesh.pipelines() == [(0, 2), (1, 3)]
    assert mesh.dp_groups() == [(0, 1), (2, 3)]
    assert [mesh.coordinates(g) for g in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("p,dp", [(1, 1), (4, 1), (1, 3), (4, 2), (3, 5)])
def test_every_rank_is_in_one_pipeline_and_one_dp_group_at_its_coordinates(p, dp):
    mesh = Mesh(p, dp)
    assert sorted(g for ranks in mesh.pipelines() for g in ranks) == list(range(p * dp))
    assert sorted(g for ranks in mesh.dp_groups() for g in ranks) == list(range(p * dp))
    for g in range(mesh.world_size):
        stage_rank, replica = mesh.coordinates(g)
        assert mesh.global_rank(stage_rank, replica) == g
        assert mesh.pipeline(replica)[stage_rank] == g and mesh.dp_group(stage_rank)[replica] == g


def test_one_pipeline_is_the_whole_world_in_rank_order():
    mesh = Mesh(4)
    assert mesh.pipelines() == [(0, 1, 2, 3)] and mesh.dp_groups() == [(0,), (1,), (2,), (3,)]


def test_run_json_facts():
    assert Mesh(2, 3).facts() == {
        "dp": 3,
        "world_size": 6,
        "mesh": {"dim_names": ["pp", "dp"], "shape": [2, 3]},
        "pipelines": [[0, 3], [1, 4], [2, 5]],
    }


@pytest.mark.parametrize("world,dp,words", [(4, 2, None), (4, 3, "does not split"), (4, 0, "at least 1")])
def test_a_world_splits_into_pipelines_of_equal_depth_or_is_refused_in_one_line(world, dp, words):
    problem = world_problem(world, dp)
    assert problem is None if words is None else words in problem and "\n" not in problem
