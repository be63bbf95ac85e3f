"""Which process reads which file: this one while the pool starts, then the pool's, at most `size` at once.

A pool costs its start, its server's imports (about 0.4 s of a core, analysis.ranks.workers). This process
reads the largest files meanwhile, and the pool takes the others as it comes up: a feeding thread hands
it one file each time one of the `size` slots frees, so no more files are read at once than the pool
has processes (`--jobs` and the memory bound of analysis.ranks.workers hold while this process reads too).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.pool import Pool
from typing import Any


class Handout:
    """`work` over `tasks` (largest first), each result a Future under its task's key (`task[0]`)."""

    def __init__(
        self, start_pool: Callable[[], Pool], size: int, work: Callable[[Any], Any], tasks: list
    ) -> None:
        self.work, self.slots, self.lock = work, threading.Semaphore(size), threading.Lock()
        self.queue, self.closed = deque(tasks), False
        self.results: dict[Any, Future] = {task[0]: Future() for task in tasks}
        self.pool: Future = Future()
        threading.Thread(target=self._start, args=(start_pool,), daemon=True).start()
        threading.Thread(target=self._feed, daemon=True).start()

    def read_here_while_starting(self) -> None:
        """Read tasks in this process until the pool is up (or none is left)."""
        while not self.pool.done():
            task = self._next()
            if task is None:
                return
            try:
                self.results[task[0]].set_result(self.work(task))
            except BaseException as error:
                self.results[task[0]].set_exception(error)
                raise
            finally:
                self.slots.release()

    def close(self) -> None:
        """Stop handing out, and stop the pool once it is up."""
        self.closed = True
        self.slots.release()  # (wakes the feeding thread, which sees `closed`)
        try:
            self.pool.result().terminate()
        except Exception:  # (a pool that failed to start said so to the tasks it left)
            pass

    def _next(self) -> Any:
        """The next task, holding a slot; None (no slot held) when none is left or the handout is closed."""
        self.slots.acquire()
        with self.lock:
            if self.queue and not self.closed:
                return self.queue.popleft()
        self.slots.release()
        return None

    def _start(self, start_pool: Callable[[], Pool]) -> None:
        try:
            self.pool.set_result(start_pool())
        except BaseException as error:
            self.pool.set_exception(error)

    def _feed(self) -> None:
        try:
            pool = self.pool.result()
        except BaseException as error:
            with self.lock:
                for task in self.queue:
                    self.results[task[0]].set_exception(error)
                self.queue.clear()
            return
        while (task := self._next()) is not None:
            done = self.results[task[0]]
            pool.apply_async(
                self.work,
                (task,),
                callback=lambda result, done=done: self._finished(done.set_result, result),
                error_callback=lambda error, done=done: self._finished(done.set_exception, error),
            )

    def _finished(self, settle: Callable[[Any], None], value: Any) -> None:
        self.slots.release()
        settle(value)
