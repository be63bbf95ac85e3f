"""An event-driven simulation of the native executor's step (runners/execute.py), written apart from the
analysis and from runners.schedules.simulate, so that the synthetic ground truth is not the analysis's own
replay graded against itself.

Each rank runs its lowered order on one thread, one action at a time. An action begins `host.lead_ns`
after the rank is free (host time between actions, on the thread, outside every span), then:

- compute (F, B, I, W): `host.within_ns(action)` of host time inside its span, then its work;
- SEND, asynchronous (isend, the native executor's): the send is posted the moment its call begins, the
  call holds the thread for `transport.send_call_ns` and returns; the transfer goes on without the thread;
- SEND, blocking (`transport.blocking_sends`): the thread is held from the call until the sender's part
  of the transfer is done (`Transport.released`);
- RECV: posted when it begins; the thread blocks until the message is delivered (`Transport.delivered`).

After its last action a rank waits for every send it posted to be released (the `PP wait for sends`
span), then runs its tail (`host.tail_ns`, the optimizer step). The step ends when the last rank's tail
does: a barrier, so every rank's step has that length, and the next step starts from the same origin.

The transport decides when a message moves (both posts in integer ns from the step's origin):

- `rendezvous` (gloo's tcp pairs): nothing moves until both sides have posted; the receive completes at
  max(recv posted, send posted) + transfer, and so does the sender's part: a receiver that posts late
  still blocks for the whole transfer, and a blocking sender waits for its receiver;
- `eager` (NCCL's small messages): the data leaves when the send is posted and arrives `transfer_ns`
  later whether or not the receiver is there; the receive completes at max(recv posted, send posted +
  transfer), the sender's part at send posted + transfer.

The simulation is a priority queue of (time, rank, event) processed in time order; a rank's state only
changes at its own events, and a message is matched when its second post happens. Deadlock (a rank
blocked on a message whose partner never posts) raises DeadlockError naming the blocked actions.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from runners.schedules import Action, Kind, Schedule
from runners.schedules.dependencies import matching_recv, matching_send

RENDEZVOUS, EAGER = "rendezvous", "eager"
SENDS, RECVS = (Kind.SEND_F, Kind.SEND_B), (Kind.RECV_F, Kind.RECV_B)


class DeadlockError(RuntimeError):
    """Some rank waits for a message whose partner can never post it."""


@dataclass(frozen=True)
class Transport:
    """How a message between two ranks moves (module docstring); times in ns."""

    semantics: str = RENDEZVOUS  # RENDEZVOUS or EAGER
    transfer_ns: int = 0  # rendezvous: the transfer once both posted; eager: the latency after the send
    send_call_ns: int = 0  # an asynchronous SEND's call on the sender's thread
    blocking_sends: bool = False  # the SEND's call lasts until the sender's part is released

    def __post_init__(self) -> None:
        if self.semantics not in (RENDEZVOUS, EAGER):
            raise ValueError(f"transport semantics {self.semantics!r}: one of {RENDEZVOUS}, {EAGER}")

    def delivered(self, send_posted: int, recv_posted: int) -> int:
        """When the receive completes."""
        if self.semantics == RENDEZVOUS:
            return max(send_posted, recv_posted) + self.transfer_ns
        return max(recv_posted, send_posted + self.transfer_ns)

    def released(self, send_posted: int, recv_posted: int) -> int:
        """When the sender's part is done: with a rendezvous the delivery, eagerly the data's arrival."""
        if self.semantics == RENDEZVOUS:
            return self.delivered(send_posted, recv_posted)
        return send_posted + self.transfer_ns


@dataclass(frozen=True)
class HostTime:
    """Host time on each rank's thread, ns: before every action (`before_ns`, plus `stalls` before the
    chosen actions), inside every compute action before its work (`inside_ns`, plus `sleeps` in the
    chosen ones: runners.inject's host stall), and the tail after the sends."""

    before_ns: int = 0
    inside_ns: int = 0
    tail_ns: int = 0
    stalls: Mapping[Action, int] = field(default_factory=dict)
    sleeps: Mapping[Action, int] = field(default_factory=dict)

    def lead_ns(self, action: Action) -> int:
        return self.before_ns + self.stalls.get(action, 0)

    def within_ns(self, action: Action) -> int:
        return self.inside_ns + self.sleeps.get(action, 0)


@dataclass(frozen=True)
class Executed:
    """One action as it ran, ns from the step's origin: its span [start, end]; for compute, its work
    begins at `work_start`; for a RECV or a blocking SEND, `partner_posted` is when the other side posted
    (the thread blocked from `start` to `end`)."""

    rank: int
    action: Action
    start: int
    end: int
    work_start: int | None = None
    partner_posted: int | None = None


@dataclass(frozen=True)
class RankEnd:
    """How a rank's step ends, ns: its last action's end, the end of its wait for its sends (and the
    latest post of those sends' receivers, None without sends), the end of its tail; with data
    parallelism (synthetic.executor_dp) the end of the gradients' all-reduce, which starts at sends_done
    and comes before the tail, and when it is called where that is later (`sync_called`: a late launch,
    nothing recorded before it, the rank's time the same)."""

    lane_end: int
    sends_done: int
    last_receiver_post: int | None
    tail_end: int
    synced: int | None = None
    sync_called: int | None = None


@dataclass(frozen=True)
class StepRun:
    """One simulated step: every action per rank in its order, each rank's end, the step's length, and
    when each SEND's sender part was released (Transport.released)."""

    actions: dict[int, list[Executed]]
    ends: dict[int, RankEnd]
    step_ns: int
    released: dict[Action, int]


@dataclass
class _Message:
    """One SEND and its RECV: each side's post, and which rank is blocked on the message."""

    send_posted: int | None = None
    recv_posted: int | None = None
    blocked: list[int] = field(default_factory=list)

    @property
    def matched(self) -> bool:
        return self.send_posted is not None and self.recv_posted is not None


class _Simulation:
    FREE, BEGIN = 0, 1  # events: a rank's thread is free; a rank begins its next action

    def __init__(
        self, schedule: Schedule, work_ns: Callable[[Action], int], transport: Transport, host: HostTime
    ):
        self.orders, self.work_ns, self.transport, self.host = schedule.orders, work_ns, transport, host
        self.position = [0] * schedule.p
        self.actions: dict[int, list[Executed]] = {r: [] for r in range(schedule.p)}
        self.ends: dict[int, RankEnd] = {}
        self.messages: dict[Action, _Message] = {}  # keyed by the RECV
        self.pending: dict[int, tuple[int, Action]] = {}  # rank -> (its start, the action it is blocked in)
        self.draining: dict[int, int] = {}  # rank -> its lane end, while it waits for undelivered sends
        self.queue: list[tuple[int, int, int, int]] = []
        self.sequence = 0

    def push(self, time: int, rank: int, event: int) -> None:
        self.sequence += 1
        heapq.heappush(self.queue, (time, self.sequence, rank, event))

    def run(self) -> StepRun:
        for rank in range(len(self.orders)):
            self.push(0, rank, self.FREE)
        while self.queue:
            time, _, rank, event = heapq.heappop(self.queue)
            (self.free if event == self.FREE else self.begin)(rank, time)
        if len(self.ends) < len(self.orders):
            raise DeadlockError(self._stuck())
        step_ns = max(end.tail_end for end in self.ends.values())
        released = {
            matching_send(recv): self.transport.released(m.send_posted, m.recv_posted)
            for recv, m in self.messages.items()
        }
        return StepRun(self.actions, dict(sorted(self.ends.items())), step_ns, released)

    def free(self, rank: int, time: int) -> None:
        """The rank's thread is free at `time`: the host time before its next action, or the step's end."""
        order = self.orders[rank]
        if self.position[rank] < len(order):
            self.push(time + self.host.lead_ns(order[self.position[rank]]), rank, self.BEGIN)
        else:
            self.draining[rank] = time
            self._drain(rank)

    def begin(self, rank: int, time: int) -> None:
        """The rank begins its next action at `time`."""
        action = self.orders[rank][self.position[rank]]
        if action.kind.is_compute:
            work_start = time + self.host.within_ns(action)
            self._finish(rank, Executed(rank, action, time, work_start + self.work_ns(action), work_start))
        elif action.kind in SENDS:
            message = self.messages.setdefault(matching_recv(action), _Message())
            message.send_posted = time
            if self.transport.blocking_sends:
                self._block(rank, time, action, message)
            else:
                self._finish(rank, Executed(rank, action, time, time + self.transport.send_call_ns))
            self._on_post(message)
        else:
            message = self.messages.setdefault(action, _Message())
            message.recv_posted = time
            self._block(rank, time, action, message)
            self._on_post(message)

    def _finish(self, rank: int, executed: Executed) -> None:
        self.actions[rank].append(executed)
        self.position[rank] += 1
        self.push(executed.end, rank, self.FREE)

    def _block(self, rank: int, time: int, action: Action, message: _Message) -> None:
        self.pending[rank] = (time, action)
        message.blocked.append(rank)

    def _on_post(self, message: _Message) -> None:
        """A post that matched its message releases whoever is blocked on it, and re-checks drains."""
        if not message.matched:
            return
        for rank in message.blocked:
            start, action = self.pending.pop(rank)
            receiving = action.kind in RECVS
            times = (message.send_posted, message.recv_posted)
            end = self.transport.delivered(*times) if receiving else self.transport.released(*times)
            partner = message.send_posted if receiving else message.recv_posted
            self._finish(rank, Executed(rank, action, start, end, partner_posted=partner))
        message.blocked.clear()
        for rank in list(self.draining):
            self._drain(rank)

    def _drain(self, rank: int) -> None:
        """A rank past its last action waits until every message it sent is matched and released."""
        sent = [self.messages[matching_recv(a)] for a in self.orders[rank] if a.kind in SENDS]
        if not all(message.matched for message in sent):
            return
        lane_end = self.draining.pop(rank)
        releases = [self.transport.released(m.send_posted, m.recv_posted) for m in sent]
        done = max([lane_end, *releases])
        last_post = max((m.recv_posted for m in sent), default=None)
        self.ends[rank] = RankEnd(lane_end, done, last_post, done + self.host.tail_ns)

    def _stuck(self) -> str:
        blocked = [f"rank {r} in {action}" for r, (_, action) in sorted(self.pending.items())]
        draining = [f"rank {r} waiting for its sends" for r in sorted(self.draining)]
        return "deadlock: " + "; ".join(blocked + draining)


def simulate_step(
    schedule: Schedule, work_ns: Callable[[Action], int], transport: Transport, host: HostTime | None = None
) -> StepRun:
    """One step of the lowered `schedule` (module docstring): `work_ns(action)` is a compute action's
    work. Every rank's step starts at 0."""
    if not schedule.lowered:
        raise ValueError(f"{schedule.name}: simulate_step runs a lowered schedule (runners.schedules.lower)")
    return _Simulation(schedule, work_ns, transport, host or HostTime()).run()
