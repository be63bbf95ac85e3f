"""Schedules: refusals, unit-time spans across the sweep, and the in-flight (memory) theory.

How the unit-time figures follow (F = B = 1 unit unless said otherwise; p ranks, m microbatches):
- GPipe: F(s, i) can start at s + i at the earliest (one hop per stage, one microbatch per unit), so the
  last stage ends its forwards at m + p - 1; its backwards follow back-to-back (the loss is there) and
  B(s, i) ends at m + p - 1 + i + (p - s), so stage 0 ends at 2(m + p - 1). Each rank works 2m units.
- 1F1B: the same two chains bound it below (m forwards through p stages, then the first backward's
  p - 1 hops back and stage 0's m backwards), and the schedule keeps stage 0 busy from its first
  backward on, so it also ends at 2(m + p - 1): same bubble, less memory.
- Interleaved, in chunk units (one chunk's F or B = 1, a rank does 2vm): the warm-up and cool-down
  ramps are p - 1 chunk units each way, so the span is 2(vm + p - 1) and the bubble fraction
  2(p - 1) / (2(vm + p - 1)) = (p - 1) / (vm + p - 1), v times smaller than 1F1B's bubble time.
- ZB-H1 with F = I = W = 1: each rank works 3m. Stage s idles s units before its first F (microbatch 0
  coming down) and p - 1 - s units waiting for the first gradient (I has only one unit per hop to
  climb back); after that the deferred W's fill every slot where it would wait, so it idles p - 1
  units in all and the span is 3m + p - 1. 1F1B with B = I + W = 2
  idles 3(p - 1) (its step is (m + p - 1)(F + B) = 3(m + p - 1), work 3m).
The tests replay the schedules and check these figures; they do not trust them.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from runners.schedules import (
    SCHEDULES,
    V_SHAPED,
    Action,
    Kind,
    ScheduleError,
    bubble_formula,
    build,
    in_flight,
    lower,
    simulate,
    validate,
)

PS = range(1, 9)
# every m up to 12 (the small-m corner cases) and the large end of 1..32
MS = (*range(1, 13), 15, 16, 17, 24, 31, 32)


def _idles(timeline, p: int) -> set[float]:
    return {timeline.makespan - timeline.busy(r) for r in range(p)}


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_span_exactly_2_m_plus_p_minus_1(name):
    for p in PS:
        for m in MS:
            if name == "1f1b" and m < p:
                continue
            timeline = simulate(build(name, p, m))
            assert timeline.makespan == 2 * (m + p - 1), (name, p, m)
            assert _idles(timeline, p) == {2 * (p - 1)}, (name, p, m)


def test_interleaved_bubble_fraction_in_chunk_units():
    for p in PS:
        for v in range(1, 5):
            for m in sorted({p, 2 * p, 3 * p, 32 // p * p}):
                timeline = simulate(build("interleaved", p, m, v))
                for r in range(p):
                    assert timeline.busy(r) == 2 * v * m
                    bubble = (timeline.makespan - timeline.busy(r)) / timeline.makespan
                    assert bubble == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12), (p, m, v, r)


def test_zb_h1_idles_p_minus_1_per_rank_against_1f1b_3_p_minus_1():
    def split_b(_rank, action):  # 1F1B's B costs I + W = 2
        return 2.0 if action.kind is Kind.B else 1.0

    for p in PS:
        for m in (m for m in MS if m >= p):
            zb = simulate(build("zb", p, m))
            assert zb.makespan == 3 * m + p - 1, (p, m)
            assert _idles(zb, p) == {p - 1}, (p, m)
            one_f_one_b = simulate(build("1f1b", p, m), duration=split_b)
            assert _idles(one_f_one_b, p) == {3 * (p - 1)}, (p, m)


def test_every_compute_action_once_on_its_rank():
    for name in sorted(SCHEDULES.keys() - V_SHAPED):  # V-shaped: tests/test_schedules_vshape.py
        schedule = build(name, 3, 6, 2 if name == "interleaved" else 1)
        backward = (Kind.I, Kind.W) if name == "zb" else (Kind.B,)
        want = {
            Action(s, k, i) for s in range(schedule.n_stages) for i in range(6) for k in (Kind.F, *backward)
        }
        got = [a for order in schedule.orders for a in order]
        assert sorted(got) == sorted(want), name
        for r, order in enumerate(schedule.orders):
            assert {a.stage for a in order} == set(schedule.stages_of(r)), (name, r)


def test_interleaved_places_global_stage_s_on_rank_s_mod_p():
    schedule = build("interleaved", 4, 8, 3)
    assert schedule.n_stages == 12
    assert schedule.stages_of(1) == (1, 5, 9)
    assert {schedule.rank_of(a.stage) for a in schedule.orders[2]} == {2}


def test_1f1b_warms_up_with_p_minus_1_minus_s_forwards():
    p, m = 5, 9
    schedule = build("1f1b", p, m)
    for s, order in enumerate(schedule.orders):
        kinds = [a.kind for a in order]
        warmup = p - 1 - s
        assert kinds == [Kind.F] * warmup + [Kind.F, Kind.B] * (m - warmup) + [Kind.B] * warmup, s


def test_gpipe_m1_is_naive_model_parallelism():
    timeline = simulate(build("gpipe", 4, 1))
    starts = {str(a): start for _, a, start, _ in timeline.rows}
    assert [starts[f"{s}F0"] for s in range(4)] == [0, 1, 2, 3]
    assert [starts[f"{s}B0"] for s in range(4)] == [7, 6, 5, 4]
    assert timeline.makespan == 8


@pytest.mark.parametrize(
    ("name", "p", "m", "v", "words"),
    [
        ("pipedream", 2, 4, 1, ["unknown schedule", "gpipe", "1f1b", "interleaved", "zb"]),
        ("gpipe", 0, 4, 1, ["p must be"]),
        ("gpipe", 2, 0, 1, ["m must be"]),
        ("interleaved", 2, 4, 0, ["v must be"]),
        ("1f1b", 2, 4, 2, ["v=2", "interleaved"]),
        ("zb", 2, 3, 2, ["m=3", "multiple of p=2"]),
        ("1f1b", 4, 3, 1, ["m=3 < p=4", "p-1 forwards"]),
        ("zb", 8, 2, 1, ["m=2 < p=8"]),
        ("interleaved", 4, 6, 2, ["multiple of p=4"]),
        ("gpipe", 2.0, 4, 1, ["p must be an integer"]),
    ],
)
def test_bad_requests_refused_in_one_line(name, p, m, v, words):
    with pytest.raises(ScheduleError) as raised:
        build(name, p, m, v)
    message = str(raised.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_gpipe_holds_m_microbatches_at_peak_on_every_stage():
    for p in (1, 2, 4, 8):
        for m in (1, 3, 8, 32):
            assert [max(c) for c in in_flight(build("gpipe", p, m))] == [m] * p


def test_1f1b_holds_p_minus_s_on_stage_s():
    for p in (1, 2, 4, 8):
        for m in (p, p + 1, 32):
            assert [max(c) for c in in_flight(build("1f1b", p, m))] == [p - s for s in range(p)]


def test_in_flight_rises_on_f_falls_on_release_and_ends_empty():
    for name in SCHEDULES:
        schedule = build(name, 4, 8, 2 if name == "interleaved" or name in V_SHAPED else 1)
        for order, counts in zip(schedule.orders, in_flight(schedule)):
            assert len(counts) == len(order)
            assert min(counts) >= 0 and counts[-1] == 0
            forwards = sum(a.kind is Kind.F for a in order)
            assert max(counts) <= forwards


def test_interleaved_and_zb_peaks_follow_their_warm_up():
    p, m, v = 4, 8, 2
    for r, counts in enumerate(in_flight(build("interleaved", p, m, v))):
        # a 1F1B-shaped order peaks after its warm-up plus the steady state's first F
        assert max(counts) == min((v - 1) * p + 2 * (p - 1 - r) + 1, m * v), r
    zb = build("zb", p, m)
    assert [max(c) for c in in_flight(zb, until_weight_grad=False)] == [p - s for s in range(p)]
    # W deferred by s on stage s: p - s waiting for I plus s waiting only for W
    assert [max(c) for c in in_flight(zb)] == [p] * p


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_zero_bubble_splits_every_backward_and_saves_a_drain(p, v):
    """zb with v chunks is interleaved 1F1B with each B split into I then W. At F=I=W=1 a rank holds
    3vm units; the fill costs p-1 (the first forward reaching the last rank) and so does the drain (the
    last I's gradient walking back one unit per rank), W adding nothing on the critical path: 3vm+2(p-1),
    against 3vm+3(p-1) for interleaved 1F1B with an unsplit B of two units."""
    m = 2 * p
    schedule = build("zb", p, m, v)
    validate(lower(schedule))
    for rank, order in enumerate(schedule.orders):
        expected = {
            (s, k, i) for s in schedule.stages_of(rank) for k in (Kind.F, Kind.I, Kind.W) for i in range(m)
        }
        assert {(a.stage, a.kind, a.microbatch) for a in order} == expected
    assert simulate(schedule).makespan == 3 * v * m + 2 * (p - 1)
    unsplit = build("interleaved", p, m, v)
    two_unit_b = simulate(unsplit, duration=lambda rank, action: 2 if action.kind is Kind.B else 1)
    assert two_unit_b.makespan == 3 * v * m + 3 * (p - 1)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_the_formula_bubble_of_the_closed_form_schedules_is_their_closed_form(name):
    checked = 0
    for p, m, v in itertools.product(range(1, 6), range(1, 13), range(1, 4)):
        try:
            schedule = build(name, p, m, v)
        except ScheduleError:
            continue
        assert bubble_formula(schedule) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12), (p, m, v)
        checked += 1
    assert checked >= 40  # not a loop over nothing (1f1b: v = 1 and m >= p)


def test_zero_bubble_orders_get_their_own_geometry():
    # ZB-H1 fills 1F1B's cool-down with deferred W's: about a third of 1F1B's bubble at p=4 m=8.
    assert bubble_formula(build("1f1b", 4, 8)) == pytest.approx(3 / 11)
    assert bubble_formula(build("zb", 4, 8)) == pytest.approx(1 / 9)
    # an order none of the generators writes: GPipe with its backwards in reverse, as the seed runs it
    gpipe = build("gpipe", 2, 3)
    reverse = tuple(
        tuple(a for a in o if a.kind is Kind.F) + tuple(reversed([a for a in o if a.kind is Kind.B]))
        for o in gpipe.orders
    )
    assert bubble_formula(dataclasses.replace(gpipe, name="custom", orders=reverse)) == pytest.approx(1 / 4)
