"""Fuzz the loader with mutated real and synthetic traces: nothing but a one-line InputError naming the
file may escape, and what loads is the loader's frame as documented (columns, integer times, one row
per event, times in order).

FUZZ_EXAMPLES sets the number of inputs per mutation kind (small by default; `make fuzz` sets 20000).
"""

from __future__ import annotations

import gzip
import json
import os
import warnings
from pathlib import Path
from unittest.mock import patch

import polars as pl
import pytest
from conftest import gunzipped, real_traces_in
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.errors import InputError
from analysis.traces import stream
from analysis.traces.load import RawTrace, read_trace
from runners.schedules import build
from synthetic.generate import synthesize

SMALL_REAL = ["hta/cpu_only", "hta/critical_path/cuda_event_sync", "hta/amd_trace", "pippy"]
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES < 1000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _seeds() -> list[bytes]:
    documents = [
        json.dumps(synthesize(build("1f1b", 2, 2), shape=shape, steps=1, p2p_latency_us=3).traces[1]).encode()
        for shape in ("cpu", "gpu")
    ]
    for folder in SMALL_REAL:
        documents += [gunzipped(path) for path in real_traces_in(folder)]
    return documents


SEEDS = _seeds()
# The loader's frame (analysis.traces.load): these columns, times and ids as integers.
INTEGERS = "index rank pid tid start_ns end_ns correlation external_id stream sequence flow_id".split()
COLUMNS = {name: pl.Int64 for name in INTEGERS} | {name: pl.String for name in ("ph", "name", "cat", "bp")}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)


def only_input_errors(tmp_path: Path, data: bytes, name: str = "rank0.json") -> None:
    """No exception but a one-line InputError naming the file; what loads is a frame as documented. Read
    as it streams (in tiny pieces and chunks, so that every cut is met), it is the same trace, or the
    same error, with the same warnings."""
    path = tmp_path / name
    path.write_bytes(data)
    whole, warned = outcome(path, keep_text=True)
    if isinstance(whole, InputError):
        assert "\n" not in str(whole) and str(path) in str(whole), str(whole)
    else:
        loaded_as_documented(whole)
    with patch.multiple(stream, PIECE_BYTES=64, STREAM_BYTES=256):
        streamed, streamed_warned = outcome(path, keep_text=False)
    assert streamed_warned == warned
    if isinstance(whole, InputError):
        assert str(streamed) == str(whole)
        return
    assert streamed.frame.equals(whole.frame) and streamed.counters.equals(whole.counters)
    assert streamed.metadata.keys() == whole.metadata.keys() and streamed.header == whole.header
    assert (streamed.dropped, streamed.paired, streamed.rank) == (whole.dropped, whole.paired, whole.rank)


def outcome(path: Path, keep_text: bool) -> tuple[RawTrace | InputError, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            found = read_trace(path, keep_text=keep_text)
        except InputError as error:
            found = error
    return found, [str(w.message) for w in caught]


def loaded_as_documented(trace) -> None:
    """The loader's columns with integer times and ids; one row per event of the file but those dropped
    for a negative duration, in file order; an "X" event ends no earlier than it starts, any other at
    its start; every event has its phase."""
    frame = trace.frame
    assert dict(frame.schema) == COLUMNS  # as dicts: the same columns and types, in any order
    assert frame.height + trace.dropped + trace.paired == len(trace.events())
    index = frame["index"]
    assert index.null_count() == 0 and index.is_unique().all() and index.is_sorted()
    assert frame.height == 0 or (index.min() >= 0 and index.max() < len(trace.events()))
    assert frame["ph"].null_count() == 0 and frame["name"].null_count() == 0
    timed = frame.filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
    assert (timed["end_ns"] >= timed["start_ns"]).all()
    instants = timed.filter(pl.col("ph") != "X")
    assert (instants["end_ns"] == instants["start_ns"]).all()


@FUZZ
@given(
    seed=st.sampled_from(SEEDS),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_byte_flips(tmp_path, seed, flips):
    data = bytearray(seed)
    for where, value in flips:
        data[min(int(where * len(data)), len(data) - 1)] = value
    only_input_errors(tmp_path, bytes(data))


@FUZZ
@given(seed=st.sampled_from(SEEDS), cut=st.floats(0, 1), compress=st.booleans())
def test_truncation(tmp_path, seed, cut, compress):
    data = gzip.compress(seed, 1) if compress else seed
    only_input_errors(tmp_path, data[: int(cut * len(data))], "rank0.json.gz" if compress else "rank0.json")


@FUZZ
@given(
    seed=st.sampled_from(SEEDS),
    picks=st.lists(
        st.tuples(st.floats(0, 1), st.floats(0, 1), JSON_VALUES | st.just(...)), min_size=1, max_size=5
    ),
)
def test_field_deletions_and_type_swaps(tmp_path, seed, picks):
    document = json.loads(seed)
    events = document if isinstance(document, list) else document["traceEvents"]
    for which_event, which_key, value in picks:
        event = events[min(int(which_event * len(events)), len(events) - 1)]
        if not isinstance(event, dict) or not event:
            continue
        keys = sorted(event)
        key = keys[min(int(which_key * len(keys)), len(keys) - 1)]
        if value is ...:
            del event[key]
        else:
            event[key] = value
    only_input_errors(tmp_path, json.dumps(document).encode())


@FUZZ
@given(
    header=st.dictionaries(
        st.sampled_from(
            [
                "distributedInfo",
                "baseTimeNanoseconds",
                "deviceProperties",
                "run_id",
                "traceName",
                "traceEvents",
            ]
        ),
        JSON_VALUES,
        max_size=4,
    )
)
def test_header_type_swaps(tmp_path, header):
    only_input_errors(tmp_path, json.dumps(header).encode())


def test_invalid_utf8_in_args_is_replaced_counted_and_stays_decodable(tmp_path):
    """Found by test_byte_flips with FUZZ_EXAMPLES=1500 (a flipped byte inside a synthetic trace's args):
    the loader checked UTF-8 only in the fields it types, so RawTrace.events() raised and the merge wrote
    a trace that was not JSON. Now every invalid sequence becomes U+FFFD, with one counted warning."""
    event = b'{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"note": "\x80"}}'
    path = tmp_path / "rank0.json"
    path.write_bytes(b'{"traceEvents": [' + event + b"]}")
    with pytest.warns(
        UserWarning, match=r"replaced 1 invalid UTF-8 sequence\(s\) with U\+FFFD \(the first at byte 99\)"
    ):
        trace = read_trace(path)
    assert trace.replaced == 1 and trace.events()[0]["args"] == {"note": "\ufffd"}
    loaded_as_documented(trace)


def test_every_seed_loads_as_documented(tmp_path):
    """The unmutated seeds (2 synthetic, the rest real) load, so the mutations start from valid traces, and
    each streams (Kineto's header and trailer, a bare event array), so the fuzz compares both reads."""
    assert len(SEEDS) == 2 + sum(len(real_traces_in(folder)) for folder in SMALL_REAL)
    for number, seed in enumerate(SEEDS):
        path = tmp_path / f"seed{number}.json"
        path.write_bytes(seed)
        trace = read_trace(path)
        loaded_as_documented(trace)
        assert trace.dropped == 0 and trace.frame.height == len(trace.events()) > 0
        with patch.multiple(stream, PIECE_BYTES=64, STREAM_BYTES=256):
            streamed = read_trace(path, keep_text=False)
        assert len(streamed.events_json) == 0 and streamed.frame.equals(trace.frame)  # it streamed
