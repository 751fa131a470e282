"""Bulk framing (transforms/core/tfrecord/frame_columns.py) where a broken rule went unnoticed.

Written for mutation testing (docs/testing.md): the framed bytes were well tested, but not how
they are cut into buffers (filled up to exactly their byte budget; large_binary past int32
offsets), how a large_binary column is cut into int32-addressable pieces, nor whether the
binary views built on the way are valid Arrow (their inline prefix and zero padding, which
Arrow's full validation checks and its kernels may use). Frames are built here by hand with
struct and google-crc32c, and cuts by a naive greedy loop.
"""

from __future__ import annotations

import random
import struct

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest

from recordforge.transforms.core.tfrecord import frame_columns
from recordforge.transforms.core.tfrecord.frame_columns import (
    frame_binary_array,
    frame_in_order,
    record_lengths,
)


def masked(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def header(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked(length))


def footer(record: bytes) -> bytes:
    return struct.pack("<I", masked(record))


def framed(records) -> bytes:
    return b"".join(header(r) + r + footer(r) for r in records)


def test_a_column_past_one_write_buffer_is_framed_whole():
    # Three records of 6 MiB: more than the 16 MiB a writer's buffer holds, and all of them
    # must come back from frame_binary_array (it is not cut into buffers).
    records = [bytes([i + 1]) * (6 << 20) for i in range(3)]
    out = frame_binary_array(pa.array(records, pa.binary()))
    assert out.size == 3 * ((6 << 20) + 16)
    assert out.to_pybytes() == framed(records)


def greedy_cuts(sizes: list[int], per_buffer: int, budget: int) -> list[int]:
    """The records per buffer: as many as fit in `budget` bytes (at least one), at most
    `per_buffer`."""
    cuts, i = [], 0
    while i < len(sizes):
        total, count = sizes[i], 1
        while count < per_buffer and i + count < len(sizes) and total + sizes[i + count] <= budget:
            total += sizes[i + count]
            count += 1
        cuts.append(count)
        i += count
    return cuts


def test_a_buffer_is_filled_up_to_exactly_its_byte_budget():
    records = [b"abcd"] * 7  # 20 bytes framed each
    order = np.arange(7)
    sizes = [len(b) for b in frame_in_order(pa.array(records), order, 10, buffer_bytes=60)]
    assert sizes == [60, 60, 20]  # a buffer of exactly 60 bytes is within its 60
    sizes = [len(b) for b in frame_in_order(pa.array(records), order, 10, buffer_bytes=59)]
    assert sizes == [40, 40, 40, 20]


def test_buffers_are_cut_greedily():
    rng = random.Random(18)
    for _ in range(200):
        records = [rng.randbytes(rng.randrange(0, 30)) for _ in range(rng.randrange(1, 12))]
        order = list(range(len(records)))
        rng.shuffle(order)
        per_buffer, budget = rng.randrange(1, 6), rng.randrange(16, 150)
        buffers = list(frame_in_order(pa.array(records), np.array(order), per_buffer, budget))
        sizes = [len(records[i]) + 16 for i in order]
        cuts = greedy_cuts(sizes, per_buffer, budget)
        assert [len(b) for b in buffers] == [
            sum(sizes[sum(cuts[:k]) : sum(cuts[: k + 1])]) for k in range(len(cuts))
        ]
        assert b"".join(b.to_pybytes() for b in buffers) == framed([records[i] for i in order])


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (40, ["binary", "binary", "binary"]),  # 40 bytes fit int32 offsets of at most 40
        (39, ["large_binary", "large_binary", "binary"]),
    ],
)
def test_framed_records_past_int32_offsets_are_copied_out_as_large_binary(
    monkeypatch, limit, expected
):
    # The limit lowered, as Arrow's real one (2 GiB) takes 2 GiB of records to reach. What the
    # framed array was cast to is seen by the reader of its offsets, _offsets.
    monkeypatch.setattr(frame_columns, "_INT32_MAX", limit)
    seen = []
    offsets = frame_columns._offsets

    def spy(array):
        seen.append((len(array), str(array.type)))
        return offsets(array)

    monkeypatch.setattr(frame_columns, "_offsets", spy)
    records = [b"abcd", b"efgh", b"ijkl", b"mnop", b"qrst"]  # 20 bytes framed each
    buffers = list(frame_in_order(pa.array(records, pa.binary()), np.arange(5), 2))
    assert b"".join(b.to_pybytes() for b in buffers) == framed(records)
    # The column itself (5 records) is read first; then each buffer's framed pieces (3 a record).
    assert seen[0] == (5, "binary")
    assert seen[1:] == [(6, expected[0]), (6, expected[1]), (3, expected[2])]


def pieces_by_hand(sizes: list[int], limit: int) -> list[list[int]]:
    """A large_binary column cut into runs of records whose bytes fit in `limit` (at least one
    record each), greedily."""
    runs, run, total = [], [], 0
    for size in sizes:
        if run and total + size > limit:
            runs.append(run)
            run, total = [], 0
        run.append(size)
        total += size
    return [*runs, run] if run else runs


def test_large_binary_chunks_are_cut_greedily_within_int32_offsets(monkeypatch):
    monkeypatch.setattr(frame_columns, "_INT32_MAX", 100)
    rng = random.Random(3)
    cases = [
        [50, 50, 50, 50],  # pieces of exactly the limit
        [60, 60, 60],  # no two fit together
        [100, 1, 99, 0, 100],  # one record of exactly the limit
        [0, 0, 0],
    ] + [[rng.choice([0, 1, 33, 50, 67, 99, 100]) for _ in range(8)] for _ in range(50)]
    for sizes in cases:
        records = [bytes([i + 65]) * size for i, size in enumerate(sizes)]
        column = pa.array([b"skipped", *records], pa.large_binary()).slice(1)
        pieces = frame_columns._binary_chunks(column)
        assert [[len(r) for r in piece.to_pylist()] for piece in pieces] == pieces_by_hand(
            sizes, 100
        ), sizes
        assert [r for piece in pieces for r in piece.to_pylist()] == records
        out = b"".join(b.to_pybytes() for b in frame_in_order(column, np.arange(len(sizes)), 3))
        assert out == framed(records)


def test_refusals_say_what_is_wrong(monkeypatch):
    with pytest.raises(ValueError, match="^a record to frame is null$"):
        frame_columns._binary_chunks(pa.array([b"a", None], pa.binary()))
    monkeypatch.setattr(frame_columns, "_INT32_MAX", 100)
    # The record too large starts 2 bytes into the column: its size, not its end offset.
    with pytest.raises(ValueError, match="^a record of 101 bytes is too large to frame$"):
        frame_columns._binary_chunks(pa.array([b"ab", b"x" * 101], pa.large_binary()))


@pytest.mark.parametrize("binary_type", [pa.binary(), pa.large_binary()])
def test_a_column_of_empty_records_only(binary_type):
    # Its data buffer is empty (and an empty pa.Buffer is false).
    column = pa.array([b"", b"", b""], binary_type)
    assert column.buffers()[2].size == 0
    out = b"".join(b.to_pybytes() for b in frame_in_order(column, np.array([2, 0, 1]), 2))
    assert out == framed([b""] * 3)


def test_record_lengths_are_int64():
    lengths = record_lengths(pa.array([b"", b"abc", b"x" * 300], pa.binary()))
    assert lengths.dtype == np.int64 and lengths.tolist() == [0, 3, 300]
    lengths = record_lengths(pa.chunked_array([[b"ab"], [b"cde"]], pa.large_binary()))
    assert lengths.dtype == np.int64 and lengths.tolist() == [2, 3]


@pytest.mark.parametrize("buffer_number", [0, 1])
def test_record_views_are_valid_arrow_binary_views(buffer_number):
    """Each record's header, record and footer as binary views: Arrow's full validation checks
    the inline prefix of a long view against its bytes and the zero padding of a short one."""
    rng = random.Random(buffer_number)
    lengths = [0, 1, 3, 4, 5, 11, 12, 13, 14, 40, 2, 12, 200, 0, 13]
    records = [bytes(rng.randrange(1, 256) for _ in range(n)) for n in lengths]
    column = pa.array([b"\xff" * 7, *records, b"\xee" * 9], pa.binary()).slice(1, len(records))
    views = frame_columns._record_views(column, buffer_number)
    assert views.shape == (len(records), 3, 16)
    data = [pa.py_buffer(b"other")] * buffer_number + [column.buffers()[2]]
    array = pa.Array.from_buffers(
        pa.binary_view(), 3 * len(records), [None, pa.py_buffer(views), *data]
    )
    array.validate(full=True)
    expected = []
    for record in records:
        expected += [header(record), record, footer(record)]
    assert array.to_pylist() == expected


def test_record_views_of_a_column_shorter_than_a_prefix():
    column = pa.array([b"ab", b"", b"c"], pa.binary())  # 3 bytes of data in all
    views = frame_columns._record_views(column, 0)
    array = pa.Array.from_buffers(
        pa.binary_view(), 9, [None, pa.py_buffer(views), column.buffers()[2]]
    )
    array.validate(full=True)
    assert array.to_pylist()[1::3] == [b"ab", b"", b"c"]
