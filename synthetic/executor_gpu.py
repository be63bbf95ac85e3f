"""The native executor's step on a GPU with NCCL, simulated apart from the analysis and from
runners.schedules.simulate (the GPU twin of synthetic.executor_sim), and each rank's true parts.

Each rank's host thread walks its lowered order and never blocks (NCCL's irecv().wait() and the end
of step's send.wait() make a stream wait, not the host): an action's `PP:` label opens `host.lead_ns`
after the previous one closed, holds `host.inside_ns` of host time and then one cudaLaunchKernel
(LAUNCH_NS), and closes when the launch returns. After the last action the host waits for its sends
(WAIT_SENDS, SYNC_CALL_NS of cudaStreamWaitEvent calls), then launches the optimizer's kernel
(`host.tail_ns` long; none when 0).

On the device each kernel starts once it is launched and its stream is free:
- compute on the compute stream, after every RECV before it in the order (the wait() on the receive);
- a SEND's or RECV's NCCL kernel on the comm stream of its peer (ProcessGroupNCCL keeps one
  communicator, so one stream, per pair of ranks), after all the compute stream's work launched before
  it (ProcessGroupNCCL makes the comm stream wait for the current stream);
- eager delivery (NCCL's small messages; Transport EAGER): the data leaves when the SEND's kernel
  starts and arrives `transfer_ns` later; the SEND's kernel ends then, the RECV's at
  max(its start, arrival);
- with data parallelism (`synced`), the gradients' all-reduce on the DP group's stream (DP_STREAM),
  launched after the wait for sends, once the compute stream and every SEND's kernel are done, until
  its group's end;
- batched (batch_isend_irecv): a SEND and the RECV right after it in the order are one kernel, launched
  from the RECV's label, on the RECV's peer's stream after both peers' streams are free; its data leaves
  at its start and it ends once the received data arrived and the sent data reached its receiver;
- the optimizer's kernel after every SEND's kernel (the step's send.wait()) and the all-reduce.
Each rank's device is replayed in order until every rank is done; a RECV whose SEND has not started
waits for it (DeadlockError if it never does). The step ends when the last kernel of any rank does,
and every rank's host starts the next one then (a barrier).

The truth (`rank_parts`) is the compute stream's view of a step window that opens at the rank's first
kernel, as long as the step: compute (its compute kernels), other (the optimizer's), and each idle ns
before a kernel is: dp_sync under the all-reduce; waiting for a RECV that is running (bubble before the
peer's SEND kernel started, p2p_wait after); else launch_overhead while the host had not yet launched
that kernel; else queued behind the rank's own SEND (a RECV behind it on the peer's comm stream, or the
optimizer waiting for the sends): bubble before the awaited RECV's SEND started, p2p_wait after (the
transfer: eagerly the sender never waits for its receiver). After the last kernel: bubble (drain) until
the step's end, then launch_overhead until the window closes: the next step's host getting to its first
kernel. Two stretches of p2p_wait are also told apart (queued_parts), where a reading that takes a
transport for a rendezvous departs: p2p_queued, the compute stream queued behind the rank's own SEND;
p2p_unposted, a batched pair waiting with the awaited data sent while its own SEND's receiver had not
yet posted (eagerly the pair does not wait for that receiver; under a rendezvous it would).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from runners.schedules import Action, Schedule
from runners.schedules.dependencies import matching_recv, matching_send
from synthetic.executor_sim import EAGER, RECVS, SENDS, DeadlockError, HostTime, Transport

LAUNCH_NS = 4_000  # one cudaLaunchKernel call
SYNC_CALL_NS = 2_000  # the end of step's cudaStreamWaitEvent calls on the sends
COMPUTE_STREAM = 7
COMM_STREAM_BASE = 20  # the comm stream to peer rank q is COMM_STREAM_BASE + q
DP_STREAM = 13  # the DP group's communicator's stream
DEPARTURES = ("p2p_queued", "p2p_unposted")  # stretches of p2p_wait told apart (module docstring)


@dataclass(frozen=True)
class Kernel:
    """One action's launch and kernel (action None: the optimizer's), ns from the step's origin: the
    label opens at `label_start`, the launch returns at `launch_end`; the kernel runs [start, end] on
    `stream`. A RECV's `partner_started` is when its SEND's kernel started (the data left)."""

    action: Action | None
    label_start: int
    launch_end: int
    stream: int
    start: int
    end: int
    partner_started: int | None = None


@dataclass(frozen=True)
class GpuStep:
    """One simulated step: every rank's kernels in launch order (the DP all-reduce's and the optimizer's
    last, if any), where its host waited for its sends ([start, end]), and the step's length."""

    kernels: dict[int, list[Kernel]]
    send_waits: dict[int, tuple[int, int]]
    step_ns: int
    ready: dict[int, int]  # with DP: when each rank's all-reduce began


@dataclass
class _Device:
    """One rank's device while it is replayed: the next action, when the compute stream's queue drains
    (its kernels and the receives it waits for), each comm stream's end, the latest SEND's end."""

    position: int = 0
    stream_at: int = 0
    comm_free: dict[int, int] = field(default_factory=dict)
    sends_end: int = 0
    kernels: list[Kernel] = field(default_factory=list)


class Replay:
    def __init__(
        self, schedule: Schedule, work_ns: Callable[[Action], int], transport: Transport, host, batched: bool
    ):
        self.schedule, self.work_ns, self.transport, self.host = schedule, work_ns, transport, host
        self.batched = batched
        self.labels = {r: self._host(order) for r, order in enumerate(schedule.orders)}
        self.devices = [_Device() for _ in schedule.orders]
        self.sent: dict[Action, int] = {}  # a RECV -> when its SEND's kernel started

    def _host(self, order) -> list[tuple[int, int]]:
        """Each action's (label start, launch end) on the never-blocking host thread."""
        times, free = [], 0
        for action in order:
            opens = free + self.host.lead_ns(action)
            free = opens + self.host.within_ns(action) + LAUNCH_NS
            times.append((opens, free))
        return times

    def peer(self, action: Action) -> int:
        other = matching_recv(action) if action.kind in SENDS else matching_send(action)
        return self.schedule.rank_of(other.stage)

    def advance(self, rank: int) -> bool:
        """Run the rank's next action on its device; False when it must wait (or has nothing left)."""
        device, order = self.devices[rank], self.schedule.orders[rank]
        if device.position == len(order):
            return False
        action = order[device.position]
        opens, launched = self.labels[rank][device.position]
        following = order[device.position + 1] if device.position + 1 < len(order) else None
        if self.batched and action.kind in SENDS and following is not None and following.kind in RECVS:
            return self._pair(rank, action, following)
        if action.kind.is_compute:
            start = max(launched, device.stream_at)
            kernel = Kernel(action, opens, launched, COMPUTE_STREAM, start, start + self.work_ns(action))
            device.stream_at = kernel.end
        else:
            peer = self.peer(action)
            stream = COMM_STREAM_BASE + peer
            start = max(launched, device.stream_at, device.comm_free.get(peer, 0))
            if action.kind in SENDS:
                self.sent[matching_recv(action)] = start
                end = self.transport.released(start, start)  # eager: the data's arrival
                kernel = Kernel(action, opens, launched, stream, start, end)
                device.sends_end = max(device.sends_end, end)
            elif action in self.sent:
                end = self.transport.delivered(self.sent[action], start)
                kernel = Kernel(action, opens, launched, stream, start, end, self.sent[action])
                device.stream_at = max(device.stream_at, end)
            else:
                return False
            device.comm_free[peer] = kernel.end
        device.kernels.append(kernel)
        device.position += 1
        return True

    def _pair(self, rank: int, send: Action, recv: Action) -> bool:
        """A SEND and the RECV after it as batch_isend_irecv issues them: one kernel, launched from the
        RECV's slot, that sends at its start and ends once both halves are done (False while the RECV's
        data has not left: the kernel has started, its start is the same when asked again)."""
        device = self.devices[rank]
        peers = (self.peer(send), self.peer(recv))
        opens, launched = self.labels[rank][device.position + 1]
        start = max(launched, device.stream_at, *(device.comm_free.get(peer, 0) for peer in peers))
        self.sent[matching_recv(send)] = start  # its data leaves whether or not the RECV's has come
        if recv not in self.sent:
            return False
        end = max(self.transport.released(start, start), self.transport.delivered(self.sent[recv], start))
        stream = COMM_STREAM_BASE + peers[1]
        device.kernels.append(
            Kernel(send, self.labels[rank][device.position][0], launched, stream, start, end)
        )
        device.kernels.append(Kernel(recv, opens, launched, stream, start, end, self.sent[recv]))
        device.stream_at = device.sends_end = max(device.sends_end, device.stream_at, end)
        device.comm_free |= dict.fromkeys(peers, end)
        device.position += 2
        return True

    def run(self, synced: Mapping[int, int] | None) -> GpuStep:
        progressed = True
        while progressed:
            progressed = False
            for rank in range(len(self.devices)):
                while self.advance(rank):
                    progressed = True
        stuck = [r for r, d in enumerate(self.devices) if d.position < len(self.schedule.orders[r])]
        if stuck:
            raise DeadlockError(
                "deadlock: "
                + "; ".join(f"rank {r} in {self.schedule.orders[r][self.devices[r].position]}" for r in stuck)
            )
        waits, ready = {}, {}
        for rank, device in enumerate(self.devices):
            last = self.labels[rank][-1][1]
            waits[rank] = host = (last, last + SYNC_CALL_NS)
            drained = max(device.stream_at, device.sends_end)
            if synced is not None:  # the all-reduce, once the compute stream and the sends are done
                launched = host[1] + LAUNCH_NS
                ready[rank] = start = max(launched, drained)
                device.kernels.append(
                    Kernel(None, *host, DP_STREAM, start, max(start, synced.get(rank, start)))
                )
                drained, host = device.kernels[-1].end, (launched, launched)
            if self.host.tail_ns:
                launched = host[1] + LAUNCH_NS
                start = max(launched, drained)
                device.kernels.append(
                    Kernel(None, host[1], launched, COMPUTE_STREAM, start, start + self.host.tail_ns)
                )
        step_ns = max(k.end for d in self.devices for k in d.kernels)
        return GpuStep({r: d.kernels for r, d in enumerate(self.devices)}, waits, step_ns, ready)


def simulate_gpu_step(
    schedule: Schedule,
    work_ns: Callable[[Action], int],
    transport: Transport,
    host: HostTime | None = None,
    synced: Mapping[int, int] | None = None,
    batched: bool = False,
) -> GpuStep:
    """One step of the lowered `schedule` on GPUs (module docstring); eager transport only. With
    `synced` (data parallelism: synthetic.executor_dp) each rank all-reduces its gradients before the
    optimizer, until synced[rank] (or no time where absent); GpuStep.ready says when each one began.
    `batched`: each SEND with the RECV right after it is one kernel (batch_isend_irecv's, module docstring)."""
    if not schedule.lowered:
        raise ValueError(
            f"{schedule.name}: simulate_gpu_step runs a lowered schedule (runners.schedules.lower)"
        )
    if transport.semantics != EAGER:
        raise ValueError("the GPU executor is simulated with eager delivery (NCCL's small messages) only")
    return Replay(schedule, work_ns, transport, host or HostTime(), batched).run(synced)


def parts_as_analysed(told: dict) -> dict[str, int]:
    """One rank's truth (truth.json's `ranks` entry) as the analysis reads it: the departures' stretches
    (module docstring; absent on CPU) moved from p2p_wait to bubble, ns."""
    parts = dict(told["parts_ns"])
    departed = sum(told.get(f"{name}_ns", 0) for name in DEPARTURES)
    parts["bubble"] += departed
    parts["p2p_wait"] -= departed
    return parts


def rank_parts(step: GpuStep, rank: int) -> dict[str, int]:
    """The true parts of one rank's step window (module docstring), ns; they sum to step.step_ns."""
    parts = queued_parts(step, rank)
    parts["p2p_wait"] += sum(parts.pop(name) for name in DEPARTURES)
    return parts


def queued_parts(step: GpuStep, rank: int) -> dict[str, int]:
    """rank_parts with p2p_queued and p2p_unposted (module docstring) apart from its p2p_wait."""
    parts = dict.fromkeys(
        ("compute", "launch_overhead", "bubble", "p2p_wait", *DEPARTURES, "dp_sync", "other"), 0
    )
    kernels = step.kernels[rank]
    posted = _pairs_posted(step, rank)
    opens = kernels[0].start
    free, receiving = opens, []
    for kernel in kernels:
        if kernel.stream == DP_STREAM or kernel.action is not None and kernel.action.kind in RECVS:
            receiving.append(kernel)
        elif kernel.stream == COMPUTE_STREAM:
            for name, ns in _gap(free, kernel, receiving, posted).items():
                parts[name] += ns
            parts["compute" if kernel.action is not None else "other"] += kernel.end - kernel.start
            free, receiving = kernel.end, []
    parts["bubble"] += step.step_ns - free
    parts["launch_overhead"] += opens
    return parts


def _pairs_posted(step: GpuStep, rank: int) -> dict[Action, int]:
    """Each batched pair's RECV on the rank -> when its SEND's receiver posted (its kernel started)."""
    started = {k.action: k.start for kernels in step.kernels.values() for k in kernels if k.action}
    kernels = step.kernels[rank]
    return {
        recv.action: started[matching_recv(send.action)]
        for send, recv in zip(kernels, kernels[1:])
        if recv.action is not None and recv.action.kind in RECVS and send.launch_end == recv.launch_end
    }


def _gap(free: int, kernel: Kernel, receiving: list[Kernel], posted: Mapping[Action, int]) -> dict[str, int]:
    """The idle [free, kernel.start] before a compute-stream kernel, by the rule of the module docstring;
    `posted`: _pairs_posted."""
    times = {free, kernel.start, kernel.launch_end, *(t for r in receiving for t in (r.start, r.end))}
    times |= {r.partner_started for r in receiving if r.partner_started is not None}
    times |= {posted[r.action] for r in receiving if r.action in posted}
    points = sorted(t for t in times if free <= t <= kernel.start)
    sent = max((r.partner_started for r in receiving if r.partner_started is not None), default=free)
    parts: dict[str, int] = {}
    for a, b in zip(points, points[1:]):
        running = [r for r in receiving if r.start <= a and b <= r.end]
        unposted = max((posted.get(r.action, sent) for r in running), default=sent)
        if any(r.stream == DP_STREAM for r in running):
            name = "dp_sync"
        elif b <= kernel.launch_end and not running:
            name = "launch_overhead"
        elif b <= sent:
            name = "bubble"
        else:
            name = "p2p_queued" if not running else "p2p_unposted" if b <= unposted else "p2p_wait"
        parts[name] = parts.get(name, 0) + b - a
    return parts
