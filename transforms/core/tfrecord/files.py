"""Reading TFRecord files that others wrote: plain or gzip, every problem named by its offset.

A file's first bytes tell how it is stored (whatever its name says): a TFRecord frame header,
or gzip's magic number. Its records come out one at a time with the byte offset of each frame
(in the decompressed stream, for gzip), so a reader holds one record, whatever the file's
size. What cannot be read becomes a Problem with that offset: a record whose data CRC fails
(the next one is still found: its length was sound), a frame cut short or with a bad length CRC
(the rest of the file cannot be framed), a gzip stream that is corrupt or ends early, a file
that is no TFRecord file at all.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from recordforge.transforms.core.tfrecord.framing import (
    DATA_CRC,
    FRAMING_BYTES,
    LENGTH_CRC,
    is_frame_header,
    scan_records,
)

GZIP_MAGIC = b"\x1f\x8b"

# Error kinds (the quarantine's `error` field).
BAD_RECORD_CRC = "BadRecordCrc"
BAD_LENGTH_CRC = "BadLengthCrc"
TRUNCATED_RECORD = "TruncatedRecord"
CORRUPT_GZIP = "CorruptGzip"
TRUNCATED_GZIP = "TruncatedGzip"
NOT_TFRECORD = "NotATFRecordFile"

_GZIP_ERRORS = (zlib.error, gzip.BadGzipFile)


class Problem(NamedTuple):
    """Something in a file that is not a usable record: where (`offset`), what, and why.

    `offset` is the byte offset of the frame (or of where reading stopped), in the decompressed
    stream when `compressed`.
    """

    offset: int
    kind: str
    message: str
    compressed: bool = False


def compression_of(head: bytes) -> str | None:
    """How a file whose first bytes are `head` (up to 12) is stored: "none", "gzip", or None
    when it is neither a TFRecord file nor gzip. An empty file is an empty TFRecord file; one
    shorter than a header is one cut short."""
    if len(head) < 12 and not head.startswith(GZIP_MAGIC):
        return "none"
    if is_frame_header(head[:12]):
        return "none"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    return None


def read_file_records(raw: BinaryIO) -> Iterator[tuple[int, bytes] | Problem]:
    """(offset, record) for each sound record of a TFRecord file, and a Problem for each part
    that is not one, in file order. Errors of the underlying stream itself (a read that fails)
    propagate."""
    head = _read_up_to(raw, 12)
    compression = compression_of(head)
    if compression is None:
        yield Problem(
            0,
            NOT_TFRECORD,
            "neither a TFRecord file nor a gzip-compressed one: its first 12 bytes are no "
            "TFRecord frame header and no gzip header",
        )
        return
    stream: BinaryIO = _Prefixed(head, raw)
    compressed = compression == "gzip"
    if compressed:
        stream = gzip.GzipFile(fileobj=stream, mode="rb")
    end = 0  # just after the last whole frame
    frames = scan_records(stream)
    while True:
        try:
            offset, data, problem = next(frames)
        except StopIteration:
            return
        except EOFError:
            yield Problem(
                end,
                TRUNCATED_GZIP,
                "the gzip stream ends before its end marker (the file was cut short); "
                "the records before this point were read",
                compressed,
            )
            return
        except _GZIP_ERRORS as error:
            yield Problem(
                end,
                CORRUPT_GZIP,
                f"the gzip stream is corrupt ({error}); the records before this point were read",
                compressed,
            )
            return
        if problem is None:
            end = offset + FRAMING_BYTES + len(data)
            yield offset, data
        elif problem.kind == DATA_CRC:
            end = offset + FRAMING_BYTES + len(data)
            message = f"{problem.message}: the record is not what was written"
            yield Problem(offset, BAD_RECORD_CRC, message, compressed)
        else:
            kind = BAD_LENGTH_CRC if problem.kind == LENGTH_CRC else TRUNCATED_RECORD
            message = f"{problem.message}: the rest of the file cannot be read as records"
            yield Problem(offset, kind, message, compressed)
            return


def _read_up_to(stream: BinaryIO, n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class _Prefixed:
    """A read-only stream: `head` (bytes already read from `raw`), then the rest of `raw`."""

    def __init__(self, head: bytes, raw: BinaryIO) -> None:
        self._head = head
        self._raw = raw

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._raw.read(n)
        if n is None or n < 0:
            data, self._head = self._head + self._raw.read(), b""
            return data
        data, self._head = self._head[:n], self._head[n:]
        if len(data) < n:
            data += self._raw.read(n - len(data))
        return data

    def readable(self) -> bool:
        return True
