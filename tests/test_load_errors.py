"""Every kind of bad trace file ends as one InputError line naming the file and the problem."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from analysis.errors import InputError
from analysis.traces.load import read_trace

GOOD = {"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2}] * 50}
GOOD_BYTES = json.dumps(GOOD).encode()


def refused(path: Path, problem: str) -> InputError:
    with pytest.raises(InputError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and "\n" not in message
    assert problem in caught.value.problem, caught.value.problem
    return caught.value


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", "empty file"),
        (b"   \n", "empty file"),
        (b"hello", "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (GOOD_BYTES[: len(GOOD_BYTES) // 2], "truncated JSON"),
        (b'{"traceEvents": [{"ph": "X", "ts": NaN, "dur": 1}]}', "not valid JSON"),
        (b'{"schemaVersion": 1}', "no traceEvents"),
        (b'"a string"', "neither an object nor an event array"),
        (b'{"traceEvents": {"ph": "X"}}', "bad trace event"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1}]}', "without dur"),
        (b'{"traceEvents": [{"ph": "X", "dur": 1}]}', "missing ts"),
        (b'{"traceEvents": [{"ts": 1, "dur": 1}]}', "missing required field `ph`"),
        (b'{"traceEvents": [{"ph": 3, "ts": 1, "dur": 1}]}', "Expected `str`, got `int`"),
        (b'{"traceEvents": [{"ph": "X", "ts": "twelve", "dur": 1}]}', "ts is not a number"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": "0x10"}]}', "dur is not a number"),
        (b'{"traceEvents": [{"ph": "X", "ts": "1e300", "dur": 1}]}', "ts out of range"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": true}]}', "dur is not a number"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1e300, "dur": 1}]}', "ts out of range"),
        (b'{"traceEvents": [{"ph": "X", "ts": 123456789012345678901234, "dur": 1}]}', "ts out of range"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1e999}]}', "dur out of range"),
        (b'{"traceEvents": [{"ph": "X", "name": "\\ud800", "ts": 1, "dur": 1}]}', "JSON"),
        (b'{"traceEvents": [], "distributedInfo": {"rank": "zero"}}', "bad distributedInfo"),
        (b'{"traceEvents": [], "baseTimeNanoseconds": -5}', "baseTimeNanoseconds out of range"),
        (b'{"traceEvents": []} trailing', "not valid JSON"),
    ],
    ids=lambda value: value[:40].decode("latin-1") if isinstance(value, bytes) else value,
)
def test_bad_content_is_refused(tmp_path, content, problem):
    path = tmp_path / "rank0.json"
    path.write_bytes(content)
    refused(path, problem)


def test_the_message_names_the_offending_event(tmp_path):
    document = {
        "traceEvents": [{"ph": "X", "name": "ok", "ts": 1, "dur": 1}, {"ph": "X", "name": "bad", "ts": 1}]
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(document))
    assert "event 1 (X 'bad')" in refused(path, "without dur").problem


def test_gzip_truncated(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(GOOD_BYTES)[:-20])
    refused(path, "gzip stream truncated")


def test_gzip_corrupted(tmp_path):
    data = bytearray(gzip.compress(GOOD_BYTES))
    data[len(data) // 2] ^= 0xFF
    path = tmp_path / "t.json.gz"
    path.write_bytes(bytes(data))
    refused(path, "gzip data corrupted")


def test_gzip_of_nothing_is_an_empty_file(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b""))
    refused(path, "empty file")


def test_missing_file_and_directory(tmp_path):
    refused(tmp_path / "nope.json", "no such file")
    refused(tmp_path, "is a directory")
