"""`--cluster ADDRESS` / `--cluster local:N`: a run's ranks read on a Dask distributed cluster in place of
this machine's pool (analysis.ranks.pool).

The per-rank function is mapped over the files there and its results are taken here in file order, so
the reader charges the run's limits, raises the errors and warns the warnings exactly as with `--jobs`;
the cross-rank step runs here. `local:N` starts a LocalCluster of N single-threaded worker processes on
this machine; any other value is a running scheduler's address (`tcp://HOST:PORT`), whose workers read
the files by the same paths (shared storage) and import this package. Only the per-rank tables and each
file's warnings and errors come back, a few MB a rank.

A command sets the cluster for its duration (`applied`); the cluster is started (or connected to) when a
run is first read and closed when the command ends, so `report` uses one cluster for all its runs. Dask
is the `[cluster]` extra, imported only here and only when a cluster is used.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from contextvars import ContextVar
from typing import Any

from analysis.errors import InputError
from analysis.ranks.workers import main_not_rerun

LOCAL = "local:"
# Seconds a scheduler or its workers have to answer when first connected to, and the scheduler while the
# ranks are read (a local:N cluster's own start is not cut short: local_cluster).
CONNECT_TIMEOUT = 20.0
# Dask's log lines, silenced while a command uses a cluster (here and in a LocalCluster's workers): what fails
# there reaches the user as this package's one line (InputError), never as Dask's log of it beside.
SILENT = logging.CRITICAL + 1
# A rank's result is waited for WAIT_S at a time, and the cluster checked to have a worker between waits;
# none for WORKERLESS_S (longer than a nanny takes to restart a dead worker) ends the command.
WAIT_S = 1.0
WORKERLESS_S = 20.0
_INSTALL = "pip install 'pipeline-bubbles[cluster]'"
_PACKAGE = __name__.partition(".")[0]  # what the workers import to run the per-rank function
_CURRENT: ContextVar[Cluster | None] = ContextVar("cluster", default=None)


def address(text: str) -> str:
    """`local:N` (N >= 1) or a scheduler's address, as given."""
    if text.startswith(LOCAL):
        count = text.removeprefix(LOCAL)
        if not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"not local:N with a whole number N >= 1: {text!r}")
    elif not text:
        raise argparse.ArgumentTypeError("an empty address")
    return text


def add_argument(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
    parser.add_argument(
        "--cluster",
        type=address,
        default=None,
        metavar="ADDRESS",
        help="read the ranks on a Dask cluster: a scheduler's address (tcp://HOST:PORT, workers sharing "
        "the trace storage) or local:N for N worker processes here (the [cluster] extra)",
    )


class Cluster:
    """One command's cluster: started or connected to on first use, closed with the command."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.client: Any = None
        self.held = ExitStack()  # what the command's cluster holds open, closed with the command

    def map_in_order(self, work: Callable[[Any], Any], tasks: list) -> Iterator[Any]:
        """`work` over `tasks` on the cluster, the results yielded in the tasks' order; the results not
        yet taken are cancelled when the caller stops early."""
        client = self._client()
        from distributed import KilledWorker
        from distributed.client import FutureCancelledError

        pending = deque(client.map(work, tasks, pure=False))
        try:
            while pending:
                try:
                    yield self._result(
                        pending.popleft()
                    )  # (the future dropped: its result is released there)
                except KilledWorker:  # (also a worker that cannot load the task: joined after the check)
                    raise InputError(
                        None,
                        f"cluster {self.spec}: every worker that read a rank's file died (out of memory or "
                        "killed? their logs say why)",
                    ) from None
                except FutureCancelledError as error:  # (all of them, when the client loses its scheduler)
                    raise InputError(
                        None,
                        f"cluster {self.spec}: the ranks' reads were cancelled ({error.reason}): the scheduler "
                        "stopped, was killed or cannot be reached?",
                    ) from None
        finally:
            if pending:
                client.cancel(list(pending))

    def _result(self, future: Any) -> Any:
        """The future's result; an InputError once the cluster has had no worker for WORKERLESS_S (a worker
        without a nanny that died, or none started: the scheduler would wait for one for ever)."""
        since = None
        while True:
            try:
                return future.result(timeout=WAIT_S)
            except TimeoutError:
                if self._workers():
                    since = None
                    continue
                since = time.monotonic() if since is None else since
                if time.monotonic() - since >= WORKERLESS_S:
                    raise InputError(
                        None,
                        f"cluster {self.spec}: no worker to read the ranks for {WORKERLESS_S:g} s (none "
                        "started, or each died or left? their logs say why)",
                    ) from None

    def _workers(self) -> dict:
        """The scheduler's workers (address -> threads); an InputError once it has not answered for
        CONNECT_TIMEOUT (stopped or cut off: Dask would wait for its answer for ever)."""
        try:
            return self.client.nthreads(callback_timeout=CONNECT_TIMEOUT)
        except TimeoutError:
            raise InputError(
                None,
                f"cluster {self.spec}: the scheduler did not answer for {CONNECT_TIMEOUT:g} s while the ranks "
                "were read (stopped, overloaded or cut off?)",
            ) from None

    def _client(self) -> Any:
        if self.client is not None:
            return self.client
        try:
            import distributed
        except ImportError:
            raise InputError(None, f"--cluster needs Dask's distributed package: {_INSTALL}") from None
        from distributed.utils import silence_logging_cmgr

        self.held.enter_context(silence_logging_cmgr(SILENT))  # (Dask's one handler for all its loggers)
        scheduler = self.spec
        if self.spec.startswith(LOCAL):
            local = self.held.enter_context(local_cluster(int(self.spec.removeprefix(LOCAL))))
            scheduler = local.scheduler_address
        loop = self.held.enter_context(_loop())
        try:
            self.client = _started(
                loop,
                lambda: distributed.Client(scheduler, timeout=CONNECT_TIMEOUT, asynchronous=True),
                f"cluster {self.spec}: cannot connect (no answer from the scheduler within {CONNECT_TIMEOUT:g} s: "
                "is it a Dask scheduler's address, and is it running?)",
            )
        except (OSError, ValueError) as error:
            raise InputError(None, f"cluster {self.spec}: cannot connect ({error})") from None
        self.held.callback(self.client.close)
        # A worker that cannot import the task's package dies loading it, which would say only that it died.
        try:
            found = self.client.run(importlib.util.find_spec, _PACKAGE, callback_timeout=CONNECT_TIMEOUT)
        except TimeoutError:
            raise InputError(
                None,
                f"cluster {self.spec}: the workers did not answer within {CONNECT_TIMEOUT:g} s (busy, or "
                "unreachable from the scheduler?)",
            ) from None
        lacking = sorted(worker for worker, spec in found.items() if spec is None)
        if lacking:
            raise InputError(
                None,
                f"cluster {self.spec}: worker {lacking[0]} (of {len(lacking)} without it) cannot "
                f"import {_PACKAGE}: pip install pipeline-bubbles there",
            )
        return self.client

    def close(self) -> None:
        self.held.close()  # (the client, its loop, then the local cluster; Dask still quiet while they close)


@contextmanager
def local_cluster(workers: int) -> Iterator[Any]:
    """A LocalCluster of `workers` single-threaded processes on this machine, closed at the end; quiet: its
    scheduler's HTTP server (always started) on a free local port, not on 8787 where another cluster may be
    (a warning), and no dashboard. Its start is not cut short: Dask spawns the worker processes from
    threads of its own, and a start cancelled midway left one spawned after it, reaped with a log line at
    exit (2 of 12 runs on a loaded machine)."""
    import distributed

    with main_not_rerun():
        local = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
            silence_logs=SILENT,
        )
    try:
        yield local
    finally:
        local.close()


@contextmanager
def _loop() -> Iterator[Any]:
    """An event loop in a thread of its own, stopped at the end: the Dask client is made asynchronous on it
    so that its start can be bounded (`_started`), then used from this thread as usual."""
    from distributed.utils import LoopRunner

    runner = LoopRunner()
    runner.start()
    try:
        yield runner.loop
    finally:
        runner.stop()


def _started(loop: Any, make: Callable[[], Any], late: str) -> Any:
    """`make()`, a Dask Client made asynchronous on `loop`, once started there; else closed,
    and an InputError saying `late`, after CONNECT_TIMEOUT. Dask bounds a synchronous start's TCP connect
    only, not what follows (the handshake): a peer that accepts and never answers would be waited for ever."""
    from distributed.utils import sync

    async def made() -> Any:
        return make()

    part = sync(loop, made)
    try:
        return sync(loop, lambda: part, callback_timeout=CONNECT_TIMEOUT)
    except TimeoutError:
        with suppress(Exception):  # (best effort: a client whose start was cut short)
            part.close(timeout=CONNECT_TIMEOUT)
        raise InputError(None, late) from None


def current() -> Cluster | None:
    """The command's cluster, None where the ranks are read on this machine."""
    return _CURRENT.get()


@contextmanager
def applied(spec: str | None) -> Iterator[None]:
    chosen = None if spec is None else Cluster(spec)
    token = _CURRENT.set(chosen)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        if chosen is not None:
            chosen.close()
