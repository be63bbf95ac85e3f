"""Piecewise decoding and the float/text time split give exactly what whole-array text decoding gives."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import warnings
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.errors import InputError
from analysis.traces import events, stream
from analysis.traces.array_split import array_pieces
from analysis.traces.load import read_trace
from analysis.traces.times import nanoseconds


def text_ns(text: str) -> int:
    """The loader's contract for a microsecond text: nanoseconds rounded half away from zero."""
    return int((Decimal(text) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def settled_ns(text: str) -> int:
    """nanoseconds() on the text's float, with unsettled rows taken from the text as the loader does."""
    ns, unsettled = nanoseconds(pl.Series([float(text)], dtype=pl.Float64))
    return text_ns(text) if unsettled.len() else ns[0]


@pytest.mark.parametrize(
    "text",
    [
        "0.0015",
        "-0.0015",
        "2.0005",
        "1365627862757.064",
        "5110114341537.881",
        "9999999999999.999",
        "3999999999999999.5",
        "0.0004",
        "-2.5",
        "1e-3",
        "12.3456789",
    ],
)
def test_float_times_match_their_text(text):
    assert settled_ns(text) == text_ns(text)


@settings(max_examples=400, deadline=None)
@given(
    whole=st.integers(0, 4 * 10**15 - 1),
    decimals=st.integers(0, 7),
    digits=st.integers(0, 10**7 - 1),
    negative=st.booleans(),
)
def test_any_decimal_text_gets_its_exact_nanoseconds(whole, decimals, digits, negative):
    text = (
        ("-" if negative else "")
        + str(whole)
        + ("." + str(digits % 10**decimals).zfill(decimals) if decimals else "")
    )
    if abs(float(text)) < 4 * 10**15:  # kineto.MAX_US: larger ones are refused while decoding
        assert settled_ns(text) == text_ns(text)


def test_ints_are_exact_without_text():
    ns, unsettled = nanoseconds(pl.Series([1669783687464181, -3, None], dtype=pl.Int64))
    assert ns.to_list() == [1669783687464181000, -3000, None] and unsettled.len() == 0


def test_cuts_at_every_close_comma_open_and_nowhere_else():
    # The splitter does not parse: it also cuts inside strings and nested arrays (the decoder catches those).
    text = b' [ {"a": "}, {"}, {"b": [{"c": 1}, {"d": 2}]} ,\n {"e": 3} ] '
    pieces = array_pieces(memoryview(text), 1)
    assert [text[a:b] for a, b in pieces] == [
        b' {"a": "}',
        b'{"}',
        b'{"b": [{"c": 1}',
        b'{"d": 2}]}',
        b'{"e": 3} ',
    ]
    assert [text[a:b] for a, b in array_pieces(memoryview(text), 20)] == [
        b' {"a": "}, {"}, {"b": [{"c": 1}',
        b'{"d": 2}]} ,\n {"e": 3} ',
    ]
    assert array_pieces(memoryview(b'{"a": 1}'), 1) is None
    assert array_pieces(memoryview(b"[]"), 1) == [(1, 1)]


def trace_file(tmp_path: Path, trace_events: list) -> Path:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": trace_events}))
    return path


def many_events(count: int) -> list[dict]:
    tricky = ["}, {", 'a"}, {"ph": "X', "é"]
    return [
        {
            "ph": "X",
            "name": tricky[i % 3],
            "cat": "cpu_op",
            "pid": 1,
            "tid": i % 4,
            "ts": i * 1.5 + 1e6,
            "dur": 0.0015 * i,
            "args": {"External id": i, "nested": [{"x": i}, {"y": None}]},
        }
        for i in range(count)
    ]


class CountingDecoder:
    def __init__(self, decoder):
        self.decoder, self.calls = decoder, 0

    def decode(self, text):
        self.calls += 1
        return self.decoder.decode(text)


def test_a_clean_array_is_decoded_in_pieces(tmp_path, monkeypatch):
    trace = [{"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(300)]
    path = trace_file(tmp_path, trace)
    whole = read_trace(path).frame
    counting = CountingDecoder(events.kineto.EVENTS)
    monkeypatch.setattr(events.kineto, "EVENTS", counting)
    monkeypatch.setattr(events, "PIECE_BYTES", 1000)
    assert read_trace(path).frame.equals(whole)
    assert counting.calls > 5


def test_pieces_cut_inside_strings_give_the_whole_decode(tmp_path, monkeypatch):
    path = trace_file(tmp_path, many_events(500))
    whole = read_trace(path).frame
    monkeypatch.setattr(events, "PIECE_BYTES", 700)  # many pieces, several cut inside a name or args
    pieced = read_trace(path).frame
    assert pieced.equals(whole)
    assert pieced["index"].to_list() == list(range(500))
    assert pieced["end_ns"][3] - pieced["start_ns"][3] == 5  # 0.0045 us: a tie, settled from the text


def test_an_error_in_a_later_piece_names_the_event_in_the_whole_array(tmp_path, monkeypatch):
    trace = many_events(300)
    trace[250]["ts"] = "late"
    trace[280].pop("dur")
    monkeypatch.setattr(events, "PIECE_BYTES", 700)
    with pytest.raises(InputError, match=r"event 250: ts is not a number"):
        read_trace(trace_file(tmp_path, trace))
    trace[250]["ts"] = 1
    with pytest.raises(InputError, match=r"event 280 \(X .*\): complete event \(ph X\) without dur"):
        read_trace(trace_file(tmp_path, trace))


def test_null_args_and_string_ids_in_one_piece(tmp_path):
    trace = [
        {"ph": "X", "name": "a", "pid": "Spans", "tid": 1, "ts": 1, "dur": 1, "args": None},
        {
            "ph": "X",
            "name": "b",
            "pid": 2,
            "tid": 1,
            "ts": 2,
            "dur": 1,
            "args": {"correlation": "x", "stream": 7},
        },
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = read_trace(trace_file(tmp_path, trace)).frame
    assert frame["pid"].to_list() == [None, 2]
    assert frame["correlation"].to_list() == [None, None] and frame["stream"].to_list() == [None, 7]


@settings(max_examples=400, deadline=None)
@given(
    whole=st.integers(0, 2**43 - 1),
    decimals=st.integers(0, 3),
    digits=st.integers(0, 999),
    negative=st.booleans(),
)
def test_texts_in_whole_nanoseconds_need_no_text_below_2_to_the_43(whole, decimals, digits, negative):
    """Kineto's ts (three decimals, ~5e12 us) come exactly from the double when the texts are known short."""
    text = ("-" if negative else "") + str(whole) + (f".{digits:03d}"[: decimals + 1] if decimals else "")
    ns, unsettled = nanoseconds(pl.Series([float(text)], dtype=pl.Float64), whole_ns=True)
    assert unsettled.len() == 0 and ns[0] == text_ns(text)


@pytest.mark.parametrize(
    "text, whole",
    [
        (b'[{"ph": "X", "ts": 5121215087386.496, "dur": 12.5, "args": {"occupancy": 21.333334}}]', True),
        (b'[{"ph": "X", "ts": 5121215087386.4965, "dur": 12.5}]', False),
        (b'[{"ph": "X", "ts": 1, "dur" :\n -3.14159}]', False),
        (b'[{"ph": "X", "name": "ts: 1.23456", "ts": 1.5}]', True),
    ],
)
def test_time_texts_with_four_decimals_are_found_by_their_key(text, whole):
    assert events._times_in_whole_ns(text) is whole


def test_kineto_scale_times_load_exactly_whether_or_not_every_text_is_short(tmp_path):
    texts = ["5121215087386.496", "5121215087386.4995", "8796093022207.999"]  # the last below 2**43 us
    for chosen in (texts[::2], texts):
        body = ",".join(
            f'{{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": {t}, "dur": 1.5}}' for t in chosen
        )
        path = tmp_path / "t.json"
        path.write_text(f'{{"traceEvents": [{body}]}}')
        assert read_trace(path).frame["start_ns"].to_list() == [text_ns(t) for t in chosen]


def test_a_streamed_rank_holds_a_piece_of_its_text_not_the_whole(tmp_path, monkeypatch):
    """Without its text kept, a rank's events are decoded as the file is inflated: the Python memory at
    its peak (the frame is polars', not counted here) is a chunk and a piece, not the 10 MB text, and a
    gzip of blanks holds none of them."""
    monkeypatch.setattr(stream, "STREAM_BYTES", 1 << 20)
    monkeypatch.setattr(stream, "PIECE_BYTES", 1 << 18)
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": many_events(60_000)}).encode(), 1))
    text_bytes = len(gzip.decompress(path.read_bytes()))
    blanks = tmp_path / "blanks" / "rank0.json.gz"
    blanks.parent.mkdir()
    blanks.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * text_bytes + b"]}", 1))
    peaks = {}
    for file, keep_text in ((path, True), (path, False), (blanks, False)):
        tracemalloc.start()
        trace = read_trace(file, keep_text=keep_text)
        peaks[file.parent.name, keep_text] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(trace.events_json) == (text_bytes - 17 if keep_text else 0)  # the array, or nothing
    assert text_bytes > 10_000_000 and peaks[tmp_path.name, True] > text_bytes
    assert peaks[tmp_path.name, False] < text_bytes / 2 and peaks["blanks", False] < text_bytes / 2, peaks
