"""Ranks read in a pool of processes (analysis.ranks.pool) or on a Dask cluster (analysis.ranks.cluster) give
what one process reading them in turn gives: the same analysis, the same one-line errors (load errors
first, the run's limits charged in file order), each warning once; and a rank's tables renumber whole.
The cluster tests share one 2-worker LocalCluster (`--cluster ADDRESS`); one starts its own (`local:2`)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_commands import EDITS, FUZZ, SEEDS, _mutated, _run

from analysis.errors import InputError
from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from analysis.ranks import cluster, progress, workers
from analysis.traces.load import read_trace
from analysis.traces.run_files import trace_files
from runners.schedules import build
from synthetic.data_parallel import write_job
from synthetic.generate import write_run


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A running 2-worker LocalCluster's address."""
    with cluster.local_cluster(2) as local:
        yield local.scheduler_address


def _cli(directory, *flags: str) -> tuple[int, str, dict | None]:
    code, err = _run("analyze", str(directory), *flags)
    summary = directory / "analysis" / "summary.json"
    found = json.loads(summary.read_text()) if code == 0 else None
    if summary.exists():
        summary.unlink()
    return code, err, found


@FUZZ
@given(seed=st.sampled_from(SEEDS), edits=st.lists(EDITS, min_size=1, max_size=4))
def test_pool_cluster_and_one_process_agree_on_any_input(tmp_path, seed, edits, scheduler):
    directory = tmp_path / "run"
    _mutated(seed, edits).write(directory)
    alone = _cli(directory, "--jobs", "1")
    assert _cli(directory, "--jobs", "2") == alone
    assert _cli(directory, "--cluster", scheduler) == alone


def test_pool_gives_the_same_tables(tmp_path):
    write_run(tmp_path, build("1f1b", 4, 8, 1), shape="gpu", clock_offset_ns={1: 3_000_000, 3: -2_000_000})
    with workers.applied(3):
        pooled = analyze_pipeline(read_run(tmp_path))
    with workers.applied(1):
        alone = analyze_pipeline(read_run(tmp_path))
    assert pooled.summary == alone.summary
    assert pooled.cells.equals(alone.cells) and pooled.gaps.equals(alone.gaps)


def test_run_limit_is_met_at_the_same_file(tmp_path, scheduler):
    write_run(tmp_path, build("gpipe", 4, 4, 1), shape="cpu")
    files = trace_files(tmp_path)
    events = [read_trace(path).frame.height for path in files]
    flags = ("--max-run-events", str(events[0] + events[1] + 1))  # two files fit, not three
    code, err, _ = _cli(tmp_path, *flags, "--jobs", "3")
    assert code == 2 and err.startswith(f"error: {files[2]}: with the files before it, the run holds"), err
    assert (code, err) == _cli(tmp_path, *flags, "--jobs", "1")[:2]
    assert (code, err) == _cli(tmp_path, *flags, "--cluster", scheduler)[:2]


@pytest.mark.parametrize("engine", ["pool", "cluster"])
def test_worker_error_is_one_line_and_warnings_come_once(tmp_path, engine, request):
    flags = ("--jobs", "2") if engine == "pool" else ("--cluster", request.getfixturevalue("scheduler"))
    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="cpu")
    (packed,) = tmp_path.glob("rank1.json*")
    document = json.loads(gzip.decompress(packed.read_bytes()))
    document["traceEvents"].append({"ph": "X", "name": "glitch", "ts": 1, "dur": -5, "pid": 1, "tid": 1})
    packed.unlink()
    rank1 = tmp_path / "rank1.json"
    rank1.write_text(json.dumps(document))
    code, err, _ = _cli(tmp_path, *flags)
    assert code == 0 and err.count("dropped 1 events with a negative duration") == 1, err
    rank1.write_text(rank1.read_text()[:-20])
    code, err, _ = _cli(tmp_path, *flags)
    assert code == 2 and err == f"error: {rank1}: truncated JSON (profiler killed while writing?)\n"


def test_renumbered_moves_every_table(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="gpu")
    one = read_run(tmp_path).ranks[1].renumbered(5)
    tables = [one.collectives, one.memory, one.samples]
    tables += [getattr(one.cells, name) for name in ("cells", "waits", "steps", "kernels", "unscheduled")]
    assert one.rank == 5
    assert all(t["rank"].unique().to_list() in ([5], []) for t in tables if t is not None)
    assert one.cells.cells.height > 0


def test_pool_size_fits_the_memory(monkeypatch, tmp_path):
    big = tmp_path / "rank0.json"
    big.write_bytes(b" " * workers.POOL_MIN_BYTES)
    files = [big] * 4
    monkeypatch.setattr(
        workers, "available_bytes", lambda: 2 * workers.FOOTPRINT_PER_BYTE * workers.POOL_MIN_BYTES
    )
    with workers.applied(8):
        assert workers.pool_size(files) == 2
    with workers.applied(None):
        assert workers.pool_size(files[:1]) == 1
    small = tmp_path / "rank1.json"
    small.write_bytes(b"{}")
    assert workers.pool_size([small] * 4) == 1  # too little to pay for a pool


def test_a_script_without_a_main_guard_is_not_run_again_in_the_workers(tmp_path):
    write_run(tmp_path / "run", build("gpipe", 2, 2, 1), shape="cpu")
    script = tmp_path / "script.py"
    script.write_text(
        "from analysis.job.run_dir import read_run\nfrom analysis.ranks import workers\n"
        f"with workers.applied(2):\n    print(sorted(read_run({str(tmp_path / 'run')!r}).ranks))\n"
    )
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[0, 1]\n", "")


def test_progress_shows_only_long_work_and_erases_itself(monkeypatch, capsys):
    clock = iter([0.0, 0.5, 40.0, 41.0])
    monkeypatch.setattr(progress, "monotonic", lambda: next(clock))
    with progress.Progress("run: ranks read", total=3) as shown:
        shown.done_one()  # half a second in: nothing
        shown.done_one()  # 40 s in, not a terminal: one line
    assert capsys.readouterr().err == "run: ranks read: 2/3 (40 s)\n"


def _outputs(directory: Path, *flags: str) -> tuple[int, str, str, dict[str, bytes]]:
    """analyze's exit code, stdout, stderr and every file it wrote."""
    done = subprocess.run(
        [sys.executable, "-m", "analysis", "analyze", str(directory), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    written = {path.name: path.read_bytes() for path in sorted((directory / "analysis").iterdir())}
    return done.returncode, done.stdout, done.stderr, written


def test_a_local_cluster_writes_what_one_process_writes(tmp_path):
    write_job(tmp_path, build("1f1b", 2, 4), 2, slow_pipeline=1, slow_factor=1.2, sync_us=500.0, shape="gpu")
    clustered = _outputs(tmp_path, "--cluster", "local:2")
    alone = _outputs(tmp_path, "--jobs", "1")
    assert clustered[0] == 0 and len(clustered[3]) > 5, clustered[:3]
    assert clustered == alone


def test_a_cluster_that_cannot_be_used_is_one_line(tmp_path, monkeypatch):
    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="cpu")
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", 1.0)
    code, err, _ = _cli(tmp_path, "--cluster", "tcp://127.0.0.1:1")
    assert (
        code == 2
        and err.startswith("error: cluster tcp://127.0.0.1:1: cannot connect (")
        and err.count("\n") == 1
    )
    monkeypatch.setitem(sys.modules, "distributed", None)  # (not installed)
    code, err, _ = _cli(tmp_path, "--cluster", "local:2")
    assert (code, err) == (
        2,
        "error: --cluster needs Dask's distributed package: pip install 'pipeline-bubbles[cluster]'\n",
    )


def _analyze_within(directory: Path, spec: str, bound: float) -> subprocess.CompletedProcess:
    """`analyze DIRECTORY --cluster SPEC` in a process of its own with cluster.CONNECT_TIMEOUT = `bound`,
    which must have exited 15 s later (its imports and the cluster's start and close)."""
    script = "import sys\nfrom analysis.cli import main\nfrom analysis.ranks import cluster\n"
    script += f"cluster.CONNECT_TIMEOUT = {bound}\nsys.exit(main(sys.argv[1:]))\n"
    command = [sys.executable, "-c", script, "analyze", str(directory), "--cluster", spec]
    return subprocess.run(command, capture_output=True, text=True, timeout=15)


def test_a_scheduler_that_never_answers_is_one_line_within_the_bound(tmp_path):
    """A peer that accepts the connection and never answers (Dask's own start would wait for it for ever): the
    command ends with its one line soon after the bound, and its process exits."""
    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="cpu")
    with socket.create_server(("127.0.0.1", 0)) as silent:
        spec = "tcp://{}:{}".format(*silent.getsockname())
        done = _analyze_within(tmp_path, spec, 1.0)
    assert (done.returncode, done.stderr) == (
        2,
        f"error: cluster {spec}: cannot connect (no answer from the scheduler within 1 s: is it a Dask "
        "scheduler's address, and is it running?)\n",
    )


def _reading_with(
    task: str, directory: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`analyze DIRECTORY FLAGS` in a process of its own (so that Dask's log lines, if any, reach its
    stderr), each rank's file read by `def task(work)` in `task` (sent to the workers by value)."""
    script = f"import os, sys, time\nfrom analysis.cli import main\nfrom analysis.ranks import pool\n{task}\n"
    script += "pool._task = task\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.Popen(
        [sys.executable, "-c", script, "analyze", str(directory), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | (env or {}),
    )


def _reading_a_rank(directory: Path, scheduler: str, setup: str = "") -> subprocess.Popen:
    """`analyze DIRECTORY --cluster SCHEDULER` (after `setup`, in its process) once a worker is reading a
    rank: the task marks that it started, then sleeps for 60 s."""
    started = directory / "started"
    reading = _reading_with(
        f"{setup}\ndef task(work):\n    open({str(started)!r}, 'w').close()\n    time.sleep(60)",
        directory,
        "--cluster",
        scheduler,
    )
    deadline = time.monotonic() + 60
    while not started.exists() and reading.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return reading


def test_a_worker_that_dies_is_one_line_and_nothing_else(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="cpu")
    no_retries = {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}  # (the first death is the task's)
    died = _reading_with("def task(work):\n    os._exit(3)", tmp_path, "--cluster", "local:1", env=no_retries)
    _, err = died.communicate(timeout=120)
    assert died.returncode == 2 and re.fullmatch(
        r"error: cluster local:1: every worker that read a rank's file died \([^\n]*\)\n", err
    ), err


@contextmanager
def _scheduler_process(workers: int) -> Iterator[tuple[str, subprocess.Popen]]:
    """The address of a LocalCluster of `workers` worker processes that runs in a process of its own
    (killed with them at the end: os.killpg), where a task that fails is not retried, and that process."""
    serving = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom distributed import LocalCluster\n"
            f"with LocalCluster(n_workers={workers}, threads_per_worker=1, dashboard_address=None) as local:\n"
            "    print(local.scheduler_address, flush=True)\n    time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ | {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"},
        start_new_session=True,  # (its worker processes killed with it)
    )
    try:
        yield serving.stdout.readline().strip(), serving
    finally:
        if serving.poll() is None:
            os.killpg(serving.pid, signal.SIGKILL)


def test_a_worker_that_dies_or_a_scheduler_lost_on_a_running_cluster_is_one_line(tmp_path):
    """On a scheduler of its own process (tcp://), with one worker process: a task that kills its worker,
    then the scheduler killed while a rank is read."""
    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="cpu")
    with _scheduler_process(1) as (scheduler, serving):
        died = _reading_with("def task(work):\n    os._exit(3)", tmp_path, "--cluster", scheduler)
        assert (died.wait(120), died.stderr.read()) == (
            2,
            f"error: cluster {scheduler}: every worker that read a rank's file died (out of memory or killed? "
            "their logs say why)\n",
        )
        reading = _reading_a_rank(tmp_path, scheduler)
        os.killpg(serving.pid, signal.SIGKILL)
        assert (reading.wait(60), reading.stderr.read()) == (
            2,
            f"error: cluster {scheduler}: the ranks' reads were cancelled (scheduler-connection-lost): the "
            "scheduler stopped, was killed or cannot be reached?\n",
        )


def test_a_scheduler_that_stops_answering_while_ranks_are_read_is_one_line(tmp_path):
    """The scheduler's process stopped (SIGSTOP) while a rank is read: its connection stays open and silent,
    so asking it for its workers between waits for the result would wait for ever."""
    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="cpu")
    with _scheduler_process(1) as (scheduler, serving):
        reading = _reading_a_rank(
            tmp_path, scheduler, "from analysis.ranks import cluster\ncluster.CONNECT_TIMEOUT = 1.0"
        )
        os.kill(serving.pid, signal.SIGSTOP)  # (the scheduler; its worker processes read on)
        try:
            code, err = reading.wait(30), reading.stderr.read()
        finally:
            os.kill(serving.pid, signal.SIGCONT)
            if reading.poll() is None:
                reading.kill()
    assert (code, err) == (
        2,
        f"error: cluster {scheduler}: the scheduler did not answer for 1 s while the ranks were read (stopped, "
        "overloaded or cut off?)\n",
    )


def test_a_cluster_without_workers_is_one_line_not_a_wait_for_ever(monkeypatch):
    monkeypatch.setattr(cluster, "WORKERLESS_S", 1.0)
    with _scheduler_process(0) as (scheduler, _), cluster.applied(scheduler):
        with pytest.raises(InputError) as none:
            list(cluster.current().map_in_order(abs, [1]))
    assert str(none.value) == (
        f"cluster {scheduler}: no worker to read the ranks for 1 s (none started, or each died or left? "
        "their logs say why)"
    )


def test_workers_that_never_answer_are_one_line_within_the_bound(tmp_path):
    """The scheduler answers, its one worker process is stopped (SIGSTOP): the workers' first question (can
    they import this package) would be waited for for ever."""
    import distributed

    write_run(tmp_path, build("gpipe", 2, 2, 1), shape="cpu")
    with _scheduler_process(1) as (scheduler, _), distributed.Client(scheduler) as client:
        for pid in client.run(os.getpid).values():
            os.kill(pid, signal.SIGSTOP)
        done = _analyze_within(tmp_path, scheduler, 1.0)
    assert (done.returncode, done.stderr) == (
        2,
        f"error: cluster {scheduler}: the workers did not answer within 1 s (busy, or unreachable from the "
        "scheduler?)\n",
    )


def test_a_worker_that_lacks_the_package_is_one_line(scheduler, monkeypatch):
    monkeypatch.setattr(cluster, "_PACKAGE", "not_installed_anywhere")
    with cluster.applied(scheduler):
        with pytest.raises(InputError) as lacking:
            list(cluster.current().map_in_order(abs, [1]))
    assert re.fullmatch(
        rf"cluster {re.escape(scheduler)}: worker tcp://\S+ \(of 2 without it\) cannot import "
        r"not_installed_anywhere: pip install pipeline-bubbles there",
        str(lacking.value),
    ), lacking.value
