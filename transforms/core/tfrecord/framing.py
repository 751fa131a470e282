"""TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import google_crc32c

# Every record costs this much beyond its payload: uint64 length + two uint32 CRCs.
FRAMING_BYTES = 16

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def masked_crc32c(data: bytes) -> int:
    """The CRC32C of `data`, masked as TFRecord defines (rotate right by 15, add a constant)."""
    return _mask(google_crc32c.value(data))


def frame_record(data: bytes) -> bytes:
    """Return `data` wrapped in TFRecord framing, ready to append to a .tfrecord file."""
    return frame_pieces((data,))


def frame_pieces(pieces: Sequence[bytes]) -> bytes:
    """`frame_record(b"".join(pieces))`, with the pieces copied once (into the result).

    A record assembled from a few pieces (an Example around an image file's bytes) is framed
    without joining it first: the CRC runs over the pieces in turn.
    """
    header, footer = framing_of(pieces)
    return b"".join((header, *pieces, footer))


def framing_of(pieces: Sequence[bytes]) -> tuple[bytes, bytes]:
    """(header, footer) such that header + the pieces + footer is `frame_pieces(pieces)`.

    For a writer that sends a large piece (an image file's bytes) to the file as it is rather
    than copying it into one framed record first.
    """
    length = _LENGTH.pack(sum(len(piece) for piece in pieces))
    crc = 0
    for piece in pieces:
        crc = google_crc32c.extend(crc, piece)
    return length + _CRC.pack(_mask(google_crc32c.value(length))), _CRC.pack(_mask(crc))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class TFRecordCorruption(Exception):
    """A TFRecord stream with wrong framing or checksums; `offset` is the record's byte offset."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(f"at byte {offset}: {message}")
        self.offset = offset


# Problems a scan reports. After LENGTH_CRC or TRUNCATED the framing is lost and the scan ends;
# after DATA_CRC the length is still trustworthy, so the next record is found and the scan goes on.
DATA_CRC = "data_crc"
LENGTH_CRC = "length_crc"
TRUNCATED = "truncated"

# Reads larger than this are made in pieces, so a length field that claims more than the stream
# holds costs no more memory than the stream has left.
_MAX_READ = 64 << 20


@dataclass(frozen=True)
class FramingProblem:
    """What is wrong with one record's framing: `kind` (DATA_CRC, LENGTH_CRC, TRUNCATED), words."""

    kind: str
    message: str


def scan_records(stream: BinaryIO) -> Iterator[tuple[int, bytes, FramingProblem | None]]:
    """Yield (offset, payload, problem) for each record of an uncompressed TFRecord stream.

    `offset` is the byte offset of the record's frame in the stream. `problem` is None for a
    sound record. A DATA_CRC problem comes with the payload as stored and the scan goes on; a
    LENGTH_CRC or TRUNCATED problem comes with an empty payload and ends the scan. Records are
    read one at a time: memory holds one payload, whatever the stream's size. Exceptions of the
    stream itself (I/O or decompression errors) propagate.
    """
    offset = 0
    read = stream.read
    while True:
        header = read(12)
        if len(header) < 12:
            if not header:
                return
            header += _read_up_to(stream, 12 - len(header))
            if len(header) < 12:
                problem = FramingProblem(TRUNCATED, f"truncated header ({len(header)} of 12 bytes)")
                yield offset, b"", problem
                return
        length_bytes = header[:8]
        if _CRC.unpack_from(header, 8)[0] != masked_crc32c(length_bytes):
            yield offset, b"", FramingProblem(LENGTH_CRC, "length CRC mismatch")
            return
        (length,) = _LENGTH.unpack(length_bytes)
        data = read(length) if length <= _MAX_READ else b""
        if len(data) < length:
            data += _read_up_to(stream, length - len(data))
        stored = read(4) if len(data) == length else b""
        if len(stored) < 4 and len(data) == length:
            stored += _read_up_to(stream, 4 - len(stored))
        if len(data) < length or len(stored) < 4:
            present = len(data) + len(stored)
            message = f"truncated record ({present} of {length + 4} bytes after the header)"
            yield offset, b"", FramingProblem(TRUNCATED, message)
            return
        computed = masked_crc32c(data)
        (expected,) = _CRC.unpack(stored)
        if expected != computed:
            message = (
                f"data CRC mismatch (stored {expected:#010x}, the {length}-byte payload "
                f"gives {computed:#010x})"
            )
            yield offset, data, FramingProblem(DATA_CRC, message)
        else:
            yield offset, data, None
        offset += FRAMING_BYTES + length


def _read_up_to(stream: BinaryIO, n: int) -> bytes:
    """Up to `n` bytes: fewer only at the end of the stream (some streams return short reads)."""
    parts = []
    while n > 0:
        chunk = stream.read(min(n, _MAX_READ))
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def is_frame_header(head: bytes) -> bool:
    """Whether 12 bytes are a TFRecord frame header: a length and its masked CRC32C."""
    return len(head) == 12 and _CRC.unpack_from(head, 8)[0] == masked_crc32c(head[:8])


def read_records(stream: BinaryIO) -> Iterator[bytes]:
    """Yield the records of an uncompressed TFRecord stream, checking both CRCs of each.

    Raises:
        TFRecordCorruption: a short read or a CRC mismatch; names the record's byte offset.
    """
    for offset, data, problem in scan_records(stream):
        if problem is not None:
            raise TFRecordCorruption(offset, problem.message)
        yield data
