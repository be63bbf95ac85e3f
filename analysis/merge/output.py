"""The merged trace's gzip stream; its header's comment field (RFC 1952 FCOMMENT, which gzip readers
skip) says which command wrote it."""

from __future__ import annotations

import struct
import zlib
from typing import BinaryIO

MARK = b"pipeline-bubbles: python -m analysis merge"
# gzip: magic, deflate, FCOMMENT flag, no mtime, no extra flags, unknown OS; then the comment, 0-ended.
HEADER = b"\x1f\x8b\x08\x10" + bytes(4) + b"\x00\xff" + MARK + b"\x00"


class GzipStream:
    """The merged trace's gzip, its header marked (MARK), written to `file` piece by piece; `size`
    counts the bytes before compression (what a browser's limit applies to)."""

    def __init__(self, file: BinaryIO):
        self._file, self.size, self._crc = file, 0, 0
        self._deflate = zlib.compressobj(5, zlib.DEFLATED, -zlib.MAX_WBITS)
        file.write(HEADER)

    def write(self, data: bytes) -> None:
        self.size += len(data)
        self._crc = zlib.crc32(data, self._crc)
        self._file.write(self._deflate.compress(data))

    def finish(self) -> None:
        """The rest of the stream and gzip's trailer: CRC-32 and size modulo 2**32."""
        self._file.write(self._deflate.flush() + struct.pack("<II", self._crc, self.size & 0xFFFFFFFF))
