"""Run directories: unique ids, run.json complete only when whole, traces/latest replaced atomically."""

from __future__ import annotations

import json

from runners.rundir import create_run_dir, is_complete, point_latest, run_id, write_run_json


def test_run_ids_are_unique_within_one_second():
    ids = {run_id("gpipe", 4, 8, 1) for _ in range(200)}
    assert len(ids) == 200
    assert all("-gpipe-p4-m8-" in i for i in ids)
    assert "-v2-" in run_id("interleaved", 4, 8, 2)


def test_run_json_ends_with_complete(tmp_path):
    run = create_run_dir(tmp_path, "r1")
    assert not is_complete(run)
    write_run_json(run, {"schedule": "gpipe", "complete": False, "p": 2})
    document = json.loads((run / "run.json").read_text())
    assert list(document)[-1] == "complete" and document["complete"] is True
    assert is_complete(run)
    assert [p.name for p in run.iterdir()] == ["run.json"]  # no temporary left behind


def test_a_truncated_run_json_is_not_complete(tmp_path):
    run = create_run_dir(tmp_path, "r1")
    (run / "run.json").write_text('{"schedule": "gpipe", "complete": tr')
    assert not is_complete(run)


def test_latest_moves_to_the_newest_run(tmp_path):
    first, second = create_run_dir(tmp_path, "a"), create_run_dir(tmp_path, "b")
    point_latest(first)
    latest = point_latest(second)
    assert latest.resolve() == second.resolve()
    assert latest.readlink().as_posix() == "b"  # relative, so the traces folder can move
