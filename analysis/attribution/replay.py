"""A step as a max-plus graph of its lowered actions, replayed from measured or typical inputs.

Each rank runs its lowered order (compute, SEND, RECV) on one lane: the thread on CPU, the compute
stream on GPU. An action is posted once the lane is free plus its `lead` (host time before it), then:

- compute: `pre` host time inside it, then its `work` (busy time); where its cross-rank input has no
  RECV in the order (a trace without comm cells) the work also waits for the producer's end;
- RECV: `pre`, then it waits until its partner has posted (the matching SEND's post, or the producer's
  end where the trace has no SEND), then its `transfer`, then `post` host time. This is a rendezvous
  (gloo's tcp pairs): a receiver that posts late still pays the transfer. An eager transport (NCCL's
  small messages) instead delivers `transfer` after the partner's post whenever the receiver is there.
  A runtime that only posts the receive (torch.distributed.pipelining's irecv) frees the lane after
  `pre` + `post`; its consumer's work then begins no earlier than the data's delivery plus its `pre`;
- SEND: `pre`, then its own time in the transfer. Asynchronous (isend, an NCCL kernel on a comm stream)
  it holds the lane for no more; blocking (a c10d::send that waits for its receiver, Megatron's) its
  transfer starts no earlier than the receiver's wait.

Each rank then waits for its sends to be delivered and runs its tail (the DP sync, the work outside
the schedule such as the optimizer step, host time); the step-end barrier lets every rank go once the
last rank's tail is done (a max over ranks), each after its own `barrier` time (the collective, its
thread waking, its window closing). A rank's step begins `opened` after the first rank's (the previous
barrier let it go later), and the step is its longest: each rank's `barrier` is counted from its own
opening. No other start time is an input: every time follows from the inputs and the dependencies, so
a dependency the graph lacks shows up as the difference from the measured step (the completeness
residual). Like torch.distributed.pipelining's simulator it is not high-fidelity about what it does
not see: compute overlapping communication beyond what the order allows, contention between ranks,
message sizes.

The graph gives the replay (earliest times), its critical path (the chain of inputs whose sum is the
makespan, across ranks) and each cell's slack (how much its work could grow before the step does).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.vocabulary import Part
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
    # after the last rank reached the step-end barrier until this rank's step ended, less `opened`
    barrier: float = 0.0
    opened: float = 0.0  # the rank's step began this long after the first rank's (the previous barrier's)


@dataclass(frozen=True)
class Step:
    """What one replay needs: each rank's lowered order, every action's inputs, each rank's tail."""

    orders: tuple[tuple[Action, ...], ...]
    inputs: Mapping[Action, Inputs]
    tails: Sequence[Tail]
    blocking_sends: bool = False
    eager_receives: bool = False  # a receive posted after the data left does not pay the transfer
    posted_receives: bool = False  # a RECV only posts the receive: its consumer waits for the data


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


class _Spans(Mapping[Action, tuple[float, float]]):
    """Each action's (start, end), read from one column of a replay's node times when asked: a measured
    run replays every step and reads no step's spans, and a dict of them per step was the bulk of what
    its replays held."""

    def __init__(self, at: dict[Action, dict[str, int]], times: np.ndarray) -> None:
        self._at, self._times = at, times  # shared by every step of one graph; this step's column

    def __getitem__(self, action: Action) -> tuple[float, float]:
        nodes = self._at[action]
        return self._times[nodes["begun"]], self._times[nodes["end"]]

    def __iter__(self) -> Iterator[Action]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)


@dataclass(frozen=True)
class Replayed:
    makespan: float
    spans: Mapping[Action, tuple[float, float]]  # each action's start (its work's, for compute) and end
    path: tuple[Segment, ...]  # the critical path, in time order, tiling [0, makespan]
    slack: dict[Action, float]  # each compute action: how much its work could grow before the step does


class Deadlock(ValueError):
    """The inputs' orders cannot run: a rank waits for an action that waits for it."""


_FIELDS = ("lead", "pre", "work", "transfer", "post")  # Inputs', in the weight table's blocks
_TAIL_PARTS = (
    Part.DP_SYNC,
    Part.OTHER,
    Part.LAUNCH_OVERHEAD,
)  # Tail's, in the order a rank runs them
_TAIL_ROWS = (*_TAIL_PARTS, "barrier", "opened")  # Tail's fields, in the weight table's blocks


class _Graph:
    """Nodes are moments; an edge (src, row, part, rank, action) says a node is no earlier than its
    source plus the weight in row `row` of the weight table. Node 0 is the step's origin. The graph
    depends only on the orders and the transport, so one serves every step that ran them: the weights
    of many steps are evaluated at once, one column each."""

    def __init__(self, n_actions: int, p: int) -> None:
        self.incoming: list[list[tuple[int, int, str, int, Action | None]]] = [[]]
        self.n, self.p = n_actions, p
        self.zero = 6 * n_actions + len(_TAIL_ROWS) * p  # the weight table's last row is 0

    def node(self) -> int:
        self.incoming.append([])
        return len(self.incoming) - 1

    def edge(self, dst: int, src: int, row: int, part: str, rank: int, action: Action | None) -> None:
        self.incoming[dst].append((src, row, part, rank, action))

    def row(self, field: str, index: int) -> int:
        """An action's input (`lead+pre`: their sum) or a rank's tail part (`tail:<part>`)."""
        if field == "lead+pre":
            return 5 * self.n + index
        if field.startswith("tail:"):
            return 6 * self.n + _TAIL_ROWS.index(field[5:]) * self.p + index
        return _FIELDS.index(field) * self.n + index


class _Compiled:
    """A graph, its topological order, and each node's incoming sources and weight rows as arrays."""

    def __init__(self, schedule: Schedule, orders, blocking: bool, eager: bool, posted: bool) -> None:
        self.actions = [a for order in orders for a in order]
        self.index = {a: i for i, a in enumerate(self.actions)}
        self.p = len(orders)
        self.graph, self.at, self.finish = _build(schedule, orders, self.index, blocking, eager, posted)
        self.order = _topological(self.graph)
        self.sources = [np.array([e[0] for e in edges], dtype=np.int64) for edges in self.graph.incoming]
        self.rows = [np.array([e[1] for e in edges], dtype=np.int64) for edges in self.graph.incoming]

    def weights(self, steps: Sequence[Step]) -> np.ndarray:
        """The weight table of `steps`, one column each."""
        table = np.zeros((self.graph.zero + 1, len(steps)))
        n = len(self.actions)
        for column, step in enumerate(steps):
            for i, action in enumerate(self.actions):
                got = step.inputs.get(action)
                if got is not None:
                    table[i, column], table[n + i, column] = got.lead, got.pre
                    table[2 * n + i, column], table[3 * n + i, column] = got.work, got.transfer
                    table[4 * n + i, column] = got.post
            for rank, tail in enumerate(step.tails[: self.p]):
                for k, part in enumerate(_TAIL_ROWS):
                    table[6 * n + k * self.p + rank, column] = getattr(tail, part)
        table[5 * n : 6 * n] = table[:n] + table[n : 2 * n]
        return table

    def run(self, steps: Sequence[Step]) -> list[Replayed]:
        table = self.weights(steps)
        time = np.full((len(self.graph.incoming), len(steps)), -np.inf)
        time[0] = 0.0
        for node in self.order[1:]:
            time[node] = np.max(time[self.sources[node]] + table[self.rows[node]], axis=0)
        latest = np.full_like(time, np.inf)
        latest[self.finish] = time[self.finish]
        for node in reversed(self.order):
            if len(self.sources[node]):
                np.minimum.at(latest, self.sources[node], latest[node] - table[self.rows[node]])
        found = []
        for column in range(len(steps)):
            at_time, late = time[:, column], latest[:, column]
            slack = {
                a: late[nodes["end"]] - at_time[nodes["end"]]
                for a, nodes in self.at.items()
                if a.kind.is_compute
            }
            path = _critical_path(self.graph, at_time, table[:, column], self.finish)
            found.append(Replayed(float(at_time[self.finish]), _Spans(self.at, at_time), path, slack))
        return found


def _build(schedule: Schedule, orders, index: dict[Action, int], blocking: bool, eager: bool, posted: bool):
    """The graph of `orders` on `schedule`'s placement and data flow: each action's nodes (posted, begun,
    end and, for a RECV, delivered) and the finish."""
    graph, at, lane_ends = _Graph(len(index), len(orders)), {}, []
    for rank, order in enumerate(orders):
        free = graph.node()  # the rank's step begins
        graph.edge(free, 0, graph.row("tail:opened", rank), Part.OTHER, rank, None)
        for action in order:
            i = index[action]
            nodes = at[action] = {"posted": graph.node(), "begun": graph.node(), "end": graph.node()}
            if action.kind in (Kind.RECV_F, Kind.RECV_B):
                nodes["delivered"] = graph.node()
            graph.edge(nodes["posted"], free, graph.row("lead", i), Part.LAUNCH_OVERHEAD, rank, None)
            graph.edge(
                nodes["begun"], nodes["posted"], graph.row("pre", i), Part.LAUNCH_OVERHEAD, rank, action
            )
            free = nodes["end"]
        lane_ends.append(free)
    for rank, order in enumerate(orders):
        for action in order:
            _action_edges(schedule, graph, at, index, rank, action, blocking, eager, posted)
    arrived = graph.node()  # the last rank at the step-end barrier
    for rank, order in enumerate(orders):
        after = graph.node()
        graph.edge(after, lane_ends[rank], graph.zero, "hop", rank, None)
        for send in (a for a in order if a.kind in (Kind.SEND_F, Kind.SEND_B)):
            if matching_recv(send) in at:  # the rank waits for its sends to be delivered
                graph.edge(after, at[matching_recv(send)]["delivered"], graph.zero, "hop", rank, send)
        for part in _TAIL_PARTS:
            done = graph.node()
            graph.edge(done, after, graph.row(f"tail:{part}", rank), part, rank, None)
            after = done
        graph.edge(arrived, after, graph.zero, Part.OTHER, rank, None)
    finish = graph.node()
    for rank in range(len(orders)):  # the barrier's own time is work outside the schedule
        graph.edge(finish, arrived, graph.row("tail:barrier", rank), Part.OTHER, rank, None)
    return graph, at, finish


def _action_edges(
    schedule, graph: _Graph, at, index, rank: int, action: Action, blocking: bool, eager: bool, posted: bool
):
    nodes, i = at[action], index[action]
    if action.kind.is_compute:
        graph.edge(nodes["end"], nodes["begun"], graph.row("work", i), Part.COMPUTE, rank, action)
        # its input was only posted: the work waits for the data (a W's input is its I's, on the lane)
        if posted and action.kind is not Kind.W and receiving(action) in at:
            delivered = at[receiving(action)]["delivered"]
            graph.edge(nodes["begun"], delivered, graph.row("pre", i), Part.LAUNCH_OVERHEAD, rank, action)
        for dep in dependencies(schedule, action):
            local = schedule.rank_of(dep.stage) == rank
            if dep in at and local:
                graph.edge(
                    nodes["begun"],
                    at[dep]["end"],
                    graph.row("pre", i),
                    Part.LAUNCH_OVERHEAD,
                    rank,
                    action,
                )
            elif dep in at and receiving(action) not in at:  # no RECV cell: the host time follows the wait
                graph.edge(
                    nodes["begun"],
                    at[dep]["end"],
                    graph.row("lead+pre", i),
                    Part.LAUNCH_OVERHEAD,
                    rank,
                    action,
                )
    elif action.kind in (Kind.RECV_F, Kind.RECV_B):
        delivered = nodes["delivered"]
        own_wait = graph.zero if eager else graph.row("transfer", i)
        graph.edge(delivered, nodes["begun"], own_wait, "hop", rank, action)
        send, producer = matching_send(action), dependencies(schedule, action)[0]
        partner = at[send]["posted"] if send in at else at[producer]["end"] if producer in at else None
        if partner is not None:
            graph.edge(delivered, partner, graph.row("transfer", i), "hop", rank, action)
        graph.edge(
            nodes["end"],
            nodes["begun"] if posted else delivered,
            graph.row("post", i),
            Part.LAUNCH_OVERHEAD,
            rank,
            action,
        )
    else:  # a SEND
        graph.edge(nodes["end"], nodes["begun"], graph.row("transfer", i), "hop", rank, action)
        receiver = matching_recv(action)
        if blocking and receiver in at:
            graph.edge(nodes["end"], at[receiver]["begun"], graph.row("transfer", i), "hop", rank, action)


def _topological(graph: _Graph) -> list[int]:
    """The nodes in an order where every edge's source comes first; Deadlock where some node can never
    be reached (a cycle)."""
    n = len(graph.incoming)
    outgoing: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(edges) for edges in graph.incoming]
    for dst, edges in enumerate(graph.incoming):
        for src, *_ in edges:
            outgoing[src].append(dst)
    ready, order = deque(i for i in range(n) if waiting[i] == 0), []
    while ready:
        node = ready.popleft()
        order.append(node)
        for dst in outgoing[node]:
            waiting[dst] -= 1
            if waiting[dst] == 0:
                ready.append(dst)
    if len(order) < n:
        raise Deadlock("the orders cannot run: an action waits, through its partners, for itself")
    return order


def replay_all(schedule: Schedule, steps: Sequence[Step]) -> list[Replayed]:
    """Every step replayed on `schedule`'s data flow (its stages' placement and dependencies): earliest
    times, the critical path and the compute actions' slack; steps that ran the same orders share one
    graph and are evaluated together."""
    groups: dict[tuple, list[int]] = {}
    for i, step in enumerate(steps):
        transport = (step.blocking_sends, step.eager_receives, step.posted_receives)
        groups.setdefault((step.orders, *transport), []).append(i)
    found: list[Replayed | None] = [None] * len(steps)
    for (orders, *transport), members in groups.items():
        compiled = _Compiled(schedule, orders, *transport)
        for i, replayed in zip(members, compiled.run([steps[i] for i in members])):
            found[i] = replayed
    return found  # type: ignore[return-value]


def replay(schedule: Schedule, step: Step) -> Replayed:
    """One step replayed (replay_all)."""
    return replay_all(schedule, [step])[0]


def _critical_path(graph: _Graph, time, weights, finish: int) -> tuple[Segment, ...]:
    """From the finish back to the origin along the edges that set each node's time (the latest-starting
    one where several do), the inputs with time in them."""
    segments, node = [], finish
    while node != 0:
        src, row, part, rank, action = max(
            graph.incoming[node], key=lambda edge: (time[edge[0]] + weights[edge[1]], time[edge[0]])
        )
        if weights[row] > 0:
            segments.append(Segment(rank, float(time[src]), float(time[src] + weights[row]), part, action))
        node = src
    return tuple(reversed(segments))
