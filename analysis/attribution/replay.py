"""A step as a max-plus graph of its lowered actions, replayed from measured or typical inputs.

Each rank runs its lowered order (compute, SEND, RECV) on one lane: the thread on CPU, the compute
stream on GPU. An action is posted once the lane is free plus its `lead` (host time before it), then:

- compute: `pre` host time inside it, then its `work` (busy time); where its cross-rank input has no
  RECV in the order (a trace without comm cells) the work also waits for the producer's end;
- RECV: `pre`, then it waits until its partner has posted (the matching SEND's post, or the producer's
  end where the trace has no SEND), then its `transfer`, then `post` host time. This is a rendezvous
  (gloo's tcp pairs): a receiver that posts late still pays the transfer. An eager transport (NCCL's
  small messages) instead delivers `transfer` after the partner's post whenever the receiver is there;
- SEND: `pre`, then its own time in the transfer. Asynchronous (isend, an NCCL kernel on a comm stream)
  it holds the lane for no more; blocking (a c10d::send that waits for its receiver, Megatron's) its
  transfer starts no earlier than the receiver's wait.

Each rank then waits for its sends to be delivered and runs its tail (the DP sync, the work outside
the schedule such as the optimizer step, host time), and the step ends when the last rank's tail does:
the step-end barrier, as a max over ranks. No start time is an input: every time follows from the
inputs and the dependencies, so a dependency the graph lacks shows up as the difference from the
measured step (the completeness residual). Like torch.distributed.pipelining's simulator it is not
high-fidelity about what it does not see: compute overlapping communication beyond what the order
allows, contention between ranks, message sizes.

The graph gives the replay (earliest times), its critical path (the chain of inputs whose sum is the
makespan, across ranks) and each cell's slack (how much its work could grow before the step does).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runners.schedules import Action, Kind, Schedule, dependencies
from runners.schedules.dependencies import matching_recv, matching_send, receiving


@dataclass(frozen=True)
class Inputs:
    """One action's inputs in ns: host time before it on the lane, host time inside it before and after
    it waits, its work (compute) and its time in a transfer after both sides posted (SEND, RECV)."""

    lead: float = 0.0
    pre: float = 0.0
    work: float = 0.0
    transfer: float = 0.0
    post: float = 0.0


@dataclass(frozen=True)
class Tail:
    """A rank's time after its last action and its sends' delivery, ns, in the order it runs."""

    dp_sync: float = 0.0  # exposed data-parallel collectives
    other: float = 0.0  # work outside the schedule: the optimizer step, data loading
    launch_overhead: float = 0.0  # host time


@dataclass(frozen=True)
class Step:
    """What one replay needs: each rank's lowered order, every action's inputs, each rank's tail."""

    orders: tuple[tuple[Action, ...], ...]
    inputs: Mapping[Action, Inputs]
    tails: Sequence[Tail]
    blocking_sends: bool = False
    eager_receives: bool = False  # a receive posted after the data left does not pay the transfer


@dataclass(frozen=True)
class Segment:
    """One input on the critical path: ns from the step's origin, the part it is (a rank part's name,
    or `hop` for a transfer) and the action it belongs to (None for host time between actions and the
    tail)."""

    rank: int
    start: float
    end: float
    part: str
    action: Action | None


@dataclass(frozen=True)
class Replayed:
    makespan: float
    spans: dict[Action, tuple[float, float]]  # each action's start (its work's, for compute) and end
    path: tuple[Segment, ...]  # the critical path, in time order, tiling [0, makespan]
    slack: dict[Action, float]  # each compute action: how much its work could grow before the step does


class Deadlock(ValueError):
    """The inputs' orders cannot run: a rank waits for an action that waits for it."""


class _Graph:
    """Nodes are moments; an edge (src, weight, part, rank, action) says a node is no earlier than its
    source plus the weight. Node 0 is the step's origin."""

    def __init__(self) -> None:
        self.incoming: list[list[tuple[int, float, str, int, Action | None]]] = [[]]

    def node(self) -> int:
        self.incoming.append([])
        return len(self.incoming) - 1

    def edge(self, dst: int, src: int, weight: float, part: str, rank: int, action: Action | None) -> None:
        self.incoming[dst].append((src, weight, part, rank, action))


def _build(schedule: Schedule, step: Step) -> tuple[_Graph, dict[Action, dict[str, int]], int]:
    """The graph of `step` on `schedule`'s placement and data flow: each action's nodes (posted, begun,
    end and, for a RECV, delivered) and the finish."""
    graph, at, lane_ends = _Graph(), {}, []
    for rank, order in enumerate(step.orders):
        free = 0
        for action in order:
            got = step.inputs.get(action, Inputs())
            nodes = at[action] = {"posted": graph.node(), "begun": graph.node(), "end": graph.node()}
            graph.edge(nodes["posted"], free, got.lead, "launch_overhead", rank, None)
            graph.edge(nodes["begun"], nodes["posted"], got.pre, "launch_overhead", rank, action)
            free = nodes["end"]
        lane_ends.append(free)
    for rank, order in enumerate(step.orders):
        for action in order:
            _action_edges(schedule, step, graph, at, rank, action)
    finish = graph.node()
    for rank, order in enumerate(step.orders):
        tail = step.tails[rank] if rank < len(step.tails) else Tail()
        after = graph.node()
        graph.edge(after, lane_ends[rank], 0.0, "hop", rank, None)
        for send in (a for a in order if a.kind in (Kind.SEND_F, Kind.SEND_B)):
            if matching_recv(send) in at:  # the rank waits for its sends to be delivered
                graph.edge(after, at[matching_recv(send)]["delivered"], 0.0, "hop", rank, send)
        for part in ("dp_sync", "other", "launch_overhead"):
            done = graph.node()
            graph.edge(done, after, getattr(tail, part), part, rank, None)
            after = done
        graph.edge(finish, after, 0.0, "other", rank, None)
    return graph, at, finish


def _action_edges(
    schedule: Schedule, step: Step, graph: _Graph, at: dict[Action, dict[str, int]], rank: int, action: Action
) -> None:
    got, nodes = step.inputs.get(action, Inputs()), at[action]
    if action.kind.is_compute:
        graph.edge(nodes["end"], nodes["begun"], got.work, "compute", rank, action)
        for dep in dependencies(schedule, action):
            local = schedule.rank_of(dep.stage) == rank
            if dep in at and local:
                graph.edge(nodes["begun"], at[dep]["end"], got.pre, "launch_overhead", rank, action)
            elif dep in at and receiving(action) not in at:  # no RECV cell: the host time follows the wait
                graph.edge(
                    nodes["begun"], at[dep]["end"], got.lead + got.pre, "launch_overhead", rank, action
                )
    elif action.kind in (Kind.RECV_F, Kind.RECV_B):
        delivered = nodes["delivered"] = graph.node()
        own_wait = 0.0 if step.eager_receives else got.transfer
        graph.edge(delivered, nodes["begun"], own_wait, "hop", rank, action)
        send, producer = matching_send(action), dependencies(schedule, action)[0]
        partner = at[send]["posted"] if send in at else at[producer]["end"] if producer in at else None
        if partner is not None:
            graph.edge(delivered, partner, got.transfer, "hop", rank, action)
        graph.edge(nodes["end"], delivered, got.post, "launch_overhead", rank, action)
    else:  # a SEND
        graph.edge(nodes["end"], nodes["begun"], got.transfer, "hop", rank, action)
        receiver = matching_recv(action)
        if step.blocking_sends and receiver in at:
            graph.edge(nodes["end"], at[receiver]["begun"], got.transfer, "hop", rank, action)


def _earliest(graph: _Graph) -> tuple[list[float], list[int]]:
    """Each node's earliest time (the longest path from the origin) and a topological order; Deadlock
    where some node can never be reached (a cycle)."""
    n = len(graph.incoming)
    outgoing: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(edges) for edges in graph.incoming]
    for dst, edges in enumerate(graph.incoming):
        for src, *_ in edges:
            outgoing[src].append(dst)
    time = [float("-inf")] * n
    time[0] = 0.0
    ready, order = deque(i for i in range(n) if waiting[i] == 0), []
    while ready:
        node = ready.popleft()
        order.append(node)
        for src, weight, *_ in graph.incoming[node]:
            time[node] = max(time[node], time[src] + weight)
        for dst in outgoing[node]:
            waiting[dst] -= 1
            if waiting[dst] == 0:
                ready.append(dst)
    if len(order) < n:
        raise Deadlock("the orders cannot run: an action waits, through its partners, for itself")
    return time, order


def replay(schedule: Schedule, step: Step) -> Replayed:
    """The step replayed on `schedule`'s data flow (its stages' placement and dependencies): earliest
    times, the critical path and the compute actions' slack."""
    graph, at, finish = _build(schedule, step)
    time, order = _earliest(graph)
    latest = [float("inf")] * len(time)
    latest[finish] = time[finish]
    for node in reversed(order):
        for src, weight, *_ in graph.incoming[node]:
            latest[src] = min(latest[src], latest[node] - weight)
    spans = {a: (time[nodes["begun"]], time[nodes["end"]]) for a, nodes in at.items()}
    slack = {a: latest[nodes["end"]] - time[nodes["end"]] for a, nodes in at.items() if a.kind.is_compute}
    return Replayed(time[finish], spans, _critical_path(graph, time, finish), slack)


def _critical_path(graph: _Graph, time: list[float], finish: int) -> tuple[Segment, ...]:
    """From the finish back to the origin along the edges that set each node's time (the latest-starting
    one where several do), the inputs with time in them."""
    segments, node = [], finish
    while node != 0:
        src, weight, part, rank, action = max(
            graph.incoming[node], key=lambda edge: (time[edge[0]] + edge[1], time[edge[0]])
        )
        if weight > 0:
            segments.append(Segment(rank, time[src], time[src] + weight, part, action))
        node = src
    return tuple(reversed(segments))
