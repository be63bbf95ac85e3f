"""The arrows of a merged trace: a rank's own flows (launch -> kernel, forward -> backward) with fresh
ids, and one arrow per p2p transfer between ranks, from a send's slice to its receive's (what a rank
keeps for them once its events are written: Placed). The slices are analysis.merge.tracks'."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl

from analysis.merge.tracks import RankTracks, batched, bind, micros
from runners.schedules import COMM_KINDS
from runners.schedules.trace_names import LABEL_PREFIX

_TRANSFER_KINDS = "|".join(COMM_KINDS)


def profiler_flows(
    tracks: RankTracks, rank: int, shift_ns: int, next_id: int, us=micros
) -> tuple[Iterator[list[dict]], int]:
    """The trace's own flows (launch -> kernel, forward -> backward) with fresh ids; both ends bound or
    dropped. The events in batches, and the next free id."""
    bound = bind(tracks.flow_ends, tracks.slices)
    complete = bound.filter(
        (pl.len().over("cat", "flow_id") == 2) & (pl.col("ph").n_unique().over("cat", "flow_id") == 2)
    ).sort("cat", "flow_id", pl.col("ph").replace_strict({"s": 0, "f": 1}))

    def events(chunk: pl.DataFrame, first: int) -> list[dict]:
        out = []
        rows = chunk.select("ph", "cat", "start_ns", "tid").iter_rows()
        for number, (ph, cat, start, tid) in enumerate(rows, first):
            event = {
                "ph": ph,
                "id": next_id + number // 2,
                "pid": rank,
                "tid": tid,
                "ts": us(start + shift_ns),
                "cat": cat or "flow",
                "name": cat or "flow",
            }
            out.append(event | ({"bp": "e"} if ph == "f" else {}))
        return out

    return batched(complete, events), next_id + complete.height // 2


_NCCL_KERNEL = (pl.col("cat").str.to_lowercase() == "kernel") & pl.col(
    "name"
).str.to_lowercase().str.contains("nccl")


_TRANSFER_LABEL = pl.col("name").str.starts_with(LABEL_PREFIX) & pl.col("name").str.contains(_TRANSFER_KINDS)


@dataclass(frozen=True)
class Placed:
    """What the merge keeps of a rank once its events are written: its threads (the analysis tracks
    number theirs after them) and the slices a transfer arrow may end on."""

    threads: tuple[tuple[int, str], ...]
    transfers: pl.DataFrame  # index, pid_key, tid_key, start_ns, end_ns, tid, name, cat


def placed(track: RankTracks) -> Placed:
    candidates = track.frame.lazy().filter(_NCCL_KERNEL | _TRANSFER_LABEL).select("index").collect()
    return Placed(track.threads, track.named(candidates.join(track.slices, on="index")))


def _transfer_slices(placed: dict[int, Placed]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Where arrows can end: NCCL kernels by (rank, start_ns, end_ns) (a rank's send to one peer and
    receive from another, on their own streams, may start together), and PP transfer labels by (rank, name,
    start_ns) with, on GPU, the device-side label of the same occurrence (it encloses the NCCL kernel)."""
    slices = pl.concat([p.transfers.with_columns(rank=pl.lit(r, pl.Int64)) for r, p in placed.items()])
    kernels = (
        slices.filter(_NCCL_KERNEL)
        .unique(["rank", "start_ns", "end_ns"])
        .select("rank", "start_ns", "end_ns", k_tid="tid", k_start="start_ns", k_end="end_ns")
    )
    labels = (
        slices.filter(_TRANSFER_LABEL)
        .sort("start_ns")
        .with_columns(
            on_device=pl.col("cat") == "gpu_user_annotation",
            occurrence=pl.int_range(pl.len()).over("rank", "name", pl.col("cat") == "gpu_user_annotation"),
        )
    )
    device = labels.filter("on_device").select(
        "rank", "name", "occurrence", d_tid="tid", d_start="start_ns", d_end="end_ns"
    )
    host = labels.filter(~pl.col("on_device")).join(device, on=["rank", "name", "occurrence"], how="left")
    # One slice per (rank, name, start): a label written twice (duplicate events) must not double a transfer.
    host = host.unique(["rank", "name", "start_ns"], keep="first", maintain_order=True)
    return kernels, host.select(
        "rank",
        "name",
        "start_ns",
        "d_tid",
        "d_start",
        "d_end",
        h_tid="tid",
        h_start="start_ns",
        h_end="end_ns",
    )


def _ends(pairs: pl.DataFrame, side: str, kernels: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """The slice (tid, start, end) for each transfer's `side` (send | recv): its NCCL kernel, else the
    device-side label around that kernel, else the host label."""
    rank, stage, kind = (
        ("src_rank", "send_stage", "send_kind") if side == "send" else ("dst_rank", "recv_stage", "recv_kind")
    )
    name = pl.format(LABEL_PREFIX + "{}{}{}", stage, kind, "microbatch")
    keyed = pairs.select(
        pl.col(rank).alias("rank"),
        pl.col(f"{side}_start_ns").alias("start_ns"),
        pl.col(f"{side}_end_ns").alias("end_ns"),
        name=name,
    )
    found = keyed.join(kernels, on=["rank", "start_ns", "end_ns"], how="left").join(
        labels, on=["rank", "name", "start_ns"], how="left"
    )
    return found.select(
        pl.coalesce(f"{p}_{what}" for p in ("k", "d", "h")).alias(f"{side}_{what}")
        for what in ("tid", "start", "end")
    )


def p2p_flows(
    pairs: pl.DataFrame,
    tracks: dict[int, Placed],
    shift: dict[int, int],
    origin: int,
    next_id: int,
    us=micros,
) -> tuple[Iterator[list[dict]], int]:
    """One arrow per transfer (analysis.timeline.clock.transfers): from the send slice's start to the receive
    slice's last nanosecond, so that aligned clocks show the data arriving after it was sent. The events
    in batches, and the next free id."""
    pairs = pairs.filter(pl.col("src_rank").is_in(list(tracks)) & pl.col("dst_rank").is_in(list(tracks)))
    kernels, labels = _transfer_slices(tracks)
    placed = pl.concat(
        [pairs, _ends(pairs, "send", kernels, labels), _ends(pairs, "recv", kernels, labels)],
        how="horizontal",
    ).drop_nulls(["send_tid", "recv_tid"])

    def events(chunk: pl.DataFrame, first: int) -> list[dict]:
        out = []
        for number, row in enumerate(chunk.iter_rows(named=True), first):
            src, dst = row["src_rank"], row["dst_rank"]
            common = {
                "id": next_id + number,
                "cat": "p2p",
                "name": f"{row['send_kind']} mb {row['microbatch']} → stage {row['recv_stage']}",
            }
            arrival = max(row["recv_start"], row["recv_end"] - 1)
            send_ts = us(row["send_start"] + shift[src] - origin)
            out.append({"ph": "s", "pid": src, "tid": row["send_tid"], "ts": send_ts} | common)
            recv_ts = us(arrival + shift[dst] - origin)
            out.append({"ph": "f", "bp": "e", "pid": dst, "tid": row["recv_tid"], "ts": recv_ts} | common)
        return out

    return batched(placed, events), next_id + placed.height
