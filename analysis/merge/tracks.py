"""The pieces of a merged trace for one rank: its threads and slices, and the flow ends bound to them
(the arrows are analysis.merge.flows, the analysis tracks analysis.merge.analysis_tracks).

A rank's track is an original (pid, tid) pair: a CPU thread or a GPU stream. Slices that overlap on a
track without nesting are spread over numbered overlap threads (first one that fits), which is what
Perfetto would do unasked; here the overlap threads are named and flows stay bound to their slices.
Times are integer nanoseconds until the last step, where `_us` writes Chrome's microseconds.

A rank's events are written in file order, one piece of its traceEvents text at a time
(analysis.traces.events.decoded_pieces): each event's args are spliced in undecoded from that piece, so
the merge never holds more than one piece's args, whatever the trace's size.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import polars as pl

from analysis.traces.events import decoded_pieces
from analysis.traces.kineto import DEVICE_TRACK_CATS

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
BATCH_ROWS = 50_000  # merged events built at a time from a table (flows, analysis tracks)
_ARGS = msgspec.json.Decoder(list[_Args])


# Track keys are integers: an id written as an integer (or as the text of one) is itself; any other id
# ("Spans", "stream 7", none at all) gets a code from here up, which no integer id can take.
_CODES = -(2**62)
_INTEGER = re.compile(r"-?[0-9]{1,18}")


class _Keys:
    """pids or tids as written, without JSON quotes (59811, "stream 7" -> stream 7), as integer keys; the
    text of every key that is no integer, for thread names."""

    def __init__(self) -> None:
        self.texts: dict[int, str] = {}
        self._codes: dict[str, int] = {}

    def key(self, raw: msgspec.Raw) -> int:
        text = bytes(raw).decode("utf-8", "replace").strip('"')
        if _INTEGER.fullmatch(text) and int(text) > _CODES:
            return int(text)
        if text not in self._codes:
            self._codes[text] = code = _CODES - len(self._codes)
            self.texts[code] = text
        return self._codes[text]

    def text(self, key: int) -> str:
        return self.texts.get(key, str(key))


def micros(ns: int) -> float:
    """Chrome's microseconds from integer ns: a double, exact to the ns below WHOLE_NS_LIMIT_US."""
    return ns / 1000


def exact_micros(ns: int) -> msgspec.Raw:
    """The same number written as its exact decimal text, for traces whose times pass 2**43 us (ranks
    whose clocks are days or years apart): a double there would move slices by a quarter microsecond."""
    whole, part = divmod(abs(ns), 1000)
    return msgspec.Raw(f"{'-' if ns < 0 else ''}{whole}.{part:03d}".encode())


@dataclass(frozen=True)
class RankTracks:
    slices: pl.DataFrame  # index, pid_key, tid_key, start_ns, end_ns, tid (the new thread)
    flow_ends: pl.DataFrame  # index, ph, cat, flow_id, start_ns, pid_key, tid_key
    instants: pl.DataFrame  # index, tid, start_ns
    threads: tuple[tuple[int, str], ...]  # (new tid, name), in display order
    path: Path  # the trace file, for messages
    events_json: msgspec.Raw  # the traceEvents text, where each event's args are read from
    frame: pl.DataFrame  # the rank's kept events (analysis.traces.load), where names are read from

    def named(self, rows: pl.DataFrame) -> pl.DataFrame:
        """`rows` (with `index`) with each event's name and cat from the frame: the tracks keep neither,
        so a rank's layout costs a few integer columns beside its frame."""
        at = self.frame["index"].search_sorted(rows["index"], side="left")
        return rows.with_columns(name=self.frame["name"].gather(at), cat=self.frame["cat"].gather(at))

    def metadata_events(self, rank: int, process_name: str, sort_index: int) -> list[dict]:
        process = [
            {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": process_name}},
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": rank,
                "tid": 0,
                "args": {"sort_index": sort_index},
            },
        ]
        return process + thread_events(rank, self.threads)

    def slice_events(self, rank: int, shift_ns: int, us=micros) -> Iterator[list[dict]]:
        """The rank's slices ("X") and instants ("i") on their new threads, in file order: one list per
        piece of the trace's events text, each event with its args as written."""
        rows = pl.concat(
            [
                self.slices.select("index", "tid", "start_ns", "end_ns"),
                self.instants.select("index", "tid", "start_ns", end_ns=pl.lit(None, pl.Int64)),
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
            chunk = self.named(rows.slice(low, high - low)).select(
                "index", "name", "cat", "tid", "start_ns", "end_ns"
            )
            yield [
                {
                    "ph": "X",
                    "name": name,
                    "cat": cat or "",
                    "pid": rank,
                    "tid": tid,
                    "ts": us(start + shift_ns),
                    "dur": us(end - start),
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
                    "ts": us(start + shift_ns),
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
    thread_name = (pl.col("ph") == "M") & (pl.col("name") == "thread_name")
    named = frame.select(pl.col("index").filter(thread_name))["index"].to_list()
    # Ids the frame holds as integers are their own keys; the others are read as written.
    odd = (
        pl.col("pid").is_null()
        | pl.col("tid").is_null()
        | (pl.col("pid") <= _CODES)
        | (pl.col("tid") <= _CODES)
    )
    rows = frame.select(odd.arg_true()).to_series()
    odd_index = frame["index"].gather(rows).to_list()
    keys, pid_codes, tid_codes, names_args = _Keys(), [], [], {}
    if odd_index or named:
        position, wanted = 0, set(named)
        for offset, _, pieces in decoded_pieces(path, memoryview(events_json), _IDS):
            end = offset + len(pieces)
            while position < len(odd_index) and odd_index[position] < end:
                event = pieces[odd_index[position] - offset]
                pid_codes.append(keys.key(event.pid))
                tid_codes.append(keys.key(event.tid))
                position += 1
            if wanted:
                names_args |= {i: pieces[i - offset].args for i in named if offset <= i < end}
            del pieces  # before the next piece is decoded
    pid_key, tid_key = frame["pid"].clone(), frame["tid"].clone()
    if odd_index:
        pid_key.scatter(rows, pl.Series(pid_codes, dtype=pl.Int64))
        tid_key.scatter(rows, pl.Series(tid_codes, dtype=pl.Int64))
    keyed = frame.select("index", "ph", "name", "cat", "start_ns", "end_ns", "flow_id").with_columns(
        pid_key=pid_key, tid_key=tid_key
    )
    del pid_key, tid_key
    # Projections before filters: an eager filter copies every column, names included.
    device = (
        keyed.lazy()
        .filter(pl.col("cat").str.to_lowercase().is_in(DEVICE_TRACK_CATS))
        .select("pid_key", "tid_key")
        .unique()
        .collect()
    )
    slices = (  # sorted eagerly: a lazy sort reserves gigabytes of address space
        keyed.lazy()
        .filter(pl.col("ph") == "X")
        .select("index", "pid_key", "tid_key", "start_ns", "end_ns")
        .collect()
        .sort(["pid_key", "tid_key", "start_ns", "end_ns"], descending=[False, False, False, True])
    )
    slices = slices.with_columns(pl.Series("layer", nesting_layers(slices), dtype=pl.Int64))
    threads = _thread_table(slices, device, _thread_names(keyed, names_args), keys)
    slices = slices.join(
        threads.select("pid_key", "tid_key", "layer", "tid"), on=["pid_key", "tid_key", "layer"]
    ).select("index", "pid_key", "tid_key", "start_ns", "end_ns", "tid")
    base = threads.filter(pl.col("layer") == 0).select("pid_key", "tid_key", "tid")
    instants = (
        keyed.lazy()
        .filter(pl.col("ph") == "i")
        .select("index", "start_ns", "pid_key", "tid_key")
        .join(base.lazy(), on=["pid_key", "tid_key"])
        .select("index", "tid", "start_ns")
        .collect()
    )
    flow_ends = (
        keyed.lazy()
        .filter(pl.col("ph").is_in(["s", "f"]) & pl.col("flow_id").is_not_null())
        .select("index", "ph", "cat", "flow_id", "start_ns", "pid_key", "tid_key")
        .collect()
    )
    return RankTracks(
        slices=slices,
        flow_ends=flow_ends,
        instants=instants,
        threads=tuple(threads.select("tid", "thread").iter_rows()),
        path=path,
        events_json=events_json,
        frame=frame,
    )


def nesting_layers(slices: pl.DataFrame) -> list[int]:
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


def _thread_names(keyed: pl.DataFrame, args: dict[int, msgspec.Raw]) -> dict[tuple[int, int], str]:
    """(pid, tid) -> the name its thread_name metadata gives (args that are no object name nothing)."""
    thread_name = (pl.col("ph") == "M") & (pl.col("name") == "thread_name")
    named = keyed.lazy().filter(thread_name).select("index", "pid_key", "tid_key").collect()
    names = {}
    for index, pid, tid in named.iter_rows():
        decoded = msgspec.json.decode(args[index]) if index in args else None
        names[(pid, tid)] = str(decoded.get("name", ""))[:200] if isinstance(decoded, dict) else ""
    return names


def _thread_table(slices: pl.DataFrame, device: pl.DataFrame, names: dict, keys: _Keys) -> pl.DataFrame:
    """One row per (track, layer): CPU threads first, then GPU streams, each by its original ids
    (numbers in order, after the ids that are no number, by their text)."""
    tracks = (
        slices.select("pid_key", "tid_key", "layer")
        .unique()
        .join(device.with_columns(on_device=pl.lit(True)), on=["pid_key", "tid_key"], how="left")
        .with_columns(pl.col("on_device").fill_null(False))
    )
    order = []
    for column in ("pid_key", "tid_key"):
        texts = [keys.text(key) for key in tracks[column].to_list()]
        order += [
            pl.when(pl.col(column) > _CODES).then(pl.col(column)).alias(f"{column}_n"),
            pl.Series(f"{column}_text", texts, dtype=pl.String),
        ]
    tracks = tracks.with_columns(order).sort(
        "on_device", "pid_key_n", "pid_key_text", "tid_key_n", "tid_key_text", "layer"
    )
    labels = []
    for pid_key, tid_key, pid, tid, layer, on_device in tracks.select(
        "pid_key", "tid_key", "pid_key_text", "tid_key_text", "layer", "on_device"
    ).iter_rows():
        original = names.get((pid_key, tid_key), "")
        label = (
            f"GPU {pid} stream {tid.removeprefix('stream ')}" if on_device else original or f"thread {tid}"
        )
        labels.append(label + (f" · overlap {layer}" if layer else ""))
    return tracks.with_columns(
        pl.Series("thread", labels, dtype=pl.String), pl.int_range(1, pl.len() + 1).alias("tid")
    )


def bind(ends: pl.DataFrame, slices: pl.DataFrame) -> pl.DataFrame:
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


def batched(frame: pl.DataFrame, events) -> Iterator[list[dict]]:
    """`events(chunk, first_row)` over `frame` a slice of BATCH_ROWS rows at a time: a track of a million
    events is written without its million dicts at once."""
    for first in range(0, frame.height, BATCH_ROWS):
        yield events(frame.slice(first, BATCH_ROWS), first)
