"""The replayed schedule is the one the traces executed, even when an engine orders it differently."""

from pathlib import Path

import polars as pl
import pytest

from analysis.cells.executed import as_executed
from analysis.errors import InputError
from runners.schedules import Action, build


def cells_of(orders: list[list[Action]]) -> pl.DataFrame:
    rows = [
        {
            "rank": rank,
            "step": 3,
            "stage": a.stage,
            "kind": a.kind.value,
            "microbatch": a.microbatch,
            "start_ns": i,
        }
        for rank, order in enumerate(orders)
        for i, a in enumerate(order)
    ]
    return pl.DataFrame(rows)


def test_same_order_keeps_the_named_schedule():
    named = build("zb", 2, 4)
    assert as_executed(named, cells_of([list(o) for o in named.orders]), Path("run")) is named


def test_an_engine_that_defers_w_differently_is_replayed_as_it_ran():
    named = build("zb", 2, 4)
    orders = [list(o) for o in named.orders]
    # Move rank 0's last W to the end of its order: same actions, another order.
    moved = next(i for i in range(len(orders[0]) - 2, -1, -1) if orders[0][i].kind.value == "W")
    orders[0].append(orders[0].pop(moved))
    executed = as_executed(named, cells_of(orders), Path("run"))
    assert executed.name == "zb"
    assert list(executed.orders[0]) == orders[0] != list(named.orders[0])
    assert executed.orders[1] == named.orders[1]


def test_other_actions_than_the_schedule_names_are_an_input_error():
    named = build("gpipe", 2, 4)
    orders = [list(o) for o in named.orders]
    orders[1].pop()
    with pytest.raises(InputError, match="not those of gpipe"):
        as_executed(named, cells_of(orders), Path("run"))
