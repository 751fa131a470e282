"""What a file read gave (bytes, their CRC32C, rows), to tell that it changed between reads.

A table with text labels is read twice in a conversion (its class names, then its records).
Should the file change in between, the second read would make records the label map never saw;
comparing the two reads' fingerprints names the file instead of failing on a stray label or on
counts that do not add up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

import google_crc32c
import numpy as np


@dataclass(frozen=True)
class FileFingerprint:
    """One read of a file.

    Attributes:
        num_bytes: bytes read (decompressed), -1 when the read stopped at an error.
        crc32c: CRC32C of those bytes, -1 when the read stopped at an error.
        rows: data rows parsed (good or bad).
    """

    num_bytes: int
    crc32c: int
    rows: int

    def differs_from(self, other: FileFingerprint) -> bool:
        """Whether two reads of a file saw different contents."""
        if self.rows != other.rows:
            return True
        if min(self.num_bytes, other.num_bytes) < 0:  # a read stopped early: rows only
            return self.num_bytes != other.num_bytes
        return (self.num_bytes, self.crc32c) != (other.num_bytes, other.crc32c)

    def describe(self) -> str:
        if self.num_bytes < 0:
            return f"{self.rows:,} rows before an error"
        return f"{self.num_bytes:,} bytes, {self.rows:,} rows"


class FingerprintingStream:
    """A read-only binary stream that counts and checksums what is read through it.

    It offers `readinto` and `read1` only when the wrapped stream does: a reader takes the
    stream's own pieces where it has them (a cut gzip stream raises from a `read` that asked
    for more than it had, losing what it had decompressed: core.tables.stream).
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.num_bytes = 0
        self.crc32c = 0
        if getattr(stream, "readinto", None) is not None:
            self.readinto = self._readinto
        if getattr(stream, "read1", None) is not None:
            self.read1 = self._read1

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._add(data)
        return data

    def _read1(self, size: int = -1) -> bytes:
        data = self._stream.read1(size)
        self._add(data)
        return data

    def _readinto(self, view) -> int:
        got = self._stream.readinto(view) or 0
        self._add(memoryview(view)[:got])
        return got

    def fingerprint(self, rows: int) -> FileFingerprint:
        """The fingerprint of what was read, of which `rows` data rows were parsed."""
        return FileFingerprint(self.num_bytes, self.crc32c, rows)

    def _add(self, data) -> None:
        # google-crc32c takes read-only buffers only: a read-only numpy view, not a copy.
        readonly = np.frombuffer(data, dtype=np.uint8)
        readonly.flags.writeable = False
        self.crc32c = google_crc32c.extend(self.crc32c, readonly)
        self.num_bytes += len(readonly)
