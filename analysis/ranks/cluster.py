"""`--cluster ADDRESS` / `--cluster local:N`: a run's ranks read on a Dask distributed cluster in place of
this machine's pool (analysis.ranks.pool).

The per-rank function is mapped over the files there and its results are taken here in file order, so
the reader charges the run's limits, raises the errors and warns the warnings exactly as with `--jobs`;
the cross-rank step runs here. `local:N` starts a LocalCluster of N single-threaded worker processes on
this machine; any other value is a running scheduler's address (`tcp://HOST:PORT`), whose workers read
the files by the same paths (shared storage) and import this package. Only the per-rank tables and each
file's warnings and errors come back, a few MB a rank.

A command sets the engine for its duration (`applied`); the cluster is started (or connected to) when a
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
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from typing import Any

from analysis.errors import InputError

LOCAL = "local:"
CONNECT_TIMEOUT = "20s"
# Dask's log lines, silenced while a command uses a cluster (here and in a LocalCluster's workers): what fails
# there reaches the user as this package's one line (InputError), never as Dask's log of it beside.
SILENT = logging.CRITICAL + 1
# A rank's result is waited for WAIT_S at a time, and the cluster checked to have a worker between waits;
# none for WORKERLESS_S (longer than a nanny takes to restart a dead worker) ends the command.
WAIT_S = 1.0
WORKERLESS_S = 20.0
_INSTALL = "pip install 'pipeline-bubbles[cluster]'"
_PACKAGE = __name__.partition(".")[0]  # what the workers import to run the per-rank function
_CURRENT: ContextVar[Engine | None] = ContextVar("cluster", default=None)


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


class Engine:
    """One command's cluster: started or connected to on first use, closed with the command."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.client: Any = None
        self.local: Any = None
        self.quiet = ExitStack()

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
                if self.client.nthreads():
                    since = None
                    continue
                since = time.monotonic() if since is None else since
                if time.monotonic() - since >= WORKERLESS_S:
                    raise InputError(
                        None,
                        f"cluster {self.spec}: no worker to read the ranks for {WORKERLESS_S:g} s (none "
                        "started, or each died or left? their logs say why)",
                    ) from None

    def _client(self) -> Any:
        if self.client is not None:
            return self.client
        try:
            import distributed
        except ImportError:
            raise InputError(None, f"--cluster needs Dask's distributed package: {_INSTALL}") from None
        from distributed.utils import silence_logging_cmgr

        self.quiet.enter_context(silence_logging_cmgr(SILENT))  # (Dask's one handler for all its loggers)
        if self.spec.startswith(LOCAL):
            self.local = local_cluster(int(self.spec.removeprefix(LOCAL)))
            self.client = distributed.Client(self.local)
        else:
            try:
                self.client = distributed.Client(self.spec, timeout=CONNECT_TIMEOUT)
            except (OSError, ValueError) as error:
                raise InputError(None, f"cluster {self.spec}: cannot connect ({error})") from None
        # A worker that cannot import the task's package dies loading it, which would say only that it died.
        found = self.client.run(importlib.util.find_spec, _PACKAGE)
        lacking = sorted(worker for worker, spec in found.items() if spec is None)
        if lacking:
            raise InputError(
                None,
                f"cluster {self.spec}: worker {lacking[0]} (of {len(lacking)} without it) cannot "
                f"import {_PACKAGE}: pip install pipeline-bubbles there",
            )
        return self.client

    def close(self) -> None:
        with self.quiet:  # (closing may log too)
            for part in (self.client, self.local):
                if part is not None:
                    part.close()


def local_cluster(workers: int) -> Any:
    """A LocalCluster of `workers` single-threaded processes on this machine, quiet: its scheduler's HTTP
    server (always started) on a free local port, not on 8787 where another cluster may be (a warning),
    and no dashboard."""
    import distributed

    from analysis.ranks.pool import main_not_rerun

    with main_not_rerun():
        return distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
            silence_logs=SILENT,
        )


def current() -> Engine | None:
    """The command's cluster, None where the ranks are read on this machine."""
    return _CURRENT.get()


@contextmanager
def applied(spec: str | None) -> Iterator[None]:
    engine = None if spec is None else Engine(spec)
    token = _CURRENT.set(engine)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        if engine is not None:
            engine.close()
