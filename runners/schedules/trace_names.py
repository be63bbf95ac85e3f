"""The names the runner writes into traces and the analysis reads back: the contract between the halves.

Every executed action runs inside `record_function(label(action))`, torch.distributed.pipelining's
compact form with a `PP:` prefix (`PP:0F3`, `PP:1RECV_B0`; the stage is the global stage; `PP:` names
only actions). After its last action the native executor waits for its pending sends in a span of their
own, then takes the optimizer step in another; with DP > 1 pipelines both engines average the
gradients over the DP group in DP_GRAD_SYNC just before the optimizer step, and every rank ends the step
in STEP_END_BARRIER. The runner adds Chrome
counter tracks ("ph": "C") on the profiler's clock; the comments name their args.
"""

from __future__ import annotations

from .actions import Action

LABEL_PREFIX = "PP:"
WAIT_SENDS = "PP wait for sends"  # the native executor completing the step's isends, after its last action
OPTIMIZER_STEP = "optimizer_step"  # the SGD step and zero_grad, after the schedule (both engines)
# the barrier across the pipeline's ranks that ends each step (runners.worker), from the call to its
# return on the rank's thread: when the rank arrived, and when the barrier let it go on
STEP_END_BARRIER = "PP step-end barrier"
# DP > 1: the gradient buckets' all-reduces over the DP group ("dp"), one span a step after the schedule;
# it holds every bucket's launch and wait, or only the waits where they were launched in the backward
# (run.json dp_overlap). Not needed to find the sync: the collectives themselves are the data.
DP_GRAD_SYNC = "DP:grad_sync"
STASH_COUNTER = "PP stash"  # args: microbatches, activation_bytes (what the executor holds for backward)
CUDA_PEAK_COUNTER = "PP cuda step peak"  # args: peak_bytes_above_step_start (the allocator's, per step)
# args: run_delay_ns, the executing thread's cumulative ns runnable but waiting for a CPU
# (/proc/thread-self/schedstat's second field); sampled at the start and at the end of every native
# action, inside its span. Linux only: absent elsewhere, and from the torch engine's traces.
RUN_QUEUE_COUNTER = "PP run queue"
# The category of a host operator's span (aten ops, autograd's functions; Kineto's CPU_OP activity, the
# trace's "cat"): on CPU a compute cell's busy time is the union of these inside it on its thread, and
# the calibration times its isolated passes by the same rule (runners.measure).
OPERATOR_CATEGORY = "cpu_op"


def label(action: Action) -> str:
    """The trace label of an executed action: `PP:` + its compact form."""
    return f"{LABEL_PREFIX}{action}"
