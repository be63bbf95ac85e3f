"""Run directories: unique ids, run.json complete only when whole, traces/latest replaced atomically
(and left alone where it is no link), and what an incomplete run is."""

from __future__ import annotations

import json

import pytest

from runners.rundir import (
    LATEST,
    RUNNER_LOG,
    create_run_dir,
    hold_run,
    incomplete_reason,
    is_complete,
    point_latest,
    record_outcome,
    run_id,
    write_run_json,
)


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


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_latest_that_is_no_link_is_left_as_it_is(tmp_path, kind):
    """A `latest` copied as a directory (`cp -rL`, `scp -r`) failed every complete run with
    IsADirectoryError; it, or a file of that name, is now left as it is."""
    run = create_run_dir(tmp_path, "r1")
    latest = tmp_path / LATEST
    if kind == "directory":
        latest.mkdir()
        (latest / "run.json").write_text("{}")
    else:
        latest.write_text("mine")
    assert point_latest(run) is None
    assert (latest / "run.json").read_text() == "{}" if kind == "directory" else latest.read_text() == "mine"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["latest", "r1"]  # no temporary link left


def test_a_run_without_run_json_is_in_progress_while_its_launcher_holds_it(tmp_path):
    """The launcher's lock on torchrun.log (inherited by torchrun and its workers) tells a run in
    progress from one whose launcher is gone; a report built during a run called it failed."""
    run = create_run_dir(tmp_path, "r1")
    with (run / RUNNER_LOG).open("w") as log:
        hold_run(log)
        assert incomplete_reason(run) == f"in progress (its launcher is running; see {RUNNER_LOG})"
    assert incomplete_reason(run).startswith("its launcher ended before the run completed")
    record_outcome(run, "interrupted by SIGTERM")
    assert incomplete_reason(run) == f"interrupted by SIGTERM (see {RUNNER_LOG})" and not is_complete(run)
