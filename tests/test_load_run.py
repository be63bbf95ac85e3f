"""Run directories: each rank once, one run, run.json consistent and complete; any subset of a job's
ranks loads, saying which are missing, and `require_complete` refuses it naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REAL_TRACES

from analysis.errors import InputError
from analysis.traces.run import load_run


def rank_file(
    directory: Path, name: str, rank: int | None, world_size: int | None = 2, run_id: str | None = None
):
    document = {"traceEvents": [{"ph": "X", "name": f"work{rank}", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}
    if rank is not None:
        document["distributedInfo"] = {"rank": rank, "world_size": world_size}
    if run_id is not None:
        document["run_id"] = run_id
    (directory / name).write_text(json.dumps(document))


def run_json(directory: Path, **fields):
    (directory / "run.json").write_text(json.dumps({"schedule": "gpipe", "p": 2, "complete": True} | fields))


def refused(directory: Path, problem: str):
    with pytest.raises(InputError) as caught:
        load_run(directory)
    assert problem in str(caught.value), str(caught.value)


def test_a_whole_run_loads_in_rank_order_with_its_config(tmp_path):
    rank_file(tmp_path, "rank1.json", 1)
    rank_file(tmp_path, "rank0.json", 0)
    run_json(tmp_path)
    (tmp_path / "merged.json.gz").write_bytes(b"not a rank trace")
    run = load_run(tmp_path)
    assert [t.rank for t in run.traces] == [0, 1]
    assert run.config["schedule"] == "gpipe"
    assert run.frame()["name"].to_list() == ["work0", "work1"]


def test_the_real_eight_rank_job_loads():
    run = load_run(REAL_TRACES / "param_dlrm_8rank")
    assert run.world_size == 8 and run.config is None
    assert run.frame()["rank"].unique().sort().to_list() == list(range(8))


def refused_as_partial(directory: Path, problem: str):
    with pytest.raises(InputError) as caught:
        load_run(directory).require_complete()
    assert str(caught.value) == f"{directory}: {problem}"


def test_a_subset_of_the_job_s_ranks_loads_and_says_which_are_missing(tmp_path):
    rank_file(tmp_path, "rank0.json", 0, world_size=4)
    rank_file(tmp_path, "rank2.json", 2, world_size=4)
    run = load_run(tmp_path)
    assert (run.ranks, run.world_size, run.missing) == ((0, 2), 4, [(1, 1), (3, 3)])
    assert [t.rank for t in run.traces] == [0, 2]  # traces[1] is rank 2: position is not the rank
    assert run.frame()["name"].to_list() == ["work0", "work2"]
    refused_as_partial(tmp_path, "missing rank(s) 1, 3 (found 0, 2)")


def test_one_rank_of_a_big_job_loads_as_that_rank(tmp_path):
    """The common public trace: rank 0 of 64 (DeepSeek's train.json), under any file name."""
    rank_file(tmp_path, "train.json", 0, world_size=64)
    run = load_run(tmp_path)
    assert (run.ranks, run.world_size, run.missing) == ((0,), 64, [(1, 63)])
    refused_as_partial(tmp_path, "missing rank(s) 1-63 (found 0)")


@pytest.mark.parametrize(
    "files, fields, world, missing",
    [
        (["rank0.json", "rank1.json"], {"p": 2, "dp": 2}, 4, [(2, 3)]),  # run.json's p x dp
        (["rank0.json", "rank3.json"], None, 4, [(1, 2)]),  # neither says: the highest rank + 1
        (["rank0.json", "rank1.json"], {"p": 2}, 2, []),
    ],
)
def test_without_a_world_size_in_the_traces_run_json_or_the_highest_rank_gives_it(
    tmp_path, files, fields, world, missing
):
    for name in files:
        rank_file(tmp_path, name, None)  # no distributedInfo: the rank from the name
    if fields is not None:
        run_json(tmp_path, **fields)
    run = load_run(tmp_path)
    assert (run.world_size, run.missing) == (world, missing)


def test_two_files_claiming_one_rank(tmp_path):
    rank_file(tmp_path, "rank0.json", 0)
    rank_file(tmp_path, "rank1.json", 0)
    refused(tmp_path, "two files claim rank 0: rank0.json, rank1.json")


def test_ranks_from_runs_of_different_world_size(tmp_path):
    rank_file(tmp_path, "rank0.json", 0, world_size=2)
    rank_file(tmp_path, "rank1.json", 1, world_size=4)
    refused(tmp_path, "ranks from different runs: world sizes differ")


def test_ranks_from_runs_with_different_run_ids(tmp_path):
    rank_file(tmp_path, "rank0.json", 0, run_id="a")
    rank_file(tmp_path, "rank1.json", 1, run_id="b")
    refused(tmp_path, "ranks from different runs: run ids differ")


def test_run_json_contradicting_the_traces(tmp_path):
    rank_file(tmp_path, "rank0.json", 0)
    rank_file(tmp_path, "rank1.json", 1)
    run_json(tmp_path, p=4)
    refused(tmp_path, "says p=4 but the directory has 2 rank traces")


def test_run_json_contradicting_a_subset_of_the_traces(tmp_path):
    rank_file(tmp_path, "rank0.json", 0, world_size=64)
    run_json(tmp_path, p=4)
    refused(tmp_path, "says p=4 but the directory has ranks of a job of 64 (distributedInfo.world_size)")


def test_run_json_too_small_for_a_rank_the_traces_name(tmp_path):
    rank_file(tmp_path, "rank0.json", None)
    rank_file(tmp_path, "rank5.json", None)
    run_json(tmp_path, p=2)
    refused(tmp_path, "says p=2 but the directory has rank 5")


def test_run_json_past_the_rank_limit_is_refused_before_the_job_is_sized_by_it(tmp_path):
    rank_file(tmp_path, "rank0.json", None)
    run_json(tmp_path, p=10**12)
    refused(tmp_path, "1000000000000 ranks (p x dp), more than the limit of 1,024 ranks")


def test_an_incomplete_run_is_refused(tmp_path):
    rank_file(tmp_path, "rank0.json", 0)
    rank_file(tmp_path, "rank1.json", 1)
    run_json(tmp_path, complete=False)
    refused(tmp_path, "incomplete run")


def test_unreadable_run_json(tmp_path):
    rank_file(tmp_path, "rank0.json", 0, world_size=1)
    (tmp_path / "run.json").write_text("{")
    refused(tmp_path, "unreadable run.json")


def test_rank_unknown_among_several_files(tmp_path):
    rank_file(tmp_path, "a.json", None)
    rank_file(tmp_path, "b.json", None)
    refused(tmp_path, "cannot tell the rank")


def test_a_single_anonymous_trace_is_rank_zero(tmp_path):
    rank_file(tmp_path, "trace.json", None)
    assert load_run(tmp_path).frame()["rank"].to_list() == [0]


def test_empty_directory_and_not_a_directory(tmp_path):
    refused(tmp_path, "no trace files")
    refused(tmp_path / "nope", "not a directory")
