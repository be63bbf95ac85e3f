"""One process's trace of P pipeline ranks on one GPU, each rank's stages on its own CUDA stream
(runners.engines.single_gpu; run.json "mode": "single_gpu"), read as P rank traces: one virtual rank per
compute stream, so the cells, classes and waterfall are those of a P-GPU run.

Layout. A stage's compute stream is the stream its compute actions' (F, B, I, W) kernels ran on; the
stages of one stream are one virtual rank, numbered by their lowest stage (where a loop or a V
placement puts stage r). A run's only trace is split when it is the whole job (a world of one process)
and its stages compute on two or more streams, one stream per stage; one rank of a bigger job is not
(its stages are its own); run.json's mode single_gpu without that layout is refused.

Events. A host event belongs to the rank of the PP label it starts in (on its thread; on a thread that
holds no label, such as autograd's engine thread, the label open then: analysis.cells.labelled), a
device event to the rank whose label launched it, else to the rank of its stream; the rest (the
ProfilerStep spans, thread names, work on no rank's stream) is every rank's. So a SEND's copy is the
sender's, as an NCCL send kernel is on a multi-GPU rank: it starts when the data leaves.

The receive. A RECV makes its compute stream wait for the copy, which CUPTI does not record. Each RECV
gets the device op an NCCL receive kernel would be, on the receiver's compute stream: from when that
stream was free (the work launched on it before the RECV done, and the step begun: the engine makes
every stream wait for the step's start, its first kernel) until the copy ended. That holds where the
host issued the RECV before the copy ended: one host thread issues every rank's work, so a rank's first
RECV of a step goes out only after its producer's SEND, but the stream had to wait for the data anyway.
Where the host issued it after the copy ended, the stream idled for the host, not for the data, and
the wait is empty, at the issue. A runtime row spanning the RECV's label launches it. These two rows
are derived, not read: they have no `index` (no event of the file) and negative correlation ids (none
of Kineto's).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl

from analysis.cells.labelled import _events_in_labels, device_events
from analysis.cells.labels import label_spans
from analysis.errors import InputError
from analysis.traces.kineto import DEVICE_TRACK_CATS
from analysis.traces.run import RunTraces
from analysis.traces.spans import assign_steps, step_spans
from runners.schedules import COMPUTE_KINDS
from runners.schedules.single_gpu import SINGLE_GPU

RECEIVE = "PP receive: stream wait for the copy"  # the derived device op of a RECV
RECEIVE_CATEGORY = "gpu_memcpy"  # it ends with the copy it waits for
RECEIVE_LAUNCH = "cudaStreamWaitEvent"  # the derived runtime row that issued it
# RECV kind -> (stage step to the sender, the sender's SEND kind)
_SENDER = {"RECV_F": (-1, "SEND_F"), "RECV_B": (1, "SEND_B")}


def labels_of(frame: pl.DataFrame, source: Path) -> pl.DataFrame:
    """The frame's PP labels with their profiled step (analysis.cells.labelled); `source` names the file
    in errors."""
    return assign_steps(label_spans(frame, source), step_spans(frame))


def launched_in_labels(device: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """Device events (analysis.cells.labelled.device_events) with the label that launched them: step,
    stage, kind, microbatch, stream, correlation, k_start and k_end (on the device)."""
    launched = device.drop_nulls("launch_ns").rename({"start_ns": "k_start", "end_ns": "k_end"})
    owned = _events_in_labels(launched.with_columns(start_ns="launch_ns"), labels, across_threads=True)
    return owned.select("step", "stage", "kind", "microbatch", "stream", "correlation", "k_start", "k_end")


def stage_ranks(launched: pl.DataFrame) -> pl.DataFrame | None:
    """stage, stream, owner: each stage's compute stream and virtual rank, where every stage computes on
    one stream and there are two or more (the single-GPU layout); else None."""
    compute = launched.filter(pl.col("kind").is_in(COMPUTE_KINDS)).select("stage", "stream").unique()
    if compute["stream"].n_unique() < 2 or compute["stage"].is_duplicated().any():
        return None
    lowest = compute.group_by("stream").agg(pl.col("stage").min()).sort("stage")
    ranks = {stream: rank for rank, stream in enumerate(lowest["stream"])}
    return compute.with_columns(owner=pl.col("stream").replace_strict(ranks, return_dtype=pl.Int64))


def owners(frame: pl.DataFrame, labels: pl.DataFrame, stages: pl.DataFrame) -> pl.DataFrame:
    """index, owner: the virtual rank of every event that has one (the module docstring)."""
    on_device = pl.col("cat").str.to_lowercase().is_in(DEVICE_TRACK_CATS).fill_null(False)
    host = frame.filter(~on_device & (pl.col("ph") != "M") & pl.col("tid").is_not_null())
    in_labels = _events_in_labels(
        host.select("index", "rank", "tid", "start_ns"), labels, across_threads=True
    )
    host_owners = in_labels.join(stages, on="stage").select("index", "owner")
    launch_owners = (
        frame.filter(pl.col("correlation").is_not_null() & ~on_device)
        .join(host_owners, on="index")
        .select("correlation", "owner")
        .unique("correlation", keep="any")
    )
    device = frame.filter(on_device).select("index", "correlation", "stream")
    by_launch = device.join(launch_owners, on="correlation", how="left")
    stream_owners = (
        by_launch.drop_nulls("owner")
        .group_by("stream")
        .agg(pl.col("owner").unique())
        .filter(pl.col("owner").list.len() == 1)
        .select("stream", stream_owner=pl.col("owner").list.first())
    )
    device_owners = by_launch.join(stream_owners, on="stream", how="left").select(
        "index", owner=pl.coalesce("owner", "stream_owner")
    )
    return pl.concat([host_owners, device_owners.drop_nulls("owner")])


def _arrivals(labels: pl.DataFrame, launched: pl.DataFrame, stages: pl.DataFrame) -> pl.DataFrame:
    """Each RECV label with its rank (owner), compute stream, the end of the copy its SEND launched
    (arrival_ns) and its step's first kernel (step_start_ns)."""
    recvs = (
        labels.filter(pl.col("kind").is_in(list(_SENDER)))
        .join(stages, on="stage")
        .with_columns(
            send_stage=pl.col("stage")
            + pl.col("kind").replace_strict({k: v[0] for k, v in _SENDER.items()}, return_dtype=pl.Int64),
            send_kind=pl.col("kind").replace_strict({k: v[1] for k, v in _SENDER.items()}),
        )
    )
    copies = launched.group_by("step", "stage", "kind", "microbatch").agg(arrival_ns=pl.col("k_end").max())
    step_starts = launched.group_by("step").agg(step_start_ns=pl.col("k_start").min())
    return recvs.join(
        copies,
        left_on=["step", "send_stage", "send_kind", "microbatch"],
        right_on=["step", "stage", "kind", "microbatch"],
    ).join(step_starts, on="step")


def _ready(arrivals: pl.DataFrame, device: pl.DataFrame) -> pl.DataFrame:
    """arrivals with ready_ns, when the RECV's wait began (the module docstring)."""
    done = (
        device.drop_nulls("launch_ns")
        .sort("launch_ns")
        .select("stream", "launch_ns", done_ns=pl.col("end_ns").cum_max().over("stream"))
    )
    before = arrivals.sort("start_ns").join_asof(
        done,
        left_on="start_ns",
        right_on="launch_ns",
        by="stream",
        allow_exact_matches=False,
        check_sortedness=False,
    )
    issued_late = pl.col("end_ns") > pl.col("arrival_ns")
    free = pl.max_horizontal("done_ns", "step_start_ns")
    return before.with_columns(ready_ns=pl.when(issued_late).then("end_ns").otherwise(free))


def receives(
    frame: pl.DataFrame,
    labels: pl.DataFrame,
    device: pl.DataFrame,
    launched: pl.DataFrame,
    stages: pl.DataFrame,
) -> pl.DataFrame:
    """The derived rows of every RECV (the module docstring) in the frame's columns, `rank` its owner."""
    ready = _ready(_arrivals(labels, launched, stages), device).with_columns(
        correlation=-pl.int_range(1, pl.len() + 1, dtype=pl.Int64)
    )
    waits = ready.select(
        "owner",
        "stream",
        "correlation",
        tid="stream",
        start_ns="ready_ns",
        end_ns=pl.max_horizontal("ready_ns", "arrival_ns"),
        name=pl.lit(RECEIVE),
        cat=pl.lit(RECEIVE_CATEGORY),
    )
    issues = ready.select(
        "owner",
        "tid",
        "correlation",
        "start_ns",
        "end_ns",
        name=pl.lit(RECEIVE_LAUNCH),
        cat=pl.lit("cuda_runtime"),
    )
    rows = pl.concat([waits, issues], how="diagonal").with_columns(ph=pl.lit("X")).rename({"owner": "rank"})
    return pl.concat([frame.clear(), rows], how="diagonal_relaxed").select(frame.columns)


def split(frame: pl.DataFrame, source: Path) -> dict[int, pl.DataFrame] | None:
    """rank -> its frame, where `frame` (read from `source`) is the single-GPU layout; None where it is not."""
    labels, device = labels_of(frame, source), device_events(frame)
    launched = launched_in_labels(device, labels)
    stages = stage_ranks(launched)
    if stages is None:
        return None
    owned = frame.join(owners(frame, labels, stages), on="index", how="left")
    derived = receives(frame, labels, device, launched, stages)
    return {
        rank: pl.concat(
            [
                owned.filter(pl.col("owner").is_null() | (pl.col("owner") == rank))
                .drop("owner")
                .with_columns(rank=pl.lit(rank, dtype=pl.Int64)),
                derived.filter(pl.col("rank") == rank),
            ]
        )
        for rank in sorted(stages["owner"].unique())
    }


def virtual_ranks(run: RunTraces) -> RunTraces:
    """The run with its one trace read as one trace per virtual rank where it is the single-GPU layout;
    otherwise the run as it is. run.json's mode single_gpu without that layout is an InputError."""
    says_single = (run.config or {}).get("mode") == SINGLE_GPU
    one_process = run.world_size == 1 and len(run.traces) == 1
    frames = split(run.traces[0].frame, run.traces[0].path) if one_process else None
    if frames is None:
        if says_single:
            raise InputError(
                run.path,
                f"run.json says mode {SINGLE_GPU}, but the run is not one trace whose stages each compute "
                "on a CUDA stream of their own",
            )
        return run
    if says_single and run.config.get("p") != len(frames):
        raise InputError(
            run.path / "run.json",
            f"says p={run.config.get('p')!r:.40} but its trace holds {len(frames)} ranks",
        )
    (trace,) = run.traces
    traces = tuple(replace(trace, rank=rank, frame=frame) for rank, frame in frames.items())
    return replace(run, traces=traces, world_size=len(traces))
