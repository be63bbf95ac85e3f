"""Outputs never destroy: `merge --out` and `report --out` write a new file or folder, or one they wrote,
and refuse anything else in one line, leaving it byte for byte; layouts made by copying (run directories
as links) are read.

Before: as root `merge --out /dev/full` replaced the device with a gzip file, `merge --out RUN/run.json`
overwrote the run's input, and `report --out DIR` deleted the user's own DIR/runs/*.html and *.js.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from test_faults_outputs import predictable_run

from analysis.cli import main
from analysis.job.run_dir import analysis_of
from analysis.merge.output import MARK
from analysis.report import build_report
from analysis.report.site import MANIFEST


def files_in(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def special_file(path: Path, kind: str) -> None:
    """A FIFO, or a character device like /dev/null (root only: mknod needs CAP_MKNOD)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    else:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


@pytest.fixture
def run(tmp_path) -> Path:
    made = predictable_run(tmp_path / "traces" / "run")
    analysis_of(made)
    return made


@pytest.mark.parametrize(
    "out, what",
    [
        ("run/rank0.json", "is among the files of run directory"),
        ("run/run.json", "is among the files of run directory"),
        ("run/rank5.json.gz", "is among the files of run directory"),  # new, but the loader would read it
        ("run/analysis/merged.json.gz", "is among the files of run directory"),
        ("mine.json.gz", "exists and is no merged trace of this command's"),
        ("folder", "is not a regular file"),
        ("link.json.gz", "is not a regular file"),
    ],
)
def test_merge_refuses_an_out_it_did_not_write_and_leaves_it(tmp_path, capsys, run, out, what):
    (tmp_path / "traces" / "mine.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    (tmp_path / "traces" / "folder").mkdir()
    (tmp_path / "traces" / "link.json.gz").symlink_to(tmp_path / "traces" / "mine.json.gz")
    before = files_in(tmp_path)
    assert main(["merge", str(run), "--out", str(tmp_path / "traces" / out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / 'traces' / out}: {what}"), err
    assert files_in(tmp_path) == before and (tmp_path / "traces" / "link.json.gz").is_symlink()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_merge_and_report_refuse_a_device_or_fifo_and_leave_it(tmp_path, capsys, run, kind):
    node = tmp_path / "node"
    special_file(node, kind)
    mode = node.lstat().st_mode
    assert main(["merge", str(run), "--out", str(node)]) == 2
    assert main(["report", "--traces", str(tmp_path / "traces"), "--out", str(node)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: {node}: is not a regular file (a link, a directory or a device); left as it is",
        f"error: {node}: is not a directory (the report writes a folder of pages); left as it is",
    ]
    assert node.lstat().st_mode == mode


def test_merge_writes_a_new_out_and_replaces_only_its_own(tmp_path, capsys, run):
    out = tmp_path / "merged" / "one.json.gz"
    assert main(["merge", str(run), "--out", str(out)]) == 0
    assert gzip.decompress(out.read_bytes()).startswith(b'{"traceEvents":[') and MARK in out.read_bytes()[:64]
    assert main(["merge", str(run), "--out", str(out)]) == 0  # its own: replaced
    assert main(["merge", str(run)]) == 0 and (run / "merged.json.gz").is_file()  # the run's own place
    assert main(["merge", str(run), "--out", str(run / "merged.json.gz")]) == 0
    capsys.readouterr()


def test_merge_refuses_a_run_file_reached_through_a_link_to_its_folder(tmp_path, capsys, run):
    (tmp_path / "alias").symlink_to(run)
    before = files_in(run)
    assert main(["merge", str(run), "--out", str(tmp_path / "alias" / "rank0.json")]) == 2
    assert "is among the files of run directory" in capsys.readouterr().err
    assert files_in(run) == before


def test_report_refuses_a_folder_holding_files_it_did_not_write_and_leaves_them(tmp_path, capsys, run):
    mine = tmp_path / "mine"
    (mine / "runs").mkdir(parents=True)
    (mine / "runs" / "notes.html").write_text("<p>mine</p>")
    (mine / "runs" / "notes.js").write_text("mine()")
    (mine / "index.html").write_text("mine")
    before = files_in(mine)
    assert main(["report", "--traces", str(tmp_path / "traces"), "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {mine}: holds index.html, which no report wrote;") and err.count("\n") == 1
    assert files_in(mine) == before


def test_report_rebuilds_its_own_folder_deleting_only_its_own_stale_pages(tmp_path, capsys, run):
    out = tmp_path / "reports"
    out.mkdir()  # an empty folder is the report's to take
    traces = tmp_path / "traces"
    second = predictable_run(traces / "second")
    assert main(["report", "--traces", str(traces), "--out", str(out)]) == 0
    listed = set(json.loads((out / MANIFEST).read_text()))
    assert listed == set(files_in(out)) - {MANIFEST} and "runs/second.html" in listed
    shutil.rmtree(second)
    assert main(["report", "--traces", str(traces), "--out", str(out)]) == 0
    assert not (out / "runs" / "second.html").exists() and (out / "runs" / "run.html").exists()
    (out / "runs" / "notes.txt").write_text("mine")  # a file of the user's, put there since
    before = files_in(out)
    assert main(["report", "--traces", str(traces), "--out", str(out)]) == 2
    assert "holds runs/notes.txt, which no report wrote" in capsys.readouterr().err
    assert files_in(out) == before


def test_the_report_lists_run_directories_that_are_links_and_latest_once(tmp_path, run):
    """Runs gathered with `ln -s` were skipped in silence ("0 runs"); `latest` still is no run of its own."""
    elsewhere = predictable_run(tmp_path / "elsewhere" / "gathered")
    traces = tmp_path / "traces"
    (traces / "linked").symlink_to(elsewhere)
    (traces / "latest").symlink_to("run")
    index = build_report(traces, tmp_path / "reports").read_text()
    pages = sorted(path.name for path in (tmp_path / "reports" / "runs").glob("*.html"))
    assert pages == ["linked.html", "run.html"] and 'class="error"' not in index
