"""What a synthetic run's time is made of: the durations it injects and the per-rank truth they give.

A compute action's work takes its reference time (`durations_us`, the work at full-batch efficiency)
x `small_gemm` (the same work timed alone at its microbatch size: the small-GEMM loss) x `slowdown`
(what running inside the pipeline adds beyond that). Its rank's truth is split the same way:
compute (the reference), small_gemm (isolated - reference), slowdown (measured - isolated); plus
launch_overhead (the injected gaps), p2p_wait (waiting after the peer had sent) and bubble (the rest:
waiting for a producer, fill and drain). The run.json it writes carries the calibration the analysis
reads: the whole batch at reference speed (`calibration`) and one microbatch in isolation
(`calibration_by_rows`, at the rows of `ROWS_PER_MICROBATCH` per microbatch). At m = 1 a microbatch is
the whole batch, so its isolated time is the reference: small_gemm is 0 there by definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runners.schedules import Action, Kind, Schedule
from runners.schedules.dependencies import matching_recv, matching_send

DEFAULT_US = {"F": 1000.0, "B": 2000.0, "I": 1000.0, "W": 1000.0}
ROWS_PER_MICROBATCH = 64  # the rows the run.json says each microbatch has (nothing computes on them)

Durations = Mapping[str | tuple[int, str], float]  # kind -> us for every stage; (stage, kind) overrides
Factors = float | Mapping[tuple[int, str], float]  # one factor, or per (stage, kind) (1 where absent)


@dataclass(frozen=True)
class RankTruth:
    """One rank's step split into parts (ns per step); the parts sum to step_ns exactly."""

    rank: int
    step_ns: int
    compute_ns: int
    small_gemm_ns: int
    slowdown_ns: int
    launch_overhead_ns: int
    p2p_wait_ns: int
    bubble_ns: int
    dp_sync_ns: int = 0  # in the gradient sync, idle (synthetic.data_parallel)
    dp_skew_ns: int = 0  # of dp_sync: waiting for a slower replica (a sub-part, not a part)

    def parts_ns(self) -> dict[str, int]:
        """The parts by name (compute, small_gemm, slowdown, launch_overhead, p2p_wait, bubble, dp_sync)."""
        return {
            name.removesuffix("_ns"): getattr(self, name)
            for name in self.__dataclass_fields__
            if name.endswith("_ns") and name not in ("step_ns", "dp_skew_ns")
        }


@dataclass(frozen=True)
class Work:
    """How long each compute action takes: reference x small_gemm (isolated) x slowdown (measured)."""

    durations_us: Durations
    small_gemm: Factors = 1.0
    slowdown: Factors = 1.0

    def reference_ns(self, action: Action) -> int:
        kind = action.kind.value
        us = self.durations_us.get((action.stage, kind), self.durations_us.get(kind, DEFAULT_US[kind]))
        return round(us * 1000)

    def isolated_ns(self, action: Action, m: int) -> int:
        return (
            self.reference_ns(action)
            if m == 1
            else round(self.reference_ns(action) * _factor(self.small_gemm, action))
        )

    def measured_ns(self, action: Action, m: int) -> int:
        return round(self.isolated_ns(action, m) * _factor(self.slowdown, action))


def _factor(factors: Factors, action: Action) -> float:
    if isinstance(factors, (int, float)):
        return factors
    return factors.get((action.stage, action.kind.value), 1.0)


def rank_truth(
    rank: int, step_ns: int, cells, work: Work, m: int, gap: int, pairs: Mapping[Action, Action]
) -> RankTruth:
    """One rank's truth from every rank's cells (synthetic.shapes.Cell, one step on the true clock)."""
    ends = {cell.action: cell.end for rank_cells in cells.values() for cell in rank_cells}
    issues = {cell.action: cell.issue for rank_cells in cells.values() for cell in rank_cells}
    compute = isolated = measured = p2p = launches = 0
    for index, cell in enumerate(cells[rank]):
        if cell.action.kind.is_compute:
            compute += work.reference_ns(cell.action)
            isolated += work.isolated_ns(cell.action, m)
            measured += cell.end - cell.start
            launches += gap if index else 0
        elif cell.action.kind in (Kind.RECV_F, Kind.RECV_B):
            ready = [ends[matching_send(cell.action)]]  # the wait after the peer had sent
            if cell.action in pairs:  # and the receiver of the pair's SEND had posted its RECV
                ready.append(issues[matching_recv(pairs[cell.action])])
            p2p += cell.end - max(cell.issue, *ready)
    small_gemm, slowdown = isolated - compute, measured - isolated
    bubble = step_ns - measured - launches - p2p
    return RankTruth(rank, step_ns, compute, small_gemm, slowdown, launches, p2p, bubble)


def _per_kind(schedule: Schedule, stage: int, time_ns) -> dict[str, float]:
    """{"F_ms", "B_ms"(, "I_ms", "W_ms")} of one stage: `time_ns(action)` in ms, B = I + W where split."""
    kinds = ("F", "I", "W") if schedule.split_backward else ("F", "B")
    ms = {k: time_ns(Action(stage, Kind(k), 0)) / 1e6 for k in kinds}
    if schedule.split_backward:
        ms["B"] = ms["I"] + ms["W"]
    return {f"{k}_ms": v for k, v in ms.items()}


def calibration(schedule: Schedule, work: Work) -> dict[str, dict[str, float]]:
    """Whole-batch reference time per stage and kind (ms): m microbatches at reference efficiency."""
    return {
        str(s): _per_kind(schedule, s, lambda a: schedule.m * work.reference_ns(a))
        for s in range(schedule.n_stages)
    }


def calibration_by_rows(schedule: Schedule, work: Work) -> dict[str, dict[str, dict[str, float]]]:
    """Per stage, one microbatch's time alone at its rows (the isolated time), and the whole batch's."""
    whole, one = schedule.m * ROWS_PER_MICROBATCH, ROWS_PER_MICROBATCH
    table = {}
    for stage in range(schedule.n_stages):
        table[str(stage)] = {
            str(whole): _per_kind(schedule, stage, lambda a: schedule.m * work.reference_ns(a))
        }
        table[str(stage)][str(one)] = _per_kind(schedule, stage, lambda a: work.isolated_ns(a, schedule.m))
    return table


def dims(schedule: Schedule) -> dict:
    """run.json's dims as the analysis reads them: each microbatch's rows."""
    return {"rows": schedule.m * ROWS_PER_MICROBATCH, "microbatch_rows": [ROWS_PER_MICROBATCH] * schedule.m}
