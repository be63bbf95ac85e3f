"""The pieces of a merged trace for one rank: its threads, slices and flows
(the analysis tracks are analysis.merge.analysis_tracks).

A rank's track is an original (pid, tid) pair: a CPU thread or a GPU stream. Slices that overlap on a
track without nesting are spread over numbered overlap threads (first one that fits), which is what
Perfetto would do unasked; here the overlap threads are named and flows stay bound to their slices.
Times are integer nanoseconds until the last step, where `_us` writes Chrome's microseconds.

A rank's events are written in file order, one piece of its traceEvents text at a time
(analysis.traces.events.decoded_pieces): each event's args are spliced in undecoded from that piece, so
the merge never holds more than one piece's args, whatever the trace's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import polars as pl

from analysis.traces.events import decoded_pieces
from analysis.traces.kineto import DEVICE_TRACK_CATS
from runners.schedules import COMM_KINDS
from runners.schedules.trace_names import LABEL_PREFIX

_TRANSFER_KINDS = "|".join(COMM_KINDS)
_NO_ARGS = msgspec.Raw(b"{}")


class _Ids(msgspec.Struct, gc=False):
    """An event's ids as written (the loaded frame nulls those that are not integers)."""

    pid: msgspec.Raw = msgspec.Raw(b"null")
    tid: msgspec.Raw = msgspec.Raw(b"null")
    args: msgspec.Raw = _NO_ARGS


class _Args(msgspec.Struct, gc=False):
    """An event's args undecoded: spliced into the output as they are, which keeps merging fast."""

    args: msgspec.Raw = _NO_ARGS


_IDS = msgspec.json.Decoder(list[_Ids])
_ARGS = msgspec.json.Decoder(list[_Args])


def _keys(raws: list[msgspec.Raw]) -> pl.Series:
    """pids or tids as written, without JSON quotes: 59811, "stream 7" -> stream 7."""
    return pl.Series([bytes(r) for r in raws], dtype=pl.Binary).cast(pl.String).str.strip_chars('"')


def _us(ns: int) -> float:
    return ns / 1000


@dataclass(frozen=True)
class RankTracks:
    slices: pl.DataFrame  # index, name, cat, pid_key, tid_key, start_ns, end_ns, tid (the new thread)
    flow_ends: pl.DataFrame  # index, ph, cat, flow_id, start_ns, pid_key, tid_key
    instants: pl.DataFrame  # index, name, cat, tid, start_ns
    threads: tuple[tuple[int, str], ...]  # (new tid, name), in display order
    path: Path  # the trace file, for messages
    events_json: msgspec.Raw  # the traceEvents text, where each event's args are read from

    def metadata_events(self, rank: int, process_name: str) -> list[dict]:
        process = [
            {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": process_name}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
        ]
        return process + thread_events(rank, self.threads)

    def slice_events(self, rank: int, shift_ns: int) -> Iterator[list[dict]]:
        """The rank's slices ("X") and instants ("i") on their new threads, in file order: one list per
        piece of the trace's events text, each event with its args as written."""
        rows = pl.concat(
            [
                self.slices.select("index", "name", "cat", "tid", "start_ns", "end_ns"),
                self.instants.select(
                    "index", "name", "cat", "tid", "start_ns", end_ns=pl.lit(None, pl.Int64)
                ),
            ]
        ).sort("index")
        if rows.height == 0:
            return
        indices = rows["index"]
        for offset, _, pieces in decoded_pieces(self.path, memoryview(self.events_json), _ARGS):
            low, high = indices.search_sorted(
                pl.Series([offset, offset + len(pieces)]), side="left"
            ).to_list()
            if low == high:
                continue
            chunk = rows.slice(low, high - low)
            yield [
                {
                    "ph": "X",
                    "name": name,
                    "cat": cat or "",
                    "pid": rank,
                    "tid": tid,
                    "ts": _us(start + shift_ns),
                    "dur": _us(end - start),
                    "args": pieces[index - offset].args,
                }
                if end is not None
                else {
                    "ph": "i",
                    "s": "t",
                    "name": name,
                    "cat": cat or "",
                    "pid": rank,
                    "tid": tid,
                    "ts": _us(start + shift_ns),
                    "args": pieces[index - offset].args,
                }
                for index, name, cat, tid, start, end in zip(*(chunk[c].to_list() for c in chunk.columns))
            ]
            del pieces  # before the next piece is decoded


def thread_events(rank: int, threads) -> list[dict]:
    return [
        event
        for tid, name in threads
        for event in (
            {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}},
            {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}},
        )
    ]


def layout(frame: pl.DataFrame, events_json: msgspec.Raw, path: Path | None = None) -> RankTracks:
    """Assign every kept event of one rank's frame (analysis.traces.load) to a thread of the merged process.

    `events_json` is the trace's traceEvents array as written (analysis.traces.load.RawTrace.events_json).
    """
    path = Path(path or "trace")
    named = frame.filter((pl.col("ph") == "M") & (pl.col("name") == "thread_name"))["index"].to_list()
    wanted = set(named)
    key_frames, names_args = [], {}
    for offset, _, pieces in decoded_pieces(path, memoryview(events_json), _IDS):
        key_frames.append(
            pl.DataFrame(
                {
                    "index": pl.int_range(offset, offset + len(pieces), dtype=pl.Int64, eager=True),
                    "pid_key": _keys([e.pid for e in pieces]),
                    "tid_key": _keys([e.tid for e in pieces]),
                }
            )
        )
        if wanted:
            names_args |= {i: pieces[i - offset].args for i in named if offset <= i < offset + len(pieces)}
        del pieces  # before the next piece is decoded
    keys = pl.concat(key_frames)
    keyed = frame.drop("pid", "tid").join(keys, on="index", how="left")
    device = (
        keyed.filter(pl.col("cat").str.to_lowercase().is_in(DEVICE_TRACK_CATS))
        .select("pid_key", "tid_key")
        .unique()
    )
    slices = keyed.filter(pl.col("ph") == "X").sort(
        ["pid_key", "tid_key", "start_ns", "end_ns"], descending=[False, False, False, True]
    )
    slices = slices.with_columns(pl.Series("layer", _layers(slices), dtype=pl.Int64))
    threads = _thread_table(slices, device, _thread_names(keyed, names_args))
    slices = slices.join(
        threads.select("pid_key", "tid_key", "layer", "tid"), on=["pid_key", "tid_key", "layer"]
    )
    base = threads.filter(pl.col("layer") == 0).select("pid_key", "tid_key", "tid")
    instants = keyed.filter(pl.col("ph") == "i").join(base, on=["pid_key", "tid_key"])
    flow_ends = keyed.filter(pl.col("ph").is_in(["s", "f"]) & pl.col("flow_id").is_not_null()).select(
        "index", "ph", "cat", "flow_id", "start_ns", "pid_key", "tid_key"
    )
    return RankTracks(
        slices=slices.select("index", "name", "cat", "pid_key", "tid_key", "start_ns", "end_ns", "tid"),
        flow_ends=flow_ends,
        instants=instants.select("index", "name", "cat", "tid", "start_ns"),
        threads=tuple(threads.select("tid", "thread").iter_rows()),
        path=path,
        events_json=events_json,
    )


def _layers(slices: pl.DataFrame) -> list[int]:
    """For slices sorted by track, start, longest first: the first overlap layer where each one nests.

    Sequential by nature (a stack of open slices per layer), so a plain loop over the columns.
    """
    layers: list[int] = []
    open_ends: list[list[int]] = []
    track = None
    for pid, tid, start, end in slices.select("pid_key", "tid_key", "start_ns", "end_ns").iter_rows():
        if (pid, tid) != track:
            track, open_ends = (pid, tid), []
        for depth, stack in enumerate(open_ends):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                layers.append(depth)
                break
        else:
            open_ends.append([end])
            layers.append(len(open_ends) - 1)
    return layers


def _thread_names(keyed: pl.DataFrame, args: dict[int, msgspec.Raw]) -> dict[tuple[str, str], str]:
    """(pid, tid) -> the name its thread_name metadata gives (args that are no object name nothing)."""
    named = keyed.filter((pl.col("ph") == "M") & (pl.col("name") == "thread_name"))
    names = {}
    for index, pid, tid in named.select("index", "pid_key", "tid_key").iter_rows():
        decoded = msgspec.json.decode(args[index]) if index in args else None
        names[(pid, tid)] = str(decoded.get("name", ""))[:200] if isinstance(decoded, dict) else ""
    return names


def _thread_table(slices: pl.DataFrame, device: pl.DataFrame, names: dict) -> pl.DataFrame:
    """One row per (track, layer): CPU threads first, then GPU streams, each by its original ids."""
    tracks = (
        slices.select("pid_key", "tid_key", "layer")
        .unique()
        .join(device.with_columns(on_device=pl.lit(True)), on=["pid_key", "tid_key"], how="left")
        .with_columns(pl.col("on_device").fill_null(False))
    )
    numeric = [pl.col(c).cast(pl.Int64, strict=False).alias(f"{c}_n") for c in ("pid_key", "tid_key")]
    tracks = tracks.with_columns(numeric).sort(
        "on_device", "pid_key_n", "pid_key", "tid_key_n", "tid_key", "layer"
    )
    labels = []
    for pid, tid, layer, on_device in tracks.select("pid_key", "tid_key", "layer", "on_device").iter_rows():
        original = names.get((pid, tid), "")
        label = (
            f"GPU {pid} stream {tid.removeprefix('stream ')}" if on_device else original or f"thread {tid}"
        )
        labels.append(label + (f" · overlap {layer}" if layer else ""))
    return tracks.with_columns(
        pl.Series("thread", labels, dtype=pl.String), pl.int_range(1, pl.len() + 1).alias("tid")
    )


def _bind(ends: pl.DataFrame, slices: pl.DataFrame) -> pl.DataFrame:
    """Each flow end joined to the innermost slice on its track that starts at or before it and contains it."""
    innermost_last = slices.sort(["start_ns", "end_ns"], descending=[False, True])
    return (
        ends.sort("start_ns")
        .join_asof(
            innermost_last.select("pid_key", "tid_key", "start_ns", slice_end="end_ns", tid="tid"),
            on="start_ns",
            by=["pid_key", "tid_key"],
            check_sortedness=False,
        )
        .filter(pl.col("slice_end") >= pl.col("start_ns"))
    )


def profiler_flows(tracks: RankTracks, rank: int, shift_ns: int, next_id: int) -> tuple[list[dict], int]:
    """The trace's own flows (launch -> kernel, forward -> backward) with fresh ids; both ends bound or dropped."""
    bound = _bind(tracks.flow_ends, tracks.slices)
    complete = bound.filter(
        (pl.len().over("cat", "flow_id") == 2) & (pl.col("ph").n_unique().over("cat", "flow_id") == 2)
    ).sort("cat", "flow_id", pl.col("ph").replace_strict({"s": 0, "f": 1}))
    out = []
    for number, (ph, cat, start, tid) in enumerate(
        complete.select("ph", "cat", "start_ns", "tid").iter_rows()
    ):
        event = {
            "ph": ph,
            "id": next_id + number // 2,
            "pid": rank,
            "tid": tid,
            "ts": _us(start + shift_ns),
            "cat": cat or "flow",
            "name": cat or "flow",
        }
        out.append(event | ({"bp": "e"} if ph == "f" else {}))
    return out, next_id + complete.height // 2


def _transfer_slices(tracks: dict[int, RankTracks]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Where arrows can end: NCCL kernels by (rank, start_ns), and PP transfer labels by (rank, name,
    start_ns) with, on GPU, the device-side label of the same occurrence (it encloses the NCCL kernel)."""
    kernel = (pl.col("cat").str.to_lowercase() == "kernel") & pl.col("name").str.to_lowercase().str.contains(
        "nccl"
    )
    label = pl.col("name").str.starts_with(LABEL_PREFIX) & pl.col("name").str.contains(_TRANSFER_KINDS)
    slices = pl.concat([t.slices.with_columns(rank=pl.lit(r, pl.Int64)) for r, t in tracks.items()])
    kernels = (
        slices.filter(kernel)
        .unique(["rank", "start_ns"])
        .select("rank", "start_ns", k_tid="tid", k_start="start_ns", k_end="end_ns")
    )
    labels = (
        slices.filter(label)
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
    keyed = pairs.select(pl.col(rank).alias("rank"), pl.col(f"{side}_start_ns").alias("start_ns"), name=name)
    found = keyed.join(kernels, on=["rank", "start_ns"], how="left").join(
        labels, on=["rank", "name", "start_ns"], how="left"
    )
    return found.select(
        pl.coalesce(f"{p}_{what}" for p in ("k", "d", "h")).alias(f"{side}_{what}")
        for what in ("tid", "start", "end")
    )


def p2p_flows(
    pairs: pl.DataFrame, tracks: dict[int, RankTracks], shift: dict[int, int], origin: int, next_id: int
) -> tuple[list[dict], int]:
    """One arrow per transfer (analysis.timeline.clock.transfers): from the send slice's start to the receive
    slice's last nanosecond, so that aligned clocks show the data arriving after it was sent."""
    pairs = pairs.filter(pl.col("src_rank").is_in(list(tracks)) & pl.col("dst_rank").is_in(list(tracks)))
    kernels, labels = _transfer_slices(tracks)
    placed = pl.concat(
        [pairs, _ends(pairs, "send", kernels, labels), _ends(pairs, "recv", kernels, labels)],
        how="horizontal",
    ).drop_nulls(["send_tid", "recv_tid"])
    out = []
    for number, row in enumerate(placed.iter_rows(named=True)):
        src, dst = row["src_rank"], row["dst_rank"]
        common = {
            "id": next_id + number,
            "cat": "p2p",
            "name": f"{row['send_kind']} mb {row['microbatch']} → stage {row['recv_stage']}",
        }
        arrival = max(row["recv_start"], row["recv_end"] - 1)
        out.append(
            {
                "ph": "s",
                "pid": src,
                "tid": row["send_tid"],
                "ts": _us(row["send_start"] + shift[src] - origin),
            }
            | common
        )
        out.append(
            {
                "ph": "f",
                "bp": "e",
                "pid": dst,
                "tid": row["recv_tid"],
                "ts": _us(arrival + shift[dst] - origin),
            }
            | common
        )
    return out, next_id + placed.height
