"""The TFRecord scanner on a stream cut at every byte: each cut is one exact TRUNCATED finding;
frames, frame headers and CRC findings against the layout built by hand.

Written for mutation testing (docs/testing.md): truncation was tested at a few offsets only, so
a header check off by one byte (a stream cut 11 bytes into a header) went unnoticed; and no test
of the mutated selection called `is_frame_header`.
"""

from __future__ import annotations

import io
import struct
from unittest import mock

import google_crc32c
import pytest

from recordforge.transforms.core.tfrecord import framing as tfrecord
from recordforge.transforms.core.tfrecord.framing import (
    DATA_CRC,
    LENGTH_CRC,
    TRUNCATED,
    FramingProblem,
    TFRecordCorruption,
    frame_record,
    is_frame_header,
    masked_crc32c,
    read_records,
    scan_records,
)

PAYLOADS = [b"first record", b"", b"xyz"]


class Dribble(io.RawIOBase):
    """A stream that returns at most 3 bytes per read, as a socket may."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return self._data.read(min(n, 3) if n >= 0 else 3)


def expected_scan(cut: int) -> list[tuple[int, bytes, FramingProblem | None]]:
    """What scanning the first `cut` bytes of PAYLOADS' frames yields, from the layout alone:
    8 bytes of length, 4 of its CRC, the payload, 4 of its CRC."""
    found, start = [], 0
    for payload in PAYLOADS:
        size = 8 + 4 + len(payload) + 4
        if cut >= start + size:
            found.append((start, payload, None))
        elif cut > start:
            have = cut - start
            if have < 12:
                message = f"truncated header ({have} of 12 bytes)"
            else:
                message = (
                    f"truncated record ({have - 12} of {len(payload) + 4} bytes after the header)"
                )
            found.append((start, b"", FramingProblem(TRUNCATED, message)))
            break
        start += size
    return found


STREAM = b"".join(frame_record(payload) for payload in PAYLOADS)


@pytest.mark.parametrize("reader", [io.BytesIO, Dribble], ids=["whole-reads", "short-reads"])
def test_a_stream_cut_at_any_byte_is_reported_exactly(reader):
    for cut in range(len(STREAM) + 1):
        assert list(scan_records(reader(STREAM[:cut]))) == expected_scan(cut), f"cut at {cut}"


@pytest.mark.parametrize("have", range(1, 12))
def test_every_short_header_is_a_truncated_header(have):
    """A stream cut 1 to 11 bytes into the second record's header."""
    start = 8 + 4 + len(PAYLOADS[0]) + 4
    with pytest.raises(TFRecordCorruption) as raised:
        list(read_records(io.BytesIO(STREAM[: start + have])))
    assert raised.value.offset == start
    assert str(raised.value) == f"at byte {start}: truncated header ({have} of 12 bytes)"


class Recording(io.BytesIO):
    """Records the largest read asked of it."""

    largest = 0

    def read(self, n: int = -1) -> bytes:
        self.largest = max(self.largest, n)
        return super().read(n)


def test_records_longer_than_one_read_are_read_in_pieces():
    payloads = [b"p" * 20, b"q" * 8, b"r" * 9]
    stream = Recording(b"".join(frame_record(p) for p in payloads))
    with mock.patch.object(tfrecord, "_MAX_READ", 8):
        assert [data for _, data, _ in scan_records(stream)] == payloads
    assert stream.largest == 12  # the header; records past 8 bytes come 8 at a time


def test_a_length_field_claiming_more_than_the_stream_costs_no_large_read():
    length = (1 << 40).to_bytes(8, "little")
    header = length + masked_crc32c(length).to_bytes(4, "little")
    stream = Recording(header + b"only this")
    assert list(scan_records(stream)) == [
        (
            0,
            b"",
            FramingProblem(
                TRUNCATED, f"truncated record (9 of {(1 << 40) + 4} bytes after the header)"
            ),
        )
    ]
    assert stream.largest <= 64 << 20


# Frames built by hand from TFRecord's layout, independently of the module under test:
# uint64 length, its masked CRC32C, the payload, the payload's masked CRC32C (all little-endian).
def masked(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def header_by_hand(length: int) -> bytes:
    length_field = struct.pack("<Q", length)
    return length_field + struct.pack("<I", masked(length_field))


def frame_by_hand(payload: bytes, data_crc: int | None = None) -> bytes:
    crc = masked(payload) if data_crc is None else data_crc
    return header_by_hand(len(payload)) + payload + struct.pack("<I", crc)


def test_frames_are_the_layout_built_by_hand():
    for payload in [b"", b"a", b"record", bytes(range(256)) * 5]:
        assert frame_record(payload) == frame_by_hand(payload)
        assert masked_crc32c(payload) == masked(payload)


@pytest.mark.parametrize("length", [0, 1, 300, 1 << 33])
def test_a_frame_header_is_recognised(length):
    assert is_frame_header(header_by_hand(length))


def test_what_is_no_frame_header():
    sound = header_by_hand(300)
    for flipped in range(12):  # any bit of the length or its CRC
        broken = bytearray(sound)
        broken[flipped] ^= 0x10
        assert not is_frame_header(bytes(broken)), flipped
    assert not is_frame_header(sound[:11])
    assert not is_frame_header(sound + b"\x00")
    assert not is_frame_header(b"")


def test_a_bad_data_crc_names_both_crcs_and_the_scan_goes_on():
    first, second, third = b"payload one", b"", b"three"
    wrong = masked(first) ^ 0x00010000
    stream = frame_by_hand(first, wrong) + frame_by_hand(second) + frame_by_hand(third)
    message = (
        f"data CRC mismatch (stored {wrong:#010x}, the 11-byte payload gives {masked(first):#010x})"
    )
    assert list(scan_records(io.BytesIO(stream))) == [
        (0, first, FramingProblem(DATA_CRC, message)),
        (16 + 11, second, None),
        (16 + 11 + 16, third, None),
    ]


def test_a_bad_length_crc_ends_the_scan_with_its_offset():
    good = frame_by_hand(b"good")
    bad = bytearray(frame_by_hand(b"bad"))
    bad[8] ^= 0x01  # the length's CRC
    stream = good + bytes(bad) + frame_by_hand(b"never read")
    assert list(scan_records(io.BytesIO(stream))) == [
        (0, b"good", None),
        (20, b"", FramingProblem(LENGTH_CRC, "length CRC mismatch")),
    ]
    with pytest.raises(TFRecordCorruption) as raised:
        list(read_records(io.BytesIO(stream)))
    assert raised.value.offset == 20
    assert str(raised.value) == "at byte 20: length CRC mismatch"
