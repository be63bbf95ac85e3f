"""What each action waits for: the data flow of a pipeline step, independent of any order.

F(s, i) needs F(s-1, i)'s activation; the backward of (s, i) needs its own forward and the gradient
from (s+1, i) (on the last stage only the forward: the loss is computed there); W(s, i) needs I(s, i).
Comm actions wait for the compute whose tensor they move.
"""

from __future__ import annotations

from .actions import Action, Kind
from .schedule import Schedule


def dependencies(schedule: Schedule, action: Action) -> tuple[Action, ...]:
    """The compute actions `action` waits for (empty for the first forward of stage 0)."""
    stage, kind, mb = action.stage, action.kind, action.microbatch
    last = schedule.n_stages - 1
    if kind is Kind.F:
        return (Action(stage - 1, Kind.F, mb),) if stage > 0 else ()
    if kind in (Kind.B, Kind.I):
        own = Action(stage, Kind.F, mb)
        return (own,) if stage == last else (own, schedule.backward_of(stage + 1, mb))
    if kind is Kind.W:
        return (Action(stage, Kind.I, mb),)
    if kind is Kind.SEND_F:
        return (Action(stage, Kind.F, mb),)
    if kind is Kind.RECV_F:
        return (Action(stage - 1, Kind.F, mb),)
    if kind is Kind.SEND_B:
        return (schedule.backward_of(stage, mb),)
    return (schedule.backward_of(stage + 1, mb),)  # RECV_B


def matching_send(action: Action) -> Action:
    """The SEND on the peer that a RECV waits for: RECV_F(s) <- SEND_F(s-1), RECV_B(s) <- SEND_B(s+1)."""
    if action.kind is Kind.RECV_F:
        return Action(action.stage - 1, Kind.SEND_F, action.microbatch)
    if action.kind is Kind.RECV_B:
        return Action(action.stage + 1, Kind.SEND_B, action.microbatch)
    raise ValueError(f"{action} is not a RECV")


def matching_recv(action: Action) -> Action:
    """The peer's RECV that a SEND delivers to: SEND_F(s) -> RECV_F(s+1), SEND_B(s) -> RECV_B(s-1)."""
    if action.kind is Kind.SEND_F:
        return Action(action.stage + 1, Kind.RECV_F, action.microbatch)
    if action.kind is Kind.SEND_B:
        return Action(action.stage - 1, Kind.RECV_B, action.microbatch)
    raise ValueError(f"{action} is not a SEND")


def receiving(action: Action) -> Action:
    """The RECV that brings a compute action its cross-rank input (F <- RECV_F, B/I <- RECV_B)."""
    kind = Kind.RECV_F if action.kind is Kind.F else Kind.RECV_B
    return Action(action.stage, kind, action.microbatch)
