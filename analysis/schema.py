"""The analysis's vocabulary and its typed summary: every name more than one room uses, declared once.

`summary.json` is a `Summary` encoded as JSON; `analysis.results` writes it and decodes it back into the
same Struct, so the merge, the report and the benchmarks read attributes, not string keys. Times are
milliseconds of one training step (the median profiled step's). The action kinds are the schedules'
own (runners.schedules: COMPUTE_KINDS, COMM_KINDS).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import msgspec

from analysis.traces.integrity import Integrity
from analysis.vocabulary import GapClass, Part
from runners.schedules import COMM_KINDS, COMPUTE_KINDS

__all__ = [
    "Parts",
    "PipelineEntry",
    "Straggler",
    "Finding",
    "Trust",
    "Verdict",
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "GAP_CLASSES",
    "RANK_PARTS",
    "CriticalShare",
    "RankAlone",
    "RankIntegrity",
    "RankEntry",
    "RanksSummary",
    "Scope",
    "StepReplay",
    "Rules",
    "Summary",
    "Waterfall",
]


def _rule(default, meaning: str):
    """A threshold with what it decides, for the report's table of them."""
    return field(default=default, metadata={"meaning": meaning})


@dataclass(frozen=True)
class Rules:
    """The thresholds the analysis decides by (analysis.timeline.classify, analysis.caveats); echoed into
    summary.json `rules`; the report lists them with their meanings."""

    host_gap_max_ns: int = _rule(
        1_000_000,
        "ns. Idle between two actions (CPU) or before a rank's first action (CPU, GPU) up to this long is "
        "launch_overhead (the host getting to it); longer, between actions it is other (optimizer, data "
        "loading), before the first action bubble (nothing to do yet) unless that action is compute (it "
        "waits on no peer: launch_overhead at any length)",
    )
    kernel_wait_max_ns: int = _rule(
        30,
        "ns. device_idle only: a queued stretch between two kernels shorter than this is the device's own "
        "kernel-to-kernel delay (HTA's consecutive_kernel_delay, same default)",
    )
    trust_residual_max: float = _rule(
        0.10,
        "fraction of the step. A step whose completeness residual (measured step - its own replay) is "
        "beyond this makes the trust low: our runs close within 0.3%, so a miss this large is a "
        "dependency or an input the model lacks, not noise",
    )
    trust_inferred_max: float = _rule(
        0.5,
        "fraction. More of the cells than this inferred from the op stream (no PP: labels) makes the "
        "trust low: their kind and microbatch are read from op patterns",
    )
    trust_integrity_max: float = _rule(
        0.01,
        "fraction of a rank's events. More of them than this that a viewer or the analysis cannot take "
        "as written (overlapping or overrunning slices, slices outside every step, launches whose kernels "
        "are missing) makes the trust low; string times are read exactly and do not count",
    )
    noisy_spread_max: float = _rule(
        0.25,
        "fraction. A run whose profiled or unprofiled step times spread, (max - min) / median, beyond this "
        "is flagged noisy; the benchmarks call a range this wide too wide to read alone",
    )


def rule_meanings() -> dict[str, str]:
    """Each threshold's name -> what it decides, with its unit."""
    return {f.name: f.metadata["meaning"] for f in fields(Rules)}


# What an idle stretch of a rank's step is (gaps.parquet `class`; docs/numbers.md#gap-classes).
GAP_CLASSES = tuple(GapClass)


class Parts(msgspec.Struct, kw_only=True):
    """A rank's step cut into parts (ms) that sum to the step time exactly (analysis.attribution.parts).
    small_gemm and slowdown are None where the isolated calibration is missing (unknown, not 0); then
    compute is all the busy time."""

    compute_ms: float  # the work at full-batch efficiency (the calibration's share per microbatch)
    small_gemm_ms: float | None  # the same work timed in isolation at the cell's microbatch size, beyond that
    slowdown_ms: float | None  # busy time beyond the isolated work: what running in the pipeline adds
    bubble_ms: float
    p2p_wait_ms: float
    dp_sync_ms: float = (
        0.0  # in data-parallel collectives, compute idle (analysis.timeline.dp_sync); 0 at dp=1
    )
    launch_overhead_ms: float
    other_ms: float


# The rank parts in the order the report stacks them.
RANK_PARTS = tuple(Part)  # Parts' fields, each with _ms (tests/test_vocabulary.py)


class RankEntry(Parts, kw_only=True):
    """One rank of the median step: its parts and what they are made of."""

    rank: int
    stage_ids: list[int]  # global stages on this rank, from the schedule's placement
    busy_ms: float  # time work ran: compute + small_gemm + slowdown (not a part of its own)
    cpu_contention_ms: float | None  # of slowdown: runnable but not running (CPU, Linux); None unmeasured
    pipeline: int = 0  # the index of its pipeline in Summary.pipelines
    dp_skew_ms: float = 0.0  # of dp_sync: waiting for a slower replica (the collectives' start skew)
    peak_activation_bytes: int | None  # None: the traces have no memory events (unknown, not 0)

    def part_ms(self, part: str) -> float | None:
        return getattr(self, f"{part}_ms")


class Waterfall(msgspec.Struct, kw_only=True):
    """The step from the formula to the measurement, term by term (ms; analysis.attribution.waterfall.ladder;
    the terms analysis.vocabulary.RUNGS): docs/numbers.md#waterfall. None: unknown without the isolated
    calibration."""

    ideal: float
    fill_drain: float
    imbalance: float
    small_batches: float | None
    interference: float | None
    host_time: float
    transfer: float
    tail: float
    variability: float
    residual: float


class StepReplay(msgspec.Struct, kw_only=True):
    """One analysed step against its own replay (ms)."""

    step: int
    step_time_ms: float
    replay_ms: float  # the step replayed from its own measurements
    residual_ms: float  # step_time_ms - replay_ms: the completeness residual
    # two waits, named: the latest rank's step opened this long after the first's, nothing recorded
    # before it (the previous step still holding it, a descheduled thread); the step ran on this long
    # after every rank's last recorded activity (its step-end barrier's included). Without a labelled
    # step-end barrier (others' loops) no measured activity explains them: they are in the residual.
    # With one (our runners) the replay starts each rank at its opening and ends it by the barrier.
    opened_late_ms: float
    ran_on_ms: float
    step_end_barrier: bool = False  # the step ended in the labelled barrier: both waits are replayed


class CriticalShare(msgspec.Struct, kw_only=True):
    """Of the median step's critical path: the ms of one part on one stage (None: host time between
    actions and the ranks' tails, which belong to no stage)."""

    part: str  # a rank part's name without _ms, or "hop" for a transfer
    stage: int | None
    ms: float


class Noise(msgspec.Struct, kw_only=True):
    """How steady the run was (analysis.caveats): spreads are (max - min) / median."""

    profiled_spread: float  # over the analysed steps
    unprofiled_spread: float | None  # over run.json's unprofiled steps; None without them
    profiler_cost: float | None  # profiled median step / unprofiled median step


class PipelineEntry(msgspec.Struct, kw_only=True):
    """One pipeline of the job: its ranks and its own figures (analysis.job.join)."""

    ranks: list[int]  # global ranks, in stage order
    median_step: int  # its step of median length: its ranks' entries are that step's
    step_time_ms: float  # that step's time: its ranks' parts sum to it
    # its step less the time its ranks waited for slower replicas (the longest such rank's): the step it
    # would take alone, which tells the straggler where the gradient sync makes every step as long
    step_time_alone_ms: float
    bubble_measured: float


class Straggler(msgspec.Struct, kw_only=True):
    """The spread between pipelines: the slowest against the fastest."""

    pipeline: int  # index into Summary.pipelines
    slower_ms: float  # its step_time_alone_ms less the fastest's
    slower_fraction: float  # slower_ms / the fastest's step_time_alone_ms


class WhatIf(msgspec.Struct, kw_only=True):
    """The StragglerAnalysis paper's what-if figures of an op-level run (analysis.whatif.figures):
    RUN/whatif.json and summary.json's `whatif`. Maps are keyed by stage, replica (dp_rank) or op type."""

    S: float
    by_stage: dict[str, float]
    by_dp_rank: dict[str, float]
    by_optype: dict[str, float]
    M_S: float
    M_W: float
    steps: int
    step_ms: float  # the recorded mean step
    replay_ms: float  # t_ori: the mean step replayed with the measured times, launch delays removed
    ideal_ms: float  # t_ideal: every op at its typical time
    worst_workers: list[list[int]]  # M_W's workers as [stage, dp_rank]


class RankIntegrity(Integrity, frozen=True, kw_only=True):
    """One rank's trace integrity counts (analysis.traces.integrity; docs/numbers.md#integrity)."""

    rank: int


class Trust(msgspec.Struct, kw_only=True):
    """Whether the pipeline model fits this trace well enough to act on its figures
    (analysis.trust.gate; docs/numbers.md#trust)."""

    level: str  # "high" | "low"
    reasons: list[str] = []  # why it is low, one clause each; empty when high


class Finding(msgspec.Struct, kw_only=True):
    """One place the step loses time that a pipeline user can change (analysis.verdict;
    docs/numbers.md#verdict): what the replay recovers without it, and the change that goes after it."""

    kind: str  # the effect or part it rests on: host_time, transfer, tail, imbalance, bubble, dp_sync, ...
    rank: int | None  # the rank it is on, where it is one rank's
    stage: int | None  # the stage it is on, where it is one stage's
    recoverable_ms: float  # the typical step less its replay without this time (the gain ceiling)
    action: str  # what to change
    evidence: str  # the measurements it rests on
    # the typical step replayed with the action's change, and the interval the run's spread gives it;
    # None where the action is not a change the model can replay
    predicted_step_ms: float | None = None
    predicted_low_ms: float | None = None
    predicted_high_ms: float | None = None


class Verdict(msgspec.Struct, kw_only=True):
    """The answer first: a few sentences, and the findings by recoverable time, largest first."""

    sentences: list[str]
    recommends: bool  # False where the evidence is too weak to act on (low trust, noise): said why
    findings: list[Finding]


# Per-rank clock offsets (analysis.timeline.clock estimates them; summary.json's clock stores them).
@dataclass(frozen=True)
class RankClock:
    rank: int
    offset_ns: int  # add to this rank's timestamps to put them on the reference rank's clock
    uncertainty_ns: int | None  # None: only bounded on one side, or not linked to the reference
    via: str  # reference | p2p | collective | unlinked


@dataclass(frozen=True)
class ClockEstimate:
    reference_rank: int
    ranks: tuple[RankClock, ...]
    transfers: int  # pipeline transfers used as evidence
    collectives: int  # collective instances used as evidence
    inconsistent_pairs: tuple[tuple[int, int], ...]  # rank pairs whose bounds contradict each other

    def offset_ns(self, rank: int) -> int:
        return next((r.offset_ns for r in self.ranks if r.rank == rank), 0)


class Summary(msgspec.Struct, kw_only=True):
    """summary.json: the keys docs/ARCHITECTURE.md section 3 lists (each number: docs/numbers.md), plus what
    the later stages need to show them."""

    scope: str = "pipeline"  # a whole job's; RanksSummary's is "ranks"
    schedule: str  # run.json's name, the generator whose order the traces match exactly, or "custom"
    nearest_schedule: str | None  # for a custom order, the generator whose order is closest; else None
    engine: str | None
    device: str
    p: int
    m: int
    v: int
    steps_analyzed: int
    median_step: int  # the ProfilerStep whose time is the (lower) median: ranks and waterfall are its
    step_time_ms: float  # profiled: the longest rank window of the median step
    step_time_unprofiled_ms: float | None  # run.json's median of the steps timed without the profiler
    bubble_formula: float
    bubble_measured: float  # bubble (busy-time): 1 - sum of busy time / (p * step)
    # the seed's 1 - m*t_slot/step: 1 - the cells' work timed alone (compute + small_gemm) / (p * step);
    # None without the isolated calibration
    bubble_seed: float | None
    typical_step_ms: float  # the typical step's replay (analysis.attribution.model)
    waterfall_ms: Waterfall  # the fixed ladder
    waterfall_shapley_ms: Waterfall  # the same terms, each effect at its Shapley value
    replayed_steps: list[StepReplay]  # every analysed step against its own replay
    critical_path: list[CriticalShare]  # the median step's, by part and stage
    parts: tuple[str, ...]  # the rank-entry keys that sum to the step time
    ranks: list[RankEntry]
    rules: Rules  # the classification thresholds used
    clock: ClockEstimate | None  # offsets applied to put ranks on one clock; None: they share one
    inferred_cells: int  # cells read from the op stream rather than from PP: labels
    noise: Noise
    flags: list[str]  # "contended", "noisy" (analysis.caveats), each with a note
    notes: list[str]  # caveats a reader of the numbers must know (e.g. more rank threads than cores)

    # the job (PP x DP): the figures above are the slowest pipeline's; defaults read older summaries
    dp: int = 1
    pipelines: list[PipelineEntry] = []
    straggler: Straggler | None = None  # None with one pipeline
    whatif: WhatIf | None = None  # op-level runs only (analysis.traces.oplevel)
    # set by analysis.trust.gate and analysis.verdict once the job is analysed (None: not yet assessed)
    integrity: list[RankIntegrity] = []
    trust: Trust | None = None
    verdict: Verdict | None = None

    def rank_entry(self, rank: int) -> RankEntry:
        return next(entry for entry in self.ranks if entry.rank == rank)


class RankAlone(RankEntry, kw_only=True):
    """One present rank of a job whose other ranks are not in the traces, measured alone
    (analysis.job.partial; docs/numbers.md#ranks-alone): its parts close on its own step."""

    step: int  # its step of median length, whose figures these are
    step_time_ms: float  # that step's window on this rank
    bubble_measured: float  # its own: 1 - busy / its step
    unmatched_wait_ms: float  # of other: blocked in receives whose sender is not in the traces


class RanksSummary(msgspec.Struct, kw_only=True):
    """summary.json of some ranks of a bigger job (`scope` "ranks"): each present rank's own figures;
    the figures across ranks are `unknown`, each with why."""

    scope: str = "ranks"
    schedule: str | None  # run.json's, where it says
    engine: str | None
    device: str
    p: int | None  # the job's, where run.json says
    m: int | None
    v: int | None
    world_size: int
    ranks_present: list[int]
    step_time_ms: float  # the longest of the present ranks' steps of median length
    bubble_formula: float | None  # at the job's schedule, p, m and v where run.json says them
    ranks: list[RankAlone]
    unknown: list[str]
    inferred_cells: int
    rules: Rules
    integrity: list[RankIntegrity]
    trust: Trust
    verdict: Verdict


class Scope(msgspec.Struct):
    """What a summary.json covers: a whole job (`pipeline`, Summary) or some of its ranks (RanksSummary)."""

    scope: str = "pipeline"


# The forecasts `predict` and `advise` write beside the analysis (RUN/predict.json, RUN/advice.json) and
# the analysis keeps of its own (analysis/predictions.json): analysis.results reads and writes them.
MIB = 2**20  # --memory-mb counts MiB


@dataclass(frozen=True)
class Prediction:
    m: int
    step_time_ms: float
    step_time_low_ms: float
    step_time_high_ms: float
    bubble_formula: float
    bubble_predicted: float  # 1 - busy / (p * step), the busy-time bubble of the predicted step
    assumptions: list[str] = field(default_factory=list)  # vocabulary.Assumption names its figures rest on


@dataclass(frozen=True)
class Candidate:
    engine: str | None  # native | torch: `make trace ENGINE=...` runs it; None: the run's own, unnamed
    schedule: str
    m: int
    v: int
    step_time_ms: float
    step_time_low_ms: float
    step_time_high_ms: float
    bubble_formula: float
    peak_activation_bytes: int | None  # the largest rank's; None: the run measured no stash
    fits: bool  # within the memory limit (true without one)
    extrapolated: bool  # needs what the run did not measure: `assumptions` and `caveats` say what
    caveats: list[str] = field(default_factory=list)  # another engine's run; an interval wider than promised
    assumptions: list[str] = field(default_factory=list)  # vocabulary.Assumption names its figures rest on


@dataclass(frozen=True)
class Advice:
    ranked: bool  # false: the predictions' level cannot be trusted (`caveats` say why); listed anyway
    caveats: list[str]
    memory_limit_bytes: int | None
    source: dict  # the run advised from: engine, schedule, p, m, v, step_time_ms
    candidates: list[Candidate]  # best first: those that fit by predicted step time, then the others
    assumptions: list[str] = field(default_factory=list)  # the ranking's own (memory_unknown)
