"""Stopping a run as a whole: the signals that end it, and every process it started (torch-free).

torchrun starts each worker in a session of its own, so a signal to the launcher's process group (a
terminal's Ctrl-C or hang-up) does not reach them, and a worker whose torchrun died keeps running.
Hence: the launcher turns SIGINT, SIGTERM and SIGHUP into `Stopped` while its run lives and passes
SIGTERM on to torchrun, which passes it on to its workers; the launcher is the workers' subreaper, so a
worker whose torchrun died (SIGKILL) is its child and is stopped by it (`adopting_orphans`); and a process
of the run gets SIGTERM when its parent dies (`die_with_parent`): make's SIGTERM ends the shell of its
recipe, not the launcher, and a SIGKILLed launcher leaves torchrun behind. Linux only (prctl, /proc);
elsewhere the launcher still stops torchrun on a signal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 10  # how long an adopted worker gets to end after SIGTERM before SIGKILL
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36  # <linux/prctl.h>


class Stopped(BaseException):
    """A stop signal arrived (a BaseException, as KeyboardInterrupt is: no `except Exception` holds it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's code for a process ended by this signal


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0


def die_with_parent(parent: int | None = None) -> None:
    """SIGTERM this process when its parent dies; at once where it is no longer `parent` (default: the
    parent when called), which it died before this took effect. A child between fork and exec (Popen's
    preexec_fn) passes its parent's pid: the setting outlives the exec."""
    parent = os.getppid() if parent is None else parent
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def stopping() -> Iterator[Callable[[], None]]:
    """Within: the first stop signal raises Stopped (the ones after it, while the run is being stopped,
    change nothing: a hang-up that ends make's shell brings the parent-death SIGTERM too), until the caller
    calls what this yields (its run is whole, there is nothing left to stop); one that comes after that
    is raised again on leaving, with the caller's own handling. A signal the caller's parent set to be
    ignored (nohup's SIGHUP, SIGINT of a background job) stays ignored. Only the main thread can take
    signals: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    stopped, whole, late = [], [], []

    def stop(signum: int, frame: object) -> None:
        if whole:
            late.append(signum)
        elif not stopped:
            stopped.append(signum)
            raise Stopped(signum)

    previous = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, stop)
    try:
        yield lambda: whole.append(True)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in late:
            signal.raise_signal(signum)


@contextmanager
def signals_held() -> Iterator[None]:
    """Within: the stop signals wait (blocked) until the block ends, so what it does is done whole."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _children() -> list[int]:
    """This process's children, from /proc (an adopted orphan is one; a finished one is a zombie)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == me:
            found.append(int(entry.name))
    return found


def _reaped(pid: int, block: bool) -> bool:
    try:
        return os.waitpid(pid, 0 if block else os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def _stop(children: set[int]) -> None:
    """SIGTERM these children, SIGKILL those still alive after STOP_GRACE_S, and reap them all. Each
    worker leads its own session, so its process group is its own."""
    for pid in children:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)  # not a group leader (or a zombie already): the process alone
    deadline = time.monotonic() + STOP_GRACE_S
    waiting = [pid for pid in children if not _reaped(pid, block=False)]
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        waiting = [pid for pid in waiting if not _reaped(pid, block=False)]
    for pid in waiting:
        os.kill(pid, signal.SIGKILL)
        _reaped(pid, block=True)


@contextmanager
def adopting_orphans() -> Iterator[Callable[[], None]]:
    """Within: this process is the subreaper of its descendants (one whose parent dies becomes its
    child). Yields what stops the children adopted since, or started since and not reaped (the workers
    of a torchrun that died first); children it had before (a process pool's) are left alone."""
    if not sys.platform.startswith("linux"):
        yield lambda: None
        return
    had = set(_children())
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield lambda: _stop(set(_children()) - had)
    finally:
        _prctl(_PR_SET_CHILD_SUBREAPER, 0)
