"""Valid pipeline orders that none of the generators writes, for ground truth on any executed order.

Each is a compute-only `runners.schedules.Schedule` named "custom" (what the analysis calls an order no
generator matches); `synthetic.generate.synthesize` replays and writes it like any other.
"""

from __future__ import annotations

from dataclasses import replace

from runners.schedules import Action, Kind, Schedule, build

CUSTOM = "custom"


def reverse_backward_gpipe(p: int, m: int) -> Schedule:
    """GPipe with each rank's backwards in reverse, B(m-1) first: the seed experiment's own loop."""
    gpipe = build("gpipe", p, m)
    orders = tuple(
        tuple(a for a in order if a.kind is Kind.F) + tuple(reversed([a for a in order if a.kind is Kind.B]))
        for order in gpipe.orders
    )
    return replace(gpipe, name=CUSTOM, orders=orders)


def deeper_warmup_1f1b(p: int, m: int, extra: int = 1) -> Schedule:
    """1F1B where every rank but the last warms up with `extra` more forwards than 1F1B's p-1-s
    (more activations held, the same bubble)."""
    one_f_one_b = build("1f1b", p, m)
    orders = []
    for rank in range(p):
        forwards = [Action(rank, Kind.F, i) for i in range(m)]
        backwards = [Action(rank, Kind.B, i) for i in range(m)]
        warmup = min(m, p - 1 - rank + (extra if rank < p - 1 else 0))
        order = forwards[:warmup]
        for k, backward in enumerate(backwards):
            if warmup + k < m:
                order.append(forwards[warmup + k])
            order.append(backward)
        orders.append(tuple(order))
    return replace(one_f_one_b, name=CUSTOM, orders=tuple(orders))


def blocked_gpipe(p: int, m: int, v: int) -> Schedule:
    """GPipe over p*v stages placed in blocks: rank r holds stages r*v .. r*v+v-1 (neither the loop nor
    the V placement), so consecutive stages on one rank hand over in memory."""
    stage_ranks = tuple(stage // v for stage in range(p * v))
    orders = tuple(
        tuple(Action(s, Kind.F, i) for i in range(m) for s in range(r * v, r * v + v))
        + tuple(Action(s, Kind.B, i) for i in range(m) for s in reversed(range(r * v, r * v + v)))
        for r in range(p)
    )
    return Schedule(CUSTOM, p, m, v, orders, placement="custom", stage_ranks=stage_ranks)


def unlabelled_orders() -> dict[str, Schedule]:
    """The orders an unlabelled run's inference is checked on: two generated schedules and two that no
    generator writes (a loop without PP: labels executes any of them)."""
    return {
        "gpipe": build("gpipe", 4, 8),
        "1f1b": build("1f1b", 4, 8),
        "reverse-backward gpipe": reverse_backward_gpipe(3, 4),
        "1f1b with a deeper warm-up": deeper_warmup_1f1b(3, 6),
    }
