"""How long the executing thread sat runnable but not running: the kernel's run-queue delay (Linux).

`/proc/thread-self/schedstat` holds three numbers: ns on a CPU, ns runnable but waiting for one (the
run-queue delay), and timeslices. The native executor samples the file at the start and at the end of
every action, inside the action's span, on the wall clock (time.time_ns, the profiler's clock, as the
stash meter does); at export each sample becomes one `PP run queue` counter event carrying the
cumulative delay, so the delay inside a span is the difference of its two samples. That is the part of
a slowdown on a CPU run spent waiting for a core that another rank (or process) held.

A sample is one pread of a file kept open (about a microsecond); parsing waits for the export. The file
is opened on the first sample, by the thread that samples: /proc/thread-self names the opening thread,
and the executor runs a rank's actions on one thread. Where the file is absent (not Linux) the meter
records nothing. Only the executing thread is measured: intra-op worker threads (more than one thread
per rank) have their own counters.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from runners.schedules.trace_names import RUN_QUEUE_COUNTER
from runners.stash import counter_event

SCHEDSTAT = "/proc/thread-self/schedstat"


def run_delay_ns(schedstat: bytes) -> int:
    """The second field of a schedstat line: cumulative ns runnable but waiting for a CPU."""
    return int(schedstat.split()[1])


@dataclass
class RunQueueMeter:
    """(time_ns, raw schedstat line) per sample; `available` is False where there is no such file."""

    path: str = SCHEDSTAT
    samples: list[tuple[int, bytes]] = field(default_factory=list)
    available: bool = field(init=False)
    _fd: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.available = os.path.exists(self.path)

    def sample(self) -> None:
        if not self.available:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        self.samples.append((time.time_ns(), os.pread(self._fd, 64, 0)))

    def values(self) -> list[tuple[int, int]]:
        """(time_ns, cumulative run_delay_ns) per sample."""
        return [(t, run_delay_ns(line)) for t, line in self.samples]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def uncontended_ms(ms: float, run_delay_ns: int, span_ns: int) -> float:
    """The part of `ms` of work inside a span of `span_ns` that was not spent waiting for a core, the
    span's run-queue delay taken as spread evenly over it (as analysis.attribution.parts.with_contention
    takes a cell's share of its action's delay)."""
    return ms * (1.0 - min(max(run_delay_ns / span_ns, 0.0), 1.0)) if span_ns > 0 else ms


def run_queue_events(samples: Iterable[tuple[int, int]], base_ns: int) -> list[bytes]:
    return [
        counter_event(RUN_QUEUE_COUNTER, t, base_ns, {"run_delay_ns": delay}, "pp_sched")
        for t, delay in samples
    ]
