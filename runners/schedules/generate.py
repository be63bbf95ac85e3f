"""The generators (gpipe, 1f1b, interleaved, zb here; zbv, dualpipev in vshape.py) and `build`, which
refuses bad requests first.

Every generator returns compute actions only (F, B, I, W) per rank in execution order; `lower` adds the
communication. The 1F1B family shares one shape, `_one_f_one_b`: a warm-up of forwards, a steady state
alternating one forward with one backward, and a cool-down of the remaining backwards.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

from .actions import Action, Kind
from .schedule import Schedule, ScheduleError
from .vshape import dualpipev, zbv


def _one_f_one_b(
    forwards: list[Action], backwards: list[Action], warmup: int, weights: list[Action] = (), lag: int = 0
) -> tuple[Action, ...]:
    """Warm-up forwards, then (F, backward) pairs, then the remaining backwards; weights[k - lag]
    follows backward k, and the weights still owed run at the end."""
    order = list(forwards[:warmup])
    for k, backward in enumerate(backwards):
        if warmup + k < len(forwards):
            order.append(forwards[warmup + k])
        order.append(backward)
        if weights and k >= lag:
            order.append(weights[k - lag])
    order.extend(weights[max(len(backwards) - lag, 0) :] if weights else ())
    return tuple(order)


def gpipe(p: int, m: int, v: int = 1) -> tuple[tuple[Action, ...], ...]:
    """All forwards, then all backwards in microbatch order (torch's ScheduleGPipe); m=1 is naive MP."""
    return tuple(
        tuple(Action(r, Kind.F, i) for i in range(m)) + tuple(Action(r, Kind.B, i) for i in range(m))
        for r in range(p)
    )


def one_f_one_b(p: int, m: int, v: int = 1) -> tuple[tuple[Action, ...], ...]:
    """Stage s warms up with p-1-s forwards (torch/Megatron), so p-s microbatches are in flight at most."""
    return tuple(
        _one_f_one_b(
            [Action(r, Kind.F, i) for i in range(m)], [Action(r, Kind.B, i) for i in range(m)], p - 1 - r
        )
        for r in range(p)
    )


def _interleaved_action(p: int, v: int, rank: int, k: int, kind: Kind) -> Action:
    """The k-th forward (or backward) of a rank: rounds of p microbatches sweep the chunks in turn
    (forwards chunk 0 -> v-1, backwards v-1 -> 0), the depth-first order of Megatron and torch."""
    chunk = (k // p) % v
    if kind is not Kind.F:
        chunk = v - 1 - chunk
    return Action(chunk * p + rank, kind, (k // (p * v)) * p + k % p)


def interleaved(p: int, m: int, v: int) -> tuple[tuple[Action, ...], ...]:
    """Megatron's interleaved 1F1B: rank r warms up with (v-1)*p + 2*(p-1-r) forwards (capped at m*v),
    as torch's ScheduleInterleaved1F1B does for m a multiple of p."""
    orders = []
    for r in range(p):
        forwards = [_interleaved_action(p, v, r, k, Kind.F) for k in range(m * v)]
        backwards = [_interleaved_action(p, v, r, k, Kind.B) for k in range(m * v)]
        orders.append(_one_f_one_b(forwards, backwards, min((v - 1) * p + 2 * (p - 1 - r), m * v)))
    return tuple(orders)


def zb(p: int, m: int, v: int = 1) -> tuple[tuple[Action, ...], ...]:
    """ZB-H1 (Qi et al.): 1F1B's F/I order (p-1-s warm-up forwards, so at most p-s microbatches wait
    for their I on stage s) with each W deferred: stage s runs W(i) after I(i+s), and its last s W's
    fill the cool-down, where 1F1B would wait for gradients. A lag of s is the least that lets every
    I run as soon as its gradient arrives (found by replaying lags 0..p per stage at unit times).

    With v > 1 chunks (the family of torch's ScheduleInterleavedZeroBubble): interleaved 1F1B's order
    with each backward split into I and its W right after. That order is valid but places W less
    cleverly than torch; the analysis replays a run in the order it executed, not in this one."""
    if v > 1:
        return tuple(tuple(_split_backward(order)) for order in interleaved(p, m, v))
    return tuple(
        _one_f_one_b(
            [Action(r, Kind.F, i) for i in range(m)],
            [Action(r, Kind.I, i) for i in range(m)],
            p - 1 - r,
            [Action(r, Kind.W, i) for i in range(m)],
            lag=r,
        )
        for r in range(p)
    )


def _split_backward(order: tuple[Action, ...]):
    for action in order:
        if action.kind is Kind.B:
            yield Action(action.stage, Kind.I, action.microbatch)
            yield Action(action.stage, Kind.W, action.microbatch)
        else:
            yield action


Generator = Callable[[int, int, int], tuple[tuple[Action, ...], ...]]
SCHEDULES: MappingProxyType[str, Generator] = MappingProxyType(
    {
        "gpipe": gpipe,
        "1f1b": one_f_one_b,
        "interleaved": interleaved,
        "zb": zb,
        "zbv": zbv,
        "dualpipev": dualpipev,
    }
)
_CHUNKED = frozenset({"interleaved", "zb"})  # v chunks per rank allowed; stage s on rank s % p
V_SHAPED = frozenset({"zbv", "dualpipev"})  # two stages per rank, placed in a V (schedule.py)
_NEEDS_M_GE_P = frozenset({"1f1b", "zb"})


def _check_v(name: str, v: int) -> None:
    if name in V_SHAPED and v != 2:
        raise ScheduleError(
            f"{name}: v={v} but {name} holds 2 stages per rank in a V (r and 2p-1-r); use v=2"
        )
    if v != 1 and name not in _CHUNKED | V_SHAPED:
        raise ScheduleError(f"{name}: v={v} but {name} has one stage per rank; v > 1 needs interleaved")


def check_request(name: str, p: int, m: int, v: int = 1) -> None:
    """Raise a one-line ScheduleError for a request no schedule can satisfy."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    for label, value in (("p", p), ("m", m), ("v", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"{name}: {label} must be an integer >= 1, got {value!r}")
    _check_v(name, v)
    if name in _NEEDS_M_GE_P and m < p:
        raise ScheduleError(
            f"{name}: m={m} < p={p}; stage 0 warms up with p-1 forwards and needs p microbatches "
            "to reach its steady state (use gpipe for fewer microbatches)"
        )
    if name == "dualpipev" and m < 2 * p:
        raise ScheduleError(
            f"{name}: m={m} < 2p={2 * p}; DualPipeV needs at least as many microbatches as stages"
        )
    if name in _CHUNKED and (v > 1 or name == "interleaved") and m % p != 0:
        raise ScheduleError(
            f"{name}: m={m} must be a multiple of p={p} (microbatches go round in groups of p)"
        )


def build(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """The compute-only schedule `name` for p ranks, m microbatches and v chunks per rank."""
    check_request(name, p, m, v)
    placement = "v" if name in V_SHAPED else "loop"
    return Schedule(name, p, m, v, SCHEDULES[name](p, m, v), placement=placement)
