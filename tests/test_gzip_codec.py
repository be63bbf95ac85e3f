"""The gzip codec of analysis.traces.source: ISA-L (isal) where it is installed, zlib where it is not.
Either gives the same text and refuses the same files in one line, whatever the members, the steps, the
limit and the damage; a damaged stream neither crashes nor hangs either.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import signal
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isal import isal_zlib

from analysis.errors import InputError, LimitExceeded
from analysis.traces import source
from runners.schedules import build
from synthetic.generate import synthesize

# 110 kB of JSON: stored (level 0), more than one read (64 kB at the smaller steps)
TEXT = json.dumps(synthesize(build("1f1b", 2, 8), shape="gpu", steps=4).traces[1]).encode()
CODECS = [pytest.param(zlib, id="zlib"), pytest.param(isal_zlib, id="isal")]
HANG_S = 20  # one example's read, at most: far past what any takes
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def outcome(path: Path, limit: int, step: int) -> tuple:
    """What text_chunks makes of the file: ("text", the text), ("limit",) or ("refused",); anything else
    (another exception, a read past HANG_S) fails the test."""

    def hung(*_):
        raise AssertionError(f"{source.gzip_codec.__name__}: no end after {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    try:
        return ("text", b"".join(source.text_chunks(path, limit, None, step)))
    except LimitExceeded:
        return ("limit",)
    except InputError as error:
        assert str(error).startswith(str(path)) and "\n" not in str(error)
        return ("refused",)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def read_with(codec, monkeypatch, path: Path, limit: int, step: int) -> tuple:
    monkeypatch.setattr(source, "gzip_codec", codec)
    return outcome(path, limit, step)


def test_isal_inflates_where_installed():
    """isal is a dependency (pyproject.toml): an install that has it inflates with it."""
    assert source.gzip_codec is isal_zlib


@pytest.fixture
def without_isal():
    """analysis.traces.source as imported where isal is not installed, then as it was."""
    blocked = sys.modules.get("isal", False)
    sys.modules["isal"] = None  # `from isal import ...` raises ImportError
    importlib.reload(source)
    yield
    if blocked is False:
        del sys.modules["isal"]
    else:
        sys.modules["isal"] = blocked
    importlib.reload(source)
    assert source.gzip_codec is isal_zlib


def test_without_isal_zlib_reads_gzip_exactly(tmp_path, without_isal):
    assert source.gzip_codec is zlib
    path = tmp_path / "rank0.json.gz"
    half = len(TEXT) // 2
    path.write_bytes(gzip.compress(TEXT[:half]) + gzip.compress(TEXT[half:], 1) + b"\0" * 4)
    assert source.read_text(path, len(TEXT)).data == TEXT
    assert outcome(path, len(TEXT), 1000) == ("text", TEXT)
    assert outcome(path, len(TEXT) - 1, 1000) == ("limit",)
    path.write_bytes(gzip.compress(TEXT)[:-9])
    with pytest.raises(InputError, match="gzip stream truncated"):
        source.read_text(path, len(TEXT))
    damaged = bytearray(gzip.compress(TEXT))
    damaged[-5] ^= 1  # the trailer's CRC
    path.write_bytes(bytes(damaged))
    with pytest.raises(InputError, match="gzip data corrupted: Error -3 .*incorrect data check"):
        source.read_text(path, len(TEXT))


def _member(text: bytes, level: int, flags: int = 0) -> bytes:
    data = bytearray(gzip.compress(text, level, mtime=0))
    data[3] |= flags
    return bytes(data)


def _stored_member(size: int) -> bytes:
    """A member of exactly `size` bytes (stored blocks: 5 bytes a block of up to 64 KiB, and a header and
    trailer of 18)."""
    for text_bytes in range(size - 18, 0, -1):
        member = _member(TEXT[:1] * text_bytes, 0)
        if len(member) == size:
            return member
    raise AssertionError(f"no stored member of {size} bytes")


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("where", ["first member", "second member", "second member across reads"])
def test_reserved_header_flags_are_refused_by_either_codec(tmp_path, monkeypatch, codec, where):
    """RFC 1952's reserved flags: zlib refuses them and ISA-L ignores them, so the source checks them
    for both; a member that starts 2 bytes before a read's end has its flags byte in the next read."""
    path = tmp_path / "rank0.json.gz"
    first = _stored_member(2 + (1 << 16)) if where.endswith("reads") else _member(TEXT, 6)
    if where == "first member":
        path.write_bytes(_member(TEXT, 6, flags=0x20))
    else:
        path.write_bytes(first + _member(TEXT, 6, flags=0x80))
    assert read_with(codec, monkeypatch, path, 10**9, 1 << 16) == ("refused",)
    with pytest.raises(InputError, match="gzip data corrupted: .*unknown header flags set"):
        source.read_text(path, 10**9)
    path.write_bytes(first + _member(TEXT, 6))  # the same without them
    assert read_with(codec, monkeypatch, path, 10**9, 1 << 16)[0] == "text"


LEVELS = st.sampled_from([0, 1, 6, 9])
MEMBERS = st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), LEVELS), min_size=1, max_size=3)
# The steps the analysis reads with (the whole limit in one; analysis.traces.stream's) and smaller ones
STEPS = st.sampled_from([None, 16 << 20, 1 << 16, 4096, 100])


def _members(picks: list[tuple[float, float, int]]) -> tuple[bytes, bytes]:
    """(gzip data, its text): members of slices of TEXT."""
    data, text = b"", b""
    for start, length, level in picks:
        at = int(start * len(TEXT))
        piece = TEXT[at : at + int(length * (len(TEXT) - at))]
        data, text = data + _member(piece, level), text + piece
    return data, text


@FUZZ
@given(members=MEMBERS, padding=st.integers(0, 3), step=STEPS, short=st.integers(-1, 1))
def test_isal_reads_what_zlib_reads(tmp_path, monkeypatch, members, padding, step, short):
    """Valid gzip: the same text from either codec, or the same refusal at a limit about the text's size."""
    data, text = _members(members)
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(data + b"\0" * padding)
    limit = max(len(text) + short, 0)
    step = step or limit + 1
    expected = ("limit",) if len(text) > limit else ("text", text)
    assert read_with(zlib, monkeypatch, path, limit, step) == expected
    assert read_with(isal_zlib, monkeypatch, path, limit, step) == expected


@FUZZ
@given(
    members=MEMBERS,
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=6),
    cut=st.none() | st.floats(0, 1),
    tail=st.binary(max_size=12),
    step=STEPS,
)
def test_damaged_gzip_is_refused_alike_by_either_codec(
    tmp_path, monkeypatch, members, flips, cut, tail, step
):
    """Flipped bytes, a cut, bytes after the end: a one-line refusal from either codec (which one can
    differ: ISA-L reads ahead, so it can find the damage before the limit or where zlib finds the cut),
    or the same text from both (damage neither can see: a header's unchecked bytes, padding bits)."""
    data, text = _members(members)
    damaged = bytearray(data)
    for where, value in flips:
        damaged[min(int(where * len(damaged)), len(damaged) - 1)] = value
    if cut is not None:
        damaged = damaged[: int(cut * len(damaged))]
    damaged += tail
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(bytes(damaged))
    limit = len(text) + 1000
    step = step or limit + 1
    by_zlib = read_with(zlib, monkeypatch, path, limit, step)
    by_isal = read_with(isal_zlib, monkeypatch, path, limit, step)
    assert by_zlib == by_isal or (by_zlib[0] != "text" and by_isal[0] != "text"), (by_zlib, by_isal)
