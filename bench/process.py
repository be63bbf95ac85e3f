"""Run one benchmark child process with a time cap; its wall time, its own timing and its peak RSS.

Memory: the child reports its own high-water mark (VmHWM) when it finishes; the parent samples the
RSS summed over the child and its workers (HTA and our analyze read ranks in a process pool) every
SAMPLE_S, which also gives how far a child had got when it was stopped, and the largest single
process's RSS among them (what one rank's reading costs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SAMPLE_S = 0.1


@dataclass(frozen=True)
class ChildRun:
    task: str
    status: str  # ok | timeout | failed
    wall_s: float  # the whole process: interpreter start, imports, work
    work_s: float | None  # the work alone, as the child timed it
    peak_rss_mb: float  # the child's own high-water mark (VmHWM; sampled when it did not finish)
    tree_rss_mb: float  # peak of the RSS summed over the child and its workers (HTA's pool), sampled
    rows: int | None  # events or cells it produced, to show the work was done
    detail: str  # last line of its stderr when it failed
    largest_rss_mb: float = 0.0  # the largest sampled RSS of one process of the tree (its own peak too)
    processes: int | None = None  # processes it read the ranks with, as it said
    started_rss_mb: float = 0.0  # its RSS when the work began: the interpreter and the imports
    work_cpu_s: float | None = None  # its own CPU time in the work (its workers' not included)
    replay_s: float | None = None  # analyze: of work_s, the steps' own replays and critical paths

    def to_json(self) -> dict:
        return asdict(self)


def _status_kib(pid: int, key: str) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone between listing and reading
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith(key)), 0)


def _tree(pid: int) -> list[int]:
    """pid and every descendant (HTA forks a pool), from /proc's children lists."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        try:
            queue += [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
        except OSError:
            pass
    return found


def _watch(pid: int, timeout_s: float) -> tuple[int, bool, float, float]:
    """Wait for pid, killing its process group after timeout_s; (wait status, killed, peak tree RSS,
    peak RSS of one process of it), in MiB.

    The tree's RSS is sampled (VmRSS summed over the child and its workers); ru_maxrss cannot serve:
    Linux carries the forking parent's high-water mark into the child across exec.
    """
    deadline, peak_kib, largest_kib, killed = time.monotonic() + timeout_s, 0, 0, False
    while True:
        done, status, _ = os.wait4(pid, os.WNOHANG)
        if done:
            return status, killed, peak_kib / 1024, largest_kib / 1024
        sizes = [_status_kib(member, "VmRSS:") for member in _tree(pid)]
        peak_kib, largest_kib = max(peak_kib, sum(sizes)), max(largest_kib, *sizes, 0)
        if not killed and time.monotonic() > deadline:
            killed = True
            os.killpg(pid, signal.SIGKILL)
        time.sleep(SAMPLE_S)


def run_child(task: str, arguments: list[str], timeout_s: float, cwd: Path) -> ChildRun:
    """`python -m bench.child TASK ARGS...`, killed (with its workers) after timeout_s."""
    command = [sys.executable, "-m", "bench.child", task, *arguments]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, cwd=cwd, start_new_session=True)
        status, killed, tree_peak, largest = _watch(process.pid, timeout_s)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
        wall = time.perf_counter() - began
        out.seek(0)
        err.seek(0)
        report, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if killed:
        return ChildRun(
            task, "timeout", wall, None, tree_peak, tree_peak, None, f"killed after {timeout_s:.0f} s"
        )
    if process.returncode != 0 or not report.strip():
        last = (stderr.strip().splitlines() or ["no output"])[-1][:200]
        return ChildRun(
            task, "failed", wall, None, tree_peak, tree_peak, None, f"exit {process.returncode}: {last}"
        )
    child = json.loads(report.strip().splitlines()[-1])
    return ChildRun(
        task,
        "ok",
        wall,
        child["seconds"],
        child["rss_mb"],
        max(tree_peak, child["rss_mb"]),
        child["rows"],
        "",
        max(largest, child["rss_mb"]),
        child.get("processes"),
        child["started_rss_mb"],
        child.get("cpu_seconds"),
        child.get("replay_seconds"),
    )
