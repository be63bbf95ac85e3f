"""The trust gate: is the job a pipeline at all, and how far do its figures hold (docs/numbers.md#trust).

The pipeline model claims that ranks pass work point to point in stage chains, that the cells replay
in the order they ran, and that the replay closes on the measured step. `pipeline_evidence` checks the
first claim before any pipeline figure is made: a job none of whose ranks sends, receives or carries
pipeline labels (DDP, FSDP, DLRM's all_to_all, a single-GPU model) is refused in one line that says
what was found instead (NotAPipeline). `trust_of` checks the rest on the analysed job: each reason is
one measured condition, and any of them makes the trust low.
"""

from __future__ import annotations

import statistics

from analysis.errors import NotAPipeline
from analysis.schema import ClockEstimate, RankIntegrity, Rules, Summary, Trust
from analysis.traces.integrity import PROBLEMS
from analysis.trust.evidence import CommCensus
from analysis.vocabulary import Level

HIGH, LOW = Level.HIGH, Level.LOW


def _per_step(censuses: list[CommCensus]) -> str:
    """The collectives a rank calls per step (the median over ranks), most frequent first."""
    kinds = sorted({kind for c in censuses for kind in c.collectives})
    typical = {k: statistics.median(c.collectives.get(k, 0) / c.steps for c in censuses) for k in kinds}
    shown = [f"{kind} x {n:g}" for kind, n in sorted(typical.items(), key=lambda kv: -kv[1]) if n]
    return f"found {', '.join(shown)} per step" if shown else "found no collectives either"


def pipeline_evidence(source, censuses: dict[int, CommCensus], world_size: int | None = None) -> None:
    """NotAPipeline, naming `source` and what the ranks do instead, where no rank hops (`world_size`:
    the job's ranks, where the traces hold only some of them)."""
    if any(c.hops for c in censuses.values()):
        return
    found = _per_step(list(censuses.values()))
    if world_size is not None and world_size > len(censuses):
        raise NotAPipeline(
            source,
            f"not a pipeline-parallel job: its {len(censuses)} rank(s) here of {world_size} show no send/recv "
            f"and no pipeline labels; {found} (a rank's median)",
        )
    if len(censuses) == 1:
        raise NotAPipeline(
            source, f"not a pipeline-parallel job: one rank, no send/recv and no pipeline labels; {found}"
        )
    raise NotAPipeline(
        source,
        f"not a pipeline-parallel job: no send/recv between its {len(censuses)} ranks and no pipeline "
        f"labels; {found} (a rank's median)",
    )


def _clock_reasons(clock: ClockEstimate | None) -> list[str]:
    if clock is None:
        return []
    reasons = []
    unlinked = [r.rank for r in clock.ranks if r.via == "unlinked"]
    if unlinked:
        reasons.append(
            f"rank(s) {', '.join(map(str, unlinked))}: no transfer or collective pins their clock offset"
        )
    if clock.inconsistent_pairs:
        pairs = ", ".join(f"{a}-{b}" for a, b in clock.inconsistent_pairs[:4])
        reasons.append(f"the transfers between ranks {pairs} contradict one clock offset (causality)")
    return reasons


def integrity_reasons(integrity: list[RankIntegrity], rules: Rules) -> list[str]:
    """A reason per rank more of whose events than `rules.trust_integrity_max` cannot be taken as written
    (string times aside: they are read exactly)."""
    reasons = []
    for found in integrity:
        counted = {name: getattr(found, name) for name in PROBLEMS if name != "string_timestamps"}
        if sum(counted.values()) > rules.trust_integrity_max * found.events:
            shown = ", ".join(f"{name.replace('_', ' ')} {n}" for name, n in counted.items() if n)
            reasons.append(f"rank {found.rank}: {shown} of its {found.events} events (trace integrity)")
    return reasons


def trust_of(summary: Summary, cells: int, rules: Rules = Rules()) -> Trust:
    """The analysed job's trust: low where a step's replay misses by more than `rules.trust_residual_max`
    of it, where most of its `cells` (compute and transfer cells, all ranks) were inferred from the op
    stream, where the clock alignment could not pin a rank, or where a rank's trace has integrity
    problems in more than `rules.trust_integrity_max` of its events."""
    reasons = []
    missed = [
        s for s in summary.replayed_steps if abs(s.residual_ms) > rules.trust_residual_max * s.step_time_ms
    ]
    if missed:
        worst = max(missed, key=lambda s: abs(s.residual_ms) / s.step_time_ms)
        reasons.append(
            f"the replay misses {len(missed)} of {len(summary.replayed_steps)} steps by more than "
            f"{rules.trust_residual_max:.0%} (step {worst.step}: {worst.residual_ms / worst.step_time_ms:+.0%}): "
            "a dependency or an input the model lacks"
        )
    if cells and summary.inferred_cells > rules.trust_inferred_max * cells:
        reasons.append(
            f"{summary.inferred_cells} of {cells} cells inferred from the op stream (no pipeline labels): "
            "their kind and microbatch are guesses"
        )
    reasons += _clock_reasons(summary.clock)
    reasons += integrity_reasons(summary.integrity, rules)
    return Trust(level=LOW if reasons else HIGH, reasons=reasons)
