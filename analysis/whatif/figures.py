"""The paper's what-if figures on the op-graph replay (analysis.whatif.replay), launch delays removed.

t_ori    the mean step replayed with every op's measured time
t_ideal  the mean step with every op at its optype's typical time: compute by the mean, communication
         (traces.oplevel.COMMUNICATION) by the median, over every stage, replica and step (Eq. 1)
S        t_ori / t_ideal
S_X      the mean step with the ops of X (one stage, one replica, one op type) at their measured times
         and the rest typical, over t_ideal; op types in the paper's names, a direction's
         sends and receives together as forward-pp-comm / backward-pp-comm
M_S      (t_ori - t_rem) / (t_ori - t_ideal), t_rem the mean step with the last stage's ops typical
         and the rest measured: the share of the slowdown that the last stage explains
M_W      the same with the worst 3% of workers (at least one) typical, a worker (stage, replica)
         scored min(S_stage, S_w of its replica), ties to the lower recorded rank
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import numpy as np

from analysis.schema import Summary, WhatIf
from analysis.traces.oplevel import COMMUNICATION, read_timeline
from analysis.traces.oplevel_kineto import LIMITS
from analysis.traces.run_files import oplevel_files
from analysis.whatif.replay import Measured, measure, replay

# The paper's op type names where they differ from the recorded ones.
PAPER_OPTYPE = {
    "forward-send": "forward-pp-comm",
    "forward-recv": "forward-pp-comm",
    "backward-send": "backward-pp-comm",
    "backward-recv": "backward-pp-comm",
}
WORST_WORKERS_PERCENT = 3


def typical_times(measured: Measured) -> np.ndarray:
    """Each op's typical time (broadcastable over steps and replicas)."""
    optypes = np.array(measured.graph.keys["optype"].to_list())
    typical = np.empty(len(optypes))
    for optype in set(optypes):
        mine = optypes == optype
        values = measured.time[mine]
        typical[mine] = np.median(values) if optype in COMMUNICATION else values.mean()
    return typical[:, None, None]


def _mean_step(measured: Measured, keep: np.ndarray, typical: np.ndarray) -> float:
    """The mean replayed step with the ops where `keep` at their measured times, the rest typical."""
    return float(replay(measured.graph, np.where(keep, measured.time, typical)).mean())


def _share(t_ori: float, t_rem: float, t_ideal: float) -> float:
    return (t_ori - t_rem) / (t_ori - t_ideal) if t_ori != t_ideal else 0.0


def whatif(measured: Measured) -> WhatIf:
    """The figures of the module's docstring."""
    keys = measured.graph.keys
    typical = typical_times(measured)
    everything = np.ones(measured.time.shape, dtype=bool)
    t_ori = _mean_step(measured, everything, typical)
    t_ideal = _mean_step(measured, ~everything, typical)
    stage = keys["stage"].to_numpy()[:, None, None]
    replica = np.arange(measured.time.shape[2])[None, None, :]
    paper = np.array([PAPER_OPTYPE.get(t, t) for t in keys["optype"].to_list()])[:, None, None]

    def slowdown(keep: np.ndarray) -> float:
        return _mean_step(measured, np.broadcast_to(keep, measured.time.shape), typical) / t_ideal

    by_stage = {str(s): slowdown(stage == s) for s in np.unique(stage)}
    by_dp_rank = {str(d): slowdown(replica == d) for d in range(replica.size)}
    by_optype = {str(t): slowdown(paper == t) for t in np.unique(paper)}
    last = stage == stage.max()
    t_rem_stage = _mean_step(measured, np.broadcast_to(~last, measured.time.shape), typical)
    score = {w: min(by_stage[str(w[0])], by_dp_rank[str(w[1])]) for w in measured.rank}
    worst = sorted(score, key=lambda w: (-score[w], measured.rank[w]))
    worst = worst[: math.ceil(len(worst) * WORST_WORKERS_PERCENT / 100)]
    on_worst = np.zeros(measured.time.shape, dtype=bool)
    for s, d in worst:
        on_worst[(stage == s)[:, 0, 0], :, d] = True
    t_rem_workers = _mean_step(measured, ~on_worst, typical)
    return WhatIf(
        S=t_ori / t_ideal,
        by_stage=by_stage,
        by_dp_rank=by_dp_rank,
        by_optype=by_optype,
        M_S=_share(t_ori, t_rem_stage, t_ideal),
        M_W=_share(t_ori, t_rem_workers, t_ideal),
        steps=len(measured.steps),
        step_ms=float(measured.step_s.mean()) * 1e3,
        replay_ms=t_ori * 1e3,
        ideal_ms=t_ideal * 1e3,
        worst_workers=[[int(s), int(d)] for s, d in worst],
    )


def run_whatif(run_dir: Path) -> WhatIf | None:
    """The figures of an op-level run (analysis.traces.oplevel); None for a run of another kind."""
    found = oplevel_files(run_dir)
    if found is None:
        return None
    return whatif(measure(read_timeline(run_dir).lanes(), found[0]))


def with_whatif(summary: Summary, run_dir: Path) -> Summary:
    """`summary` with the run's what-if figures and, for an op-level run, the limits of what its analysis
    could measure (analysis.traces.oplevel_kineto.LIMITS)."""
    found = run_whatif(run_dir)
    notes = summary.notes if found is None else [*summary.notes, LIMITS]
    return msgspec.structs.replace(summary, whatif=found, notes=notes)
