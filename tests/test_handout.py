"""analysis.ranks.handout: this process reads while the pool starts, never more than `size` files at once."""

import threading
import time
from multiprocessing.pool import ThreadPool

import pytest

from analysis.ranks.handout import Handout


class Counted:
    """A task function that records where each task ran and the most that ran at once. `hold(task)`, run
    inside the task with the count raised, decides when it ends: no task sleeps, so the order of events is
    set by the test, not by how fast a loaded machine runs the threads."""

    def __init__(self, hold=lambda task: None) -> None:
        self.hold, self.lock = hold, threading.Condition()
        self.running = self.most = 0
        self.where: dict[str, str] = {}

    def __call__(self, task):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.where[task[0]] = threading.current_thread().name
            self.lock.notify_all()
        try:
            self.hold(task)
        finally:
            with self.lock:
                self.running -= 1
                self.lock.notify_all()
        return task[0] * 2

    def wait_until(self, test, seconds: float) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: test(self), timeout=seconds)


def started_on(event: threading.Event, size: int):
    """A pool start that waits for `event`: the pool comes up when the test says so."""

    def start():
        event.wait()
        return ThreadPool(size)

    return start


def test_this_process_reads_while_the_pool_starts_and_never_more_than_size_at_once():
    """This process reads "a", then "b", while the pool is not up; the pool comes up during "b", which
    holds its slot until the pool has taken one of the two: "b" done, this process stops, the pool reads
    the rest. While both slots are held, a third task (a second pool thread) must not start."""
    may_start, release = threading.Event(), threading.Event()
    handout = None

    def hold(task):
        if threading.current_thread().name != "MainThread":
            release.wait(10)
        elif task[0] == "b":
            may_start.set()
            handout.pool.result(timeout=10)
            assert work.wait_until(lambda w: w.running >= 2, 10), "the pool took no task while 'b' ran"
            # both slots held: a handout that let one more start would reach 3 here
            work.wait_until(lambda w: w.running > 2, 0.2)
            release.set()

    work = Counted(hold)
    tasks = [(name,) for name in "abcdefgh"]
    handout = Handout(started_on(may_start, 2), 2, work, tasks)
    try:
        handout.read_here_while_starting()
        results = {name: handout.results[name].result(timeout=10) for name in "abcdefgh"}
    finally:
        may_start.set()  # (close waits for the pool to be up)
        release.set()
        handout.close()
    assert results == {name: name * 2 for name in "abcdefgh"}
    here = [name for name, thread in work.where.items() if thread == "MainThread"]
    assert here == ["a", "b"]  # the largest (first) files while the pool starts, none once it is up
    assert work.most == 2


def test_a_pool_that_fails_to_start_fails_the_tasks_left_instead_of_hanging():
    reading = threading.Event()
    handout = None

    def broken():
        reading.wait()
        raise OSError("no processes")

    def hold(task):  # "a", read here, ends once the pool has failed
        reading.set()
        assert handout.pool.exception(timeout=10) is not None

    handout = Handout(broken, 2, Counted(hold), [("a",), ("b",), ("c",)])
    handout.read_here_while_starting()  # reads "a" here, the pool fails meanwhile
    assert handout.results["a"].result(timeout=5) == "aa"
    for name in "bc":
        with pytest.raises(OSError, match="no processes"):
            handout.results[name].result(timeout=5)
    handout.close()


def test_an_error_in_a_task_read_here_is_raised_and_close_stops_the_pool():
    made: list[Handout] = []

    def failing(task):
        raise ValueError(task[0])

    def start():  # the pool comes up only once the handout is closed
        while not (made and made[0].closed):
            time.sleep(0.001)
        return ThreadPool(1)

    handout = Handout(start, 1, failing, [("a",), ("b",)])
    made.append(handout)
    with pytest.raises(ValueError, match="a"):
        handout.read_here_while_starting()
    handout.close()
    assert not handout.results["b"].done()  # never handed out once closed
