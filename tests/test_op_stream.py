"""analysis.cells.op_stream.number_backwards: a backward run takes the forward its ops' sequence numbers
name most often, every (backward op, forward op) pair sharing a sequence counted once."""

from __future__ import annotations

import random
from collections import Counter

import polars as pl

from analysis.cells.op_stream import number_backwards


def by_pairs(of_forward: list[tuple[int, int]], of_backward: list[tuple[int, int]]) -> dict[int, int]:
    """run -> its F by hand: the most frequent F over every pair sharing a sequence, the smallest on a tie."""
    linked = {}
    for run in {r for r, _ in of_backward}:
        counts = Counter(f for r, s in of_backward if r == run for seq, f in of_forward if seq == s)
        if counts:
            most = max(counts.values())
            linked[run] = min(f for f, n in counts.items() if n == most)
    return linked


def numbered(of_forward: list[tuple[int, int]], of_backward: list[tuple[int, int]]) -> dict[int, int]:
    runs = sorted({r for r, _ in of_backward})
    compute = pl.DataFrame(
        {"rank": 0, "step": 0, "run": runs, "kind": "B", "microbatch": -1, "labelled": False},
        schema={
            "rank": pl.Int64,
            "step": pl.Int64,
            "run": pl.Int64,
            "kind": pl.String,
            "microbatch": pl.Int64,
            "labelled": pl.Boolean,
        },
    )
    forwards = pl.DataFrame(of_forward, schema={"sequence": pl.Int64, "f_mb": pl.Int64}, orient="row")
    backwards = pl.DataFrame(of_backward, schema={"run": pl.Int64, "sequence": pl.Int64}, orient="row")
    found = number_backwards(
        compute,
        forwards.with_columns(rank=pl.lit(0, pl.Int64)),
        backwards.with_columns(rank=pl.lit(0, pl.Int64), step=pl.lit(0, pl.Int64)),
    )
    return {run: mb for run, mb in found.select("run", "microbatch").iter_rows() if mb != -1}


def test_a_sequence_shared_by_many_ops_weighs_by_its_pairs():
    # sequence 7 tags three forward ops of F 1 and one of F 0; run 5's two ops of sequence 7 give F 1
    # six pairs, its three ops of sequence 8 give F 0 three: F 1
    of_forward = [(7, 1), (7, 1), (7, 1), (7, 0), (8, 0)]
    of_backward = [(5, 7), (5, 7), (5, 8), (5, 8), (5, 8), (6, 8), (6, 9)]
    assert numbered(of_forward, of_backward) == by_pairs(of_forward, of_backward) == {5: 1, 6: 0}


def test_random_links_match_the_pairs_counted_by_hand():
    rng = random.Random(3)
    for _ in range(40):
        of_forward = [(rng.randint(0, 5), rng.randint(0, 3)) for _ in range(rng.randint(1, 30))]
        of_backward = [(rng.randint(0, 4), rng.randint(0, 6)) for _ in range(rng.randint(1, 30))]
        assert numbered(of_forward, of_backward) == by_pairs(of_forward, of_backward)
