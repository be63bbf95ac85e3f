"""The analysis's words, each spelled once (docs/numbers.md defines them).

- GapClass: what an idle stretch of a rank's step is (gaps.parquet `class`).
- Part: what a rank's step is cut into; parts sum to the step (summary.json `ranks[].<part>_ms`). The
  idle parts are the gap classes; the busy ones split the rank's busy time.
- Effect: what the waterfall adds to the formula's step, one replay at a time, and what the verdict's
  findings go after. An effect is measured on the typical step's critical path, a part on one rank's
  median step: they are different time, and no effect shares a name with a part.
- RUNGS: the waterfall's terms in order, from the ideal to the measured step.
- Level: the trust's two levels.
- Assumption: what a forecast takes without the run measuring it (ASSUMED says each in a sentence).

Every member is also its own string (`str`, and `str(member)` its value), so it serves as a polars
column name, a JSON key stem or a value in a table.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A name that is its own string value."""

    def __str__(self) -> str:
        return self.value


class GapClass(Word):
    BUBBLE = "bubble"  # waiting for a producer that had not produced yet (fill and drain included)
    P2P_WAIT = "p2p_wait"  # waiting after the producer began sending: the transfer
    DP_SYNC = "dp_sync"  # in data-parallel collectives that compute did not hide
    LAUNCH_OVERHEAD = "launch_overhead"  # the host had not issued the next work
    OTHER = "other"  # work outside the schedule


class Part(Word):
    COMPUTE = "compute"  # the work at full-batch efficiency
    SMALL_GEMM = "small_gemm"  # the same work at its microbatch's size, beyond that
    SLOWDOWN = "slowdown"  # busy time beyond the work timed alone
    BUBBLE = GapClass.BUBBLE.value
    P2P_WAIT = GapClass.P2P_WAIT.value
    DP_SYNC = GapClass.DP_SYNC.value
    LAUNCH_OVERHEAD = GapClass.LAUNCH_OVERHEAD.value
    OTHER = GapClass.OTHER.value


class Effect(Word):
    IMBALANCE = "imbalance"  # stages' full-batch work against their mean
    SMALL_BATCHES = "small_batches"  # each cell's work timed alone at its microbatch's size
    INTERFERENCE = "interference"  # each cell's measured busy time against that
    HOST = "host_time"  # host time before and inside actions
    TRANSFER = "transfer"  # hops' transfers after both sides posted
    TAIL = "tail"  # each rank's time after its last action: DP sync, optimizer, host


# The waterfall's terms: the ideal (the work evenly split at full-batch efficiency), its fill and
# drain at the formula's geometry, the effects, the median step's own inputs against the typical ones,
# and what no input explains.
IDEAL, FILL_DRAIN, VARIABILITY, RESIDUAL = "ideal", "fill_drain", "variability", "residual"
RUNGS = (IDEAL, FILL_DRAIN, *(effect.value for effect in Effect), VARIABILITY, RESIDUAL)


class DeviceIdle(Word):
    """Holistic Trace Analysis's classes of a GPU stream's idle time (analysis.timeline.classify.device_idle)."""

    HOST_WAIT = "host_wait"  # nothing launched: the host had not issued the next kernel
    KERNEL_WAIT = "kernel_wait"  # a queued kernel's own delay after the one before
    OTHER = "other"  # queued behind something else


class Level(Word):
    HIGH = "high"
    LOW = "low"


# The verdict's findings are of the effects, and of these.
STRAGGLER = "straggler"  # a replica every other waits for in the gradient sync


class Assumption(Word):
    """What a forecast (`predict`, `advise`) takes without the run measuring it: named beside each figure
    that rests on it (Prediction.assumptions, Candidate.assumptions, Advice.assumptions; ASSUMED says each)."""

    ROWS_EVEN = "rows_split_evenly"
    TIME_PER_ROW = "time_per_row_constant"
    CELLS_AS_MEASURED = "cells_as_measured"
    LAYERS_SPLIT = "layers_split_evenly"
    BACKWARD_SPLIT = "backward_split_1_1"
    MEMORY_UNKNOWN = "memory_unknown"


ASSUMED = {
    Assumption.ROWS_EVEN: "no microbatch rows in run.json: the run's batch at every m, split evenly",
    Assumption.TIME_PER_ROW: (
        "no isolated calibration: a cell's time per row as measured at every microbatch size; the interval "
        "is widened by the size-efficiency band"
    ),
    Assumption.CELLS_AS_MEASURED: (
        "no isolated calibration: each cell takes its measured busy time in any order, whatever runs beside "
        "it (the slowdown from ranks computing together is not carried)"
    ),
    Assumption.LAYERS_SPLIT: (
        "stage times at another v taken as shares of the layers of the run's stages, host time and stash "
        "per microbatch likewise"
    ),
    Assumption.BACKWARD_SPLIT: "B split into I and W in their unit-time ratio 1:1; the run measured no I or W",
    Assumption.MEMORY_UNKNOWN: "the traces have no memory events: activation memory unknown, the ranking ignores it",
}
