"""analysis.traces.layout: a job's pipelines from run.json, the traces' process groups or p2p peers, or refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis.errors import InputError
from analysis.traces.layout import (
    DP,
    STAGE,
    STAGES,
    Group,
    find_pipelines,
    group_scope,
    groups_of,
    named_scope,
)

# P=2 x DP=2 laid out with pp outermost: pipeline j holds [j, j + 2]; the DP group of stage s [2s, 2s + 1].
PIPELINES = [[0, 2], [1, 3]]


def per_rank(*groups: Group) -> dict[int, list[Group]]:
    """Every rank records every group (what a rank records of the others' groups does not matter)."""
    return {rank: list(groups) for rank in range(4)}


def test_run_json_pipelines_are_taken_as_written():
    assert find_pipelines(4, {"p": 2, "dp": 2, "pipelines": [[1, 3], [0, 2]]}, {}, {}) == PIPELINES


def test_our_runners_p2p_groups_hold_each_pipeline():
    groups = per_rank(
        *(
            Group(name, tuple(ranks))
            for ranks in PIPELINES
            for name in ("pp_activation_up", "pp_gradient_down")
        ),
        Group("dp", (0, 1)),
        Group("dp", (2, 3)),
        Group("default_pg", (0, 1, 2, 3)),
    )
    assert find_pipelines(4, None, groups, {}) == PIPELINES


def test_a_device_meshs_pp_groups_hold_each_pipeline():
    groups = per_rank(Group("mesh_pp", (0, 2)), Group("mesh_pp", (1, 3)), Group("mesh_dp", (0, 1)))
    assert find_pipelines(4, None, groups, {}) == PIPELINES


def test_dp_groups_alone_give_the_pipelines_across_them():
    groups = per_rank(Group("mesh_dp", (2, 3)), Group("mesh_dp", (0, 1)))
    assert find_pipelines(4, None, groups, {}) == PIPELINES


def test_p2p_peers_alone_give_the_pipelines():
    assert find_pipelines(4, None, {}, {0: {2}, 2: {0}, 1: {3}, 3: {1}}) == PIPELINES


def test_nothing_said_is_one_pipeline():
    assert find_pipelines(3, None, {}, {}) == [[0, 1, 2]]
    assert find_pipelines(3, {"p": 3}, per_rank(Group("default_pg", (0, 1, 2))), {}) == [[0, 1, 2]]


def test_replicas_said_but_not_where_are_refused():
    with pytest.raises(InputError, match=r"says dp=2 but not which ranks form each pipeline"):
        find_pipelines(4, {"p": 2, "dp": 2}, {}, {})


@pytest.mark.parametrize(
    ("pipelines", "problem"),
    [
        ([[0, 2], [1]], "exactly once"),
        ([[0, 2], [1, 3, 4]], "exactly once"),
        ([[0, 1, 2], [3]], "different depths"),
        ("0,1", "not lists of rank numbers"),
        ([[0, "1"]], "not lists of rank numbers"),
    ],
)
def test_run_json_pipelines_that_do_not_fit_the_ranks_are_refused(tmp_path, pipelines, problem):
    with pytest.raises(InputError, match=problem) as error:
        find_pipelines(4, {"pipelines": pipelines}, {}, {}, tmp_path)
    assert str(error.value).startswith(str(tmp_path / "run.json"))


def test_groups_that_do_not_cover_the_ranks_are_refused():
    with pytest.raises(InputError, match="the pp process groups do not hold each of the 4 traced ranks"):
        find_pipelines(4, None, per_rank(Group("mesh_pp", (0, 2))), {})


def test_pg_config_entries_without_a_name_or_ranks_are_skipped():
    info = SimpleNamespace(
        pg_config=[
            {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]},
            {"pg_desc": "dp", "ranks": "0,1"},
            {"ranks": [0]},
            "junk",
        ]
    )
    assert groups_of(info) == (Group("default_pg", (0, 1), "0"),)
    assert groups_of(SimpleNamespace(pg_config=None)) == ()


# Megatron-LM's group_desc for P=2 x DP=2 (tp = 1), as Kineto's pg_config carries them
MEGATRON = (
    Group("PIPELINE_MODEL_PARALLEL_GROUP", (0, 2), "4"),
    Group("PIPELINE_MODEL_PARALLEL_GROUP", (1, 3), "5"),
    Group("DATA_PARALLEL_GROUP", (0, 1), "1"),
    Group("DATA_PARALLEL_GROUP", (2, 3), "2"),
    Group("EMBEDDING_GROUP", (0, 2), "6"),
    Group("MODEL_PARALLEL_GROUP", (0, 2), "3"),
    Group("TENSOR_MODEL_PARALLEL_GROUP", (0,), "7"),
)


def test_megatrons_pipeline_groups_hold_each_pipeline():
    assert find_pipelines(4, None, per_rank(*MEGATRON), {}) == PIPELINES


def test_megatrons_dp_groups_alone_give_the_pipelines_across_them():
    dp = [g for g in MEGATRON if g.name == "DATA_PARALLEL_GROUP"]
    assert find_pipelines(4, None, per_rank(*dp), {}) == PIPELINES


@pytest.mark.parametrize(
    ("name", "scope"),
    [
        ("DATA_PARALLEL_GROUP", DP),
        ("DATA_PARALLEL_GROUP_WITH_CP", DP),
        ("mesh_dp", DP),
        ("mesh_dp_shard", DP),
        ("dp", DP),
        ("EMBEDDING_GROUP", STAGES),
        ("MODEL_PARALLEL_GROUP", STAGES),
        ("PIPELINE_MODEL_PARALLEL_GROUP", STAGES),
        ("mesh_pp", STAGES),
        ("default_pg", STAGES),
        ("TENSOR_MODEL_PARALLEL_GROUP", STAGE),
        ("mesh_tp", STAGE),
        ("mesh_cp", STAGE),
        ("some_group", None),
    ],
)
def test_a_groups_name_says_what_it_spans(name, scope):
    assert named_scope(name) == scope


@pytest.mark.parametrize(
    ("members", "name", "scope"),
    [
        ((0, 1), "MODEL_PARALLEL_GROUP", DP),  # the members decide over the name
        ((0, 2), "DATA_PARALLEL_GROUP", STAGES),
        ((0, 1, 2, 3), None, STAGES),  # the world group of a gradient-norm all-reduce
        ((0, 4), None, STAGE),  # one traced member (rank 4: a tensor-parallel peer not traced): alone
        ((0, 4), "TENSOR_MODEL_PARALLEL_GROUP", STAGE),
        ((0, 4), "EMBEDDING_GROUP", STAGES),
        (None, "EMBEDDING_GROUP", STAGES),
        (None, None, DP),  # gloo records no group: the gradient sync, as before groups were read
    ],
)
def test_a_collectives_group_is_known_by_its_traced_members_then_its_name(members, name, scope):
    assert group_scope(members, name, PIPELINES) == scope
