"""A trace file's JSON text, within a byte limit, as valid UTF-8.

A plain file's size is checked before it is read (a huge or sparse file is refused without touching its
bytes); gzip (recognised by its magic bytes, whatever the name) is decompressed as a stream, member
after member (`cat a.gz b.gz` is one gzip file), and stopped as soon as it passes the limit, so a small
file that expands to gigabytes costs no more than the limit. Invalid UTF-8 (a flipped byte in a
crashed job's file, another tool's encoding) is replaced by U+FFFD and counted: the fields the
analysis reads would otherwise refuse the whole file while the fields it skips would carry the bytes
into a merged trace that is not JSON. Checking costs one `isascii` pass on the common all-ASCII text.
Gzip is inflated by ISA-L (the isal package: zlib's API and checks, 2-3x zlib's speed on our traces),
or by zlib where isal is not installed: the same text, refused alike, slower.
"""

from __future__ import annotations

import codecs
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import InputError, LimitExceeded
from analysis.traces import limits

try:
    from isal import isal_zlib as gzip_codec
except ImportError:  # (a platform without its wheel)
    gzip_codec = zlib

GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = zlib.MAX_WBITS | 16  # a gzip member: its header and its trailer's CRC and length checked
# A member header's flags byte, and its bits that RFC 1952 reserves: zlib refuses a header with any set
# (a corrupted one), ISA-L ignores them, so they are checked here for both.
_FLAGS_AT, _RESERVED_FLAGS = 3, 0xE0
_READ_BYTES = 1 << 26  # compressed bytes per read, at most
_RATIO = 8  # a trace's JSON per byte of its gzip, at least, usually
_UTF8_CHUNK = 1 << 24  # bytes validated per step (its str lives only for that step)
_REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class Text:
    data: bytes | bytearray
    replaced: int  # invalid UTF-8 sequences replaced by U+FFFD
    first_replaced: int | None  # byte offset of the first, in the text as read


def read_text(path: Path, limit: int, limit_name: str | None = None) -> Text:
    """The file's JSON text, decompressed if gzip; InputError past `limit` bytes (named `limit_name`,
    a field of analysis.traces.limits.Limits, when a flag sets it) or when the file cannot be read or
    decompressed."""
    try:
        with open(path, "rb", buffering=0) as file:  # unbuffered: readall() makes one buffer, no copy
            info = os.fstat(file.fileno())
            head = file.read(2)
            if head == GZIP_MAGIC:
                data = _gunzip(path, file, head, limit, limit_name)
            elif stat.S_ISREG(info.st_mode):
                if info.st_size > limit:
                    raise LimitExceeded(path, _too_big(info.st_size, limit_name, limit))
                file.seek(0)
                data = file.readall()  # one buffer of the size fstat gave
                if len(data) > limit:  # grew while being read
                    raise LimitExceeded(path, _too_big(len(data), limit_name, limit))
            else:
                data = _read_stream(path, file, head, limit, limit_name)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory, not a trace file") from None
    except OSError as error:
        raise InputError(path, f"cannot read: {error.strerror or error}") from None
    if data.isascii():
        return Text(data, 0, None)
    return _valid_utf8(path, data, limit, limit_name)


def _too_big(size: int | None, limit_name: str | None, limit: int) -> str:
    """The problem of a text past its limit: `size` bytes, or (None) more than the limit."""
    if limit_name is None:
        shown = "more than" if size is None else f"{size / limits.MB:,.0f} MB, more than"
        return f"is {shown} the {limit / limits.MB:,.0f} MB such a file may be"
    describe = limits.current().describe(limit_name)
    if limit_name.startswith("run"):
        return f"with the files before it, the run's JSON comes to more than {describe}"
    if size is None:
        return f"this file decompresses to more than {describe}"
    return f"this file is {size / limits.MB:,.0f} MB of JSON, more than {describe}"


def _read_stream(path: Path, file, head: bytes, limit: int, limit_name: str | None) -> bytes:
    """A pipe's or device's bytes after `head` (it has no size to check first), never more than
    limit + 1 of them."""
    chunks, size = [head], len(head)
    while size <= limit:
        chunk = file.read(min(limit + 1 - size, 1 << 26))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise LimitExceeded(path, _too_big(None, limit_name, limit))


def _gunzip(path: Path, file, head: bytes, limit: int, limit_name: str | None) -> bytes:
    """The decompressed text of every member, stopped as soon as it passes `limit`: a file read in one
    piece (the common case) is inflated in one call into one buffer, as gzip.decompress would."""
    chunks = list(inflated(path, file, head, limit, limit_name, limit + 1))
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one chunk: that buffer itself, no copy


def inflated(path: Path, file, head: bytes, limit: int, limit_name: str | None, step: int) -> Iterator[bytes]:
    """The decompressed text of every member, at most `step` bytes a chunk, stopped as soon as it passes
    `limit`. Each step inflates what one read gave as far as the limit and `step` allow, so no step
    holds more than the limit."""
    size = 0
    # (its few bytes give no output: the first read's whole inflates into one chunk)
    pending = _checked_header(path, file, head)
    inflate = gzip_member()
    # Compressed bytes per read: about a step's output at JSON's usual ratio (the codec copies what a step
    # leaves of a read, so a read much longer than a step is copied again at each step).
    read_bytes = min(_READ_BYTES, max(step // _RATIO, 1 << 16))
    try:
        while True:
            if not pending:
                pending = file.read(read_bytes)
                if not pending:
                    break
            out = inflate.decompress(pending, min(step, limit + 1 - size))
            size += len(out)
            if size > limit:
                raise LimitExceeded(path, _too_big(None, limit_name, limit))
            if out:
                yield out
            if not inflate.eof:
                pending = inflate.unconsumed_tail
                continue
            pending = _next_member(path, file, inflate.unused_data, read_bytes)
            if pending is None:
                return
            pending = _checked_header(path, file, pending)
            inflate = gzip_member()
    except (zlib.error, gzip_codec.error) as error:
        raise InputError(path, f"gzip data corrupted: {error}") from None
    raise InputError(path, "gzip stream truncated (file cut short while being written?)")


def _checked_header(path: Path, file, pending: bytes) -> bytes:
    """A member's first bytes, through its flags byte where the file has one, refused with reserved
    flags."""
    if len(pending) <= _FLAGS_AT:
        pending += file.read(_FLAGS_AT + 1 - len(pending))
    if len(pending) > _FLAGS_AT and pending[_FLAGS_AT] & _RESERVED_FLAGS:
        raise InputError(path, "gzip data corrupted: unknown header flags set")
    return pending


def gzip_member():
    """A decompressor of one gzip member (zlib's decompressobj API), from the codec in use."""
    return gzip_codec.decompressobj(_GZIP_WBITS)


def text_chunks(path: Path, limit: int, limit_name: str | None, step: int) -> Iterator[bytes] | None:
    """A regular file's JSON text in chunks of at most `step` bytes, decompressed if gzip, with the
    checks and errors of `read_text` but no UTF-8 repair; None for anything else (a pipe, a device:
    read_text reads those whole)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except OSError:
        return None  # read_text words the problem
    return _chunks(path, limit, limit_name, step)


def _chunks(path: Path, limit: int, limit_name: str | None, step: int) -> Iterator[bytes]:
    try:
        with open(path, "rb", buffering=0) as file:
            size = os.fstat(file.fileno()).st_size
            head = file.read(2)
            if head == GZIP_MAGIC:
                yield from inflated(path, file, head, limit, limit_name, step)
                return
            if size > limit:
                raise LimitExceeded(path, _too_big(size, limit_name, limit))
            read = len(head)
            yield head
            while chunk := file.read(step):
                read += len(chunk)
                if read > limit:  # grew while being read
                    raise LimitExceeded(path, _too_big(read, limit_name, limit))
                yield chunk
    except OSError as error:
        raise InputError(path, f"cannot read: {error.strerror or error}") from None


def _next_member(path: Path, file, rest: bytes, read_bytes: int) -> bytes | None:
    """What follows a finished gzip member: the next member's bytes, or None at the end (zero padding,
    which some writers add, is allowed)."""
    while True:
        rest = rest.lstrip(b"\x00")
        if len(rest) < 2:
            more = file.read(read_bytes)
            if not more:
                if rest:
                    raise InputError(path, "gzip data corrupted: trailing bytes after the last member")
                return None
            rest += more
            continue
        if rest[:2] != GZIP_MAGIC:
            raise InputError(path, "gzip data corrupted: trailing bytes after the last member")
        return rest


def _valid_utf8(path: Path, data: bytes | bytearray, limit: int, limit_name: str | None) -> Text:
    bad = _first_invalid(data)
    if bad is None:
        return Text(data, 0, None)
    view = memoryview(data)
    out = bytearray(view[:bad])
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    replaced, step = 0, _UTF8_CHUNK
    for start in range(bad, len(data), step):
        chunk = view[start : start + step]
        text = decoder.decode(chunk, final=start + step >= len(data))
        replaced += text.count(_REPLACEMENT) - bytes(chunk).count(b"\xef\xbf\xbd")
        out += text.encode("utf-8")
    if len(out) > limit:
        raise LimitExceeded(path, _too_big(len(out), limit_name, limit))
    return Text(out, max(replaced, 1), bad)


def _first_invalid(data: bytes | bytearray) -> int | None:
    """The offset of the first byte that is not valid UTF-8, or None."""
    view, start = memoryview(data), 0
    while start < len(data):
        chunk = view[start : start + _UTF8_CHUNK]
        final = start + _UTF8_CHUNK >= len(data)
        try:
            _, used = codecs.utf_8_decode(chunk, "strict", final)
        except UnicodeDecodeError as error:
            return start + error.start
        if used == 0:  # an incomplete sequence longer than a chunk cannot be
            return start
        start += used
    return None
