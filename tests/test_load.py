"""The loader on real Kineto traces and on small hand-made files with known times."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import polars as pl
import pytest
from conftest import REAL_FILES, REAL_TRACES, gunzipped, real_id

from analysis.traces import events, stream
from analysis.traces.load import load_trace, read_trace
from analysis.traces.run_files import rank_from_name


def write(path: Path, document, compress: bool = False) -> Path:
    text = json.dumps(document).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


def event(**fields):
    base = {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("path", REAL_FILES, ids=real_id)
def test_every_real_trace_loads_with_the_event_count_of_its_file(path: Path):
    document = msgspec.json.decode(gunzipped(path), type=list[msgspec.Raw] | dict[str, msgspec.Raw])
    events = (
        document
        if isinstance(document, list)
        else msgspec.json.decode(document["traceEvents"], type=list[msgspec.Raw])
    )
    frame = load_trace(path)
    assert frame.height == len(events)
    complete = frame.filter(pl.col("ph") == "X")
    assert (complete["end_ns"] >= complete["start_ns"]).all()


def test_real_gpu_trace_times_are_base_plus_ts_in_exact_nanoseconds():
    path = REAL_TRACES / "tracelens" / "b200" / "eager_trace.json.gz"
    document = json.loads(gunzipped(path))
    first = document["traceEvents"][0]  # ts 1365627862757.064 us, dur 87412.863 us in this file
    row = load_trace(path).row(0, named=True)
    text_ts = repr(first["ts"])
    whole, fraction = text_ts.split(".")
    expected = document["baseTimeNanoseconds"] + int(whole) * 1000 + int(fraction.ljust(3, "0"))
    assert row["start_ns"] == expected
    assert row["end_ns"] - row["start_ns"] == round(first["dur"] * 1000)
    kernels = load_trace(path).filter(pl.col("cat") == "kernel")
    assert kernels["correlation"].null_count() == 0 and kernels["stream"].null_count() == 0


def test_fractional_microseconds_become_exact_nanoseconds(tmp_path):
    # Past 2**43 us a float cannot hold the nanoseconds; the text can.
    raw = (
        b'{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 9999999999999.999, "dur": 1.234567e6},'
        b'{"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 0.0015, "dur": 0.0004},'
        b'{"ph": "i", "name": "c", "pid": 1, "tid": 1, "ts": -2.5}]}'
    )
    path = tmp_path / "t.json"
    path.write_bytes(raw)
    frame = load_trace(path)
    assert frame["start_ns"].to_list() == [9999999999999999, 2, -2500]
    assert (frame["end_ns"] - frame["start_ns"]).to_list() == [1234567000, 0, 0]


@pytest.mark.parametrize("keep_text", [True, False], ids=["whole", "streamed"])
def test_times_written_as_strings_are_read_as_their_numbers_and_counted(tmp_path, monkeypatch, keep_text):
    """ "ts": "1234.5" (some writers quote their times) gives the nanoseconds the number 1234.5 gives, ties
    and exponents too, in whichever piece of the array it is; RawTrace.string_times counts the events."""
    monkeypatch.setattr(events, "PIECE_BYTES", 2000)
    monkeypatch.setattr(stream, "PIECE_BYTES", 2000)
    monkeypatch.setattr(stream, "STREAM_BYTES", 4000)
    times = [(i * 1.5 + 0.0015, 0.0045 * i) for i in range(200)] + [
        (9999999999999.999, 1.234567e6),
        (-2.5, 2e-3),
    ]
    numbers = [event(name=f"op{i}", ts=ts, dur=dur) for i, (ts, dur) in enumerate(times)]
    quoted = [dict(e) for e in numbers]
    for i in (3, 150, 200, 201):  # early, in a later piece, past 2**43 us, the last
        quoted[i]["ts"] = repr(quoted[i]["ts"])
    quoted[150]["dur"] = repr(quoted[150]["dur"])
    quoted[170]["dur"] = repr(quoted[170]["dur"])
    expected = read_trace(write(tmp_path / "numbers.json", {"traceEvents": numbers}))
    found = read_trace(write(tmp_path / "quoted.json.gz", {"traceEvents": quoted}, True), keep_text=keep_text)
    assert found.frame.equals(expected.frame)
    assert (len(found.events_json) > 0) == keep_text  # streamed: no fall back to the whole read
    assert (found.string_times, expected.string_times) == (5, 0)
    assert quoted[3]["ts"] == "4.5015" and found.frame["start_ns"][3] == 4502  # a tie, rounded half up
    assert quoted[200]["ts"] == "9999999999999.998" and found.frame["start_ns"][200] == 9999999999999998
    assert found.frame["start_ns"][201] == -2500


def test_legacy_bare_event_array_loads(tmp_path):
    path = write(tmp_path / "legacy.json", [event(ts=1), event(ts=3, name="b")])
    assert load_trace(path)["name"].to_list() == ["aten::mm", "b"]


def test_rank_comes_from_distributed_info_before_the_file_name(tmp_path):
    path = write(
        tmp_path / "rank5.json", {"distributedInfo": {"rank": 2, "world_size": 4}, "traceEvents": [event()]}
    )
    trace = read_trace(path)
    assert (trace.rank, trace.world_size) == (2, 4)
    assert trace.frame["rank"].to_list() == [2]
    assert read_trace(write(tmp_path / "rank5.json", {"traceEvents": [event()]})).rank == 5


@pytest.mark.parametrize(
    "name, rank",
    [
        ("rank3.json.gz", 3),
        ("worker7_step_12.1694128201553.pt.trace.json.gz", 7),
        ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34),
        ("trace.json", None),
        ("RANK_12.json", 12),
    ],
)
def test_rank_from_file_name(name, rank):
    assert rank_from_name(Path(name)) == rank


def test_unknown_fields_are_kept_verbatim_for_the_merge(tmp_path):
    odd = event(args={"External id": 7, "Input Dims": [[3, 4]], "wild": {"x": "é"}}, tts=99)
    path = write(
        tmp_path / "t.json.gz", {"schemaVersion": 1, "custom": [1, 2], "traceEvents": [odd]}, compress=True
    )
    trace = read_trace(path)
    assert trace.events() == [odd]
    assert json.loads(bytes(trace.metadata["custom"])) == [1, 2]
    assert trace.frame["external_id"].to_list() == [7]


def test_negative_duration_is_dropped_with_a_counted_warning(tmp_path):
    path = write(
        tmp_path / "t.json", {"traceEvents": [event(dur=-3), event(name="ok"), event(dur=-0.0, name="zero")]}
    )
    with pytest.warns(UserWarning, match="dropped 1 events with a negative duration"):
        trace = read_trace(path)
    assert trace.dropped == 1
    assert trace.frame["name"].to_list() == ["ok", "zero"]
    assert trace.frame["index"].to_list() == [1, 2]  # positions in events() survive the drop


def test_metadata_events_may_lack_ts_and_non_integer_pids_become_null(tmp_path):
    events = [{"ph": "M", "name": "process_name", "pid": "Spans", "args": {"name": "x"}}, event()]
    frame = load_trace(write(tmp_path / "t.json", {"traceEvents": events}))
    assert frame["start_ns"].to_list() == [None, 10_000]
    assert frame["pid"].to_list() == [None, 1]


def test_unicode_and_huge_string_args_load(tmp_path):
    name = "PP:0F1 <script>alert('х')</script> 🚀"
    huge = "x" * 5_000_000
    path = write(tmp_path / "t.json", {"traceEvents": [event(name=name, args={"huge": huge})]})
    frame = load_trace(path)
    assert frame["name"].to_list() == [name]
    assert len(read_trace(path).events()[0]["args"]["huge"]) == len(huge)


@pytest.mark.parametrize(
    "document",
    [
        # Kineto's own order: short keys after the events (the fast split's guess holds)
        {"schemaVersion": 1, "traceEvents": [event(), event(name="b")], "traceName": "x.json"},
        # an array after the events, "]" in a later string, the key's name inside an earlier string
        {
            "note": '"traceEvents": [',
            "traceEvents": [event(), event(name="b")],
            "deviceProperties": [{"id": 0}],
            "traceName": "run[3].json",
        },
        {"traceEvents": [event(), event(name="b")], "tail": {"traceEvents": [event(name="decoy")]}},
    ],
)
def test_events_and_metadata_are_found_whatever_the_key_order(tmp_path, document):
    trace = read_trace(write(tmp_path / "t.json", document))
    assert trace.events() == document["traceEvents"]
    assert trace.frame["name"].to_list() == ["aten::mm", "b"]
    assert {key: msgspec.json.decode(value) for key, value in trace.metadata.items()} == {
        key: value for key, value in document.items() if key != "traceEvents"
    }


@pytest.mark.parametrize("keep_text", [True, False], ids=["whole", "streamed"])
def test_record_param_comms_args_are_kept_as_the_events_are_decoded(tmp_path, keep_text):
    """RawTrace.comms: (index, args) of the record_param_comms ops that carry args (an empty object
    counts; none or null does not), read in the frame's own pass, whichever way the file is read."""
    said = {"Src Rank": 1, "Process Group Ranks": [4, 6], "Process Group Name": "3"}
    comms = "record_param_comms"
    events = [
        event(name=comms, args=said),
        event(name="aten::mm", args=said),
        event(name=comms),
        event(name=comms, args=None) | {"args": None},
        event(name=comms, args={}),
    ]
    trace = read_trace(write(tmp_path / "rank0.json.gz", {"traceEvents": events}, True), keep_text=keep_text)
    found = [(index, args.src, args.ranks, args.group_id) for index, args in trace.comms]
    assert found == [(0, 1, [4, 6], "3"), (4, None, None, None)]
