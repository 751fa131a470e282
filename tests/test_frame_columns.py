"""Bulk framing of a column of records: the same bytes as framing them one by one."""

import io
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.transforms.core.tfrecord import frame_columns
from recordforge.transforms.core.tfrecord.frame_columns import (
    frame_binary_array,
    frame_in_order,
    index_lines,
    record_lengths,
)
from recordforge.transforms.core.tfrecord.framing import frame_record, read_records


def frame_records(records):
    return b"".join(frame_record(r) for r in records)


# Made with TensorFlow 2.21: `with tf.io.TFRecordWriter(p) as w: w.write(b"hello"); w.write(b"")`.
GOLDEN = (
    b"\x05\x00\x00\x00\x00\x00\x00\x00\xea\xb2\x04>hello\xbb\x1f\x1c\x19"
    b"\x00\x00\x00\x00\x00\x00\x00\x00)\x03\x98\x07\xd8\xea\x82\xa2"
)


def test_framing_a_column_matches_tensorflow_bytes():
    assert frame_binary_array(pa.array([b"hello", b""], pa.binary())).to_pybytes() == GOLDEN


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=30))
def test_column_framing_is_record_by_record_framing(records):
    # Equal lengths share a length CRC: repeats must frame exactly like the first.
    records = records + records
    column = pa.array(records, pa.binary())
    assert frame_binary_array(column).to_pybytes() == frame_records(records)


def test_frames_a_column_exactly_as_record_by_record():
    rng = random.Random(7)
    # Few distinct lengths (as a table's records have) and some odd ones, the empty one too.
    records = [
        rng.randbytes(rng.choice([0, 1, 150, 151, 300, rng.randrange(5000)])) for _ in range(3000)
    ]
    column = pa.array(records, pa.binary())
    framed = frame_binary_array(column).to_pybytes()
    assert framed == frame_records(records)
    # A slice (nonzero offset into the array's buffers) frames just its own records.
    assert frame_binary_array(column.slice(1234, 500)).to_pybytes() == frame_records(
        records[1234:1734]
    )

    assert list(read_records(io.BytesIO(framed))) == records


def test_frames_nothing_and_refuses_nulls():
    assert frame_binary_array(pa.array([], pa.binary())).to_pybytes() == b""
    with pytest.raises(ValueError, match="null"):
        frame_binary_array(pa.array([b"a", None], pa.binary()))


def test_frames_past_int32_offsets_with_large_binary(monkeypatch):
    # Framed bytes beyond int32 offsets are joined as large_binary: lower the limit to see it.
    monkeypatch.setattr(frame_columns, "_INT32_MAX", 100)
    records = [bytes([i]) * (40 + i) for i in range(5)]
    assert frame_binary_array(pa.array(records, pa.binary())).to_pybytes() == frame_records(records)
    assert frame_binary_array(pa.array(records, pa.large_binary())).to_pybytes() == frame_records(
        records
    )


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=30))
def test_the_index_locates_each_framed_record(records):
    # A slice: its offsets do not start at zero.
    column = pa.array([b"not in the shard", *records], pa.binary()).slice(1)
    framed = frame_binary_array(column).to_pybytes()
    lines = index_lines(record_lengths(column)).to_pybytes().decode("ascii").splitlines()
    assert len(lines) == len(records)
    for record, line in zip(records, lines, strict=True):
        offset, length = map(int, line.split(" "))
        assert framed[offset : offset + length] == frame_record(record)
    assert sum(int(line.split(" ")[1]) for line in lines) == len(framed)


@st.composite
def chunked_records(draw):
    """(a chunked column of records, an order of all of them): records around the 12 bytes a
    binary view holds inline, in chunks that are slices of larger arrays, binary or
    large_binary."""
    binary_type = draw(st.sampled_from([pa.binary(), pa.large_binary()]))
    record = st.binary(max_size=14) | st.binary(max_size=300)
    chunks = [
        pa.array([b"before", *records, b"after"], binary_type).slice(1, len(records))
        for records in draw(st.lists(st.lists(record, max_size=12), max_size=4))
    ]
    column = pa.chunked_array(chunks, binary_type)
    return column, draw(st.permutations(range(len(column))))


@settings(max_examples=100, deadline=None)
@given(chunked_records(), st.integers(1, 5))
def test_framing_in_order_is_framing_the_sorted_records(column_and_order, per_buffer):
    column, order = column_and_order
    records = column.to_pylist()
    positions = np.array(order, dtype=np.int64)
    buffers = list(frame_in_order(column, positions, per_buffer))
    assert len(buffers) == -(-len(order) // per_buffer)  # buffers of per_buffer records
    framed = b"".join(buffer.to_pybytes() for buffer in buffers)
    assert framed == frame_records([records[i] for i in order])
    index = index_lines(record_lengths(column)[positions]).to_pybytes().decode("ascii")
    assert [int(line.split(" ")[1]) for line in index.splitlines()] == [
        len(records[i]) + 16 for i in order
    ]


@settings(max_examples=50, deadline=None)
@given(chunked_records(), st.integers(1, 200))
def test_buffers_hold_at_most_their_bytes_unless_one_record_is_more(column_and_order, budget):
    # Large records (Examples holding images) must not be framed a whole shard at a time.
    column, order = column_and_order
    records = column.to_pylist()
    buffers = [b.to_pybytes() for b in frame_in_order(column, np.array(order, np.int64), 7, budget)]
    assert b"".join(buffers) == frame_records([records[i] for i in order])
    framed = iter([len(records[i]) + 16 for i in order])
    for buffer in buffers:
        sizes = []
        while sum(sizes) < len(buffer):
            sizes.append(next(framed))
        assert sum(sizes) == len(buffer) and len(sizes) <= 7
        assert len(buffer) <= budget or len(sizes) == 1


def test_framing_in_order_refuses_nulls_in_any_chunk():
    column = pa.chunked_array([pa.array([b"a"]), pa.array([b"b", None])])
    with pytest.raises(ValueError, match="null"):
        list(frame_in_order(column, np.arange(3), 10))


def test_large_binary_chunks_are_cut_within_int32_offsets(monkeypatch):
    # Views address bytes by int32 offsets: lower the limit to see a large_binary chunk cut.
    monkeypatch.setattr(frame_columns, "_INT32_MAX", 100)
    records = [bytes([i]) * (30 + i) for i in range(9)]
    column = pa.array([b"skipped", *records], pa.large_binary()).slice(1)
    pieces = frame_columns._binary_chunks(column)
    assert len(pieces) > 1
    assert [r for piece in pieces for r in piece.to_pylist()] == records
    for piece in pieces:
        offsets = frame_columns._offsets(piece)
        assert piece.type == pa.binary() and offsets[0] == 0 and offsets[-1] <= 100
    order = np.arange(len(records))[::-1].copy()
    framed = b"".join(b.to_pybytes() for b in frame_in_order(column, order, 4))
    assert framed == frame_records(records[::-1])
    # A single record beyond the limit cannot be cut: refused, not wrapped around.
    with pytest.raises(ValueError, match="too large"):
        frame_columns._binary_chunks(pa.array([b"x" * 101], pa.large_binary()))
