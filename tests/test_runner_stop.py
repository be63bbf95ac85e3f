"""runners.stop without torchrun: orphans adopted and stopped, the caller's other children left alone,
and a signal that comes once the run is whole handled as the caller would have."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runners.stop import Stopped, adopting_orphans, stopping

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux's")

# A parent that starts a sleeper in a session of its own (as torchrun starts a worker), says its pid and
# exits: the sleeper is an orphan.
ORPHANING = (
    "import subprocess, sys; "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True, "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(child.pid)"
)


def alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_orphan_is_adopted_and_stopped_and_the_callers_own_children_are_left_alone():
    """The launcher may run inside a process with children of its own (bench, the tests: a process pool's
    forkserver); stopping every child there would have killed them too."""
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with adopting_orphans() as stop_adopted:
            orphan = int(
                subprocess.run([sys.executable, "-c", ORPHANING], capture_output=True, text=True).stdout
            )
            assert alive(orphan) and os.getppid() != orphan
            assert int(Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
            stop_adopted()
        assert not alive(orphan) and alive(own.pid)
    finally:
        own.kill()
        own.wait()


@pytest.fixture
def hang_up_default():
    """SIGHUP as a terminal's process has it: under nohup (a CI script's) it is ignored, and stopping
    leaves an ignored signal ignored, as the caller asked."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


def test_a_stop_signal_raises_once_and_one_after_the_run_is_whole_is_the_callers(hang_up_default):
    """The first signal stops the run; another while it is being stopped changes nothing (a hang-up's
    shell sends SIGTERM too); once the caller says the run is whole, a signal gets the caller's handling.
    Signals are raised in this thread: one sent to the process may land in another of its threads, and
    the handler then runs some lines later."""
    with stopping():
        with pytest.raises(Stopped) as stopped:
            signal.raise_signal(signal.SIGHUP)
            raise AssertionError("the signal raised nothing")
        signal.raise_signal(signal.SIGTERM)  # while the run is being stopped: nothing more
    assert stopped.value.exit_code == 129
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with stopping() as whole:
            whole()
            signal.raise_signal(signal.SIGTERM)
            assert seen == []  # held until the caller's handling is back
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
