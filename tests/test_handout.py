"""analysis.ranks.handout: this process reads while the pool starts, never more than `size` files at once."""

import threading
import time
from multiprocessing.pool import ThreadPool

import pytest

from analysis.ranks.handout import Handout


class Counted:
    """A task function that records where each task ran and the most that ran at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.lock = seconds, threading.Lock()
        self.running = self.most = 0
        self.where: dict[str, str] = {}

    def __call__(self, task):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.where[task[0]] = threading.current_thread().name
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return task[0] * 2


def slow_start(seconds: float, size: int):
    def start():
        time.sleep(seconds)
        return ThreadPool(size)

    return start


def test_this_process_reads_while_the_pool_starts_and_never_more_than_size_at_once():
    work = Counted(0.05)
    tasks = [(name,) for name in "abcdefgh"]
    handout = Handout(slow_start(0.12, 2), 2, work, tasks)
    try:
        handout.read_here_while_starting()
        results = {name: handout.results[name].result(timeout=10) for name in "abcdefgh"}
    finally:
        handout.close()
    assert results == {name: name * 2 for name in "abcdefgh"}
    here = [name for name, thread in work.where.items() if thread == "MainThread"]
    assert here[:1] == ["a"] and 1 <= len(here) < 8  # the largest (first) file, then the pool's turn
    assert work.most <= 2


def test_a_pool_that_fails_to_start_fails_the_tasks_left_instead_of_hanging():
    def broken():
        time.sleep(0.05)
        raise OSError("no processes")

    handout = Handout(broken, 2, Counted(0.2), [("a",), ("b",), ("c",)])
    handout.read_here_while_starting()  # reads "a" here, the pool fails meanwhile
    assert handout.results["a"].result(timeout=5) == "aa"
    for name in "bc":
        with pytest.raises(OSError, match="no processes"):
            handout.results[name].result(timeout=5)
    handout.close()


def test_an_error_in_a_task_read_here_is_raised_and_close_stops_the_pool():
    def failing(task):
        raise ValueError(task[0])

    handout = Handout(slow_start(0.2, 1), 1, failing, [("a",), ("b",)])
    with pytest.raises(ValueError, match="a"):
        handout.read_here_while_starting()
    handout.close()
    assert not handout.results["b"].done()  # never handed out once closed
