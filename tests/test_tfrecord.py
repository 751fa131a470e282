"""TFRecord framing: golden bytes from TensorFlow, round trips, exact corruption reports."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.transforms.core.tfrecord.framing import (
    FRAMING_BYTES,
    TFRecordCorruption,
    frame_pieces,
    frame_record,
    framing_of,
    masked_crc32c,
    read_records,
)

# Made with TensorFlow 2.21: `with tf.io.TFRecordWriter(p) as w: w.write(b"hello"); w.write(b"")`.
GOLDEN = (
    b"\x05\x00\x00\x00\x00\x00\x00\x00\xea\xb2\x04>hello\xbb\x1f\x1c\x19"
    b"\x00\x00\x00\x00\x00\x00\x00\x00)\x03\x98\x07\xd8\xea\x82\xa2"
)


def test_framing_matches_tensorflow_bytes():
    assert frame_record(b"hello") + frame_record(b"") == GOLDEN


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=4))
def test_framing_of_pieces_is_the_framing_of_their_concatenation(pieces):
    # The writer sends header, the pieces (an image file's bytes among them) and footer
    # separately; a reader must see frame_record of the whole record.
    header, footer = framing_of(pieces)
    whole = frame_record(b"".join(pieces))
    assert header + b"".join(pieces) + footer == frame_pieces(pieces) == whole
    assert len(header) + len(footer) == FRAMING_BYTES


def test_framing_overhead():
    assert len(frame_record(b"x" * 1000)) == 1000 + FRAMING_BYTES


def test_masked_crc_of_empty_input():
    # The masked CRC of b"" is the constant in GOLDEN's last four bytes.
    assert masked_crc32c(b"").to_bytes(4, "little") == GOLDEN[-4:]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=20))
def test_round_trip(records):
    stream = io.BytesIO(b"".join(frame_record(r) for r in records))
    assert list(read_records(stream)) == records


@settings(max_examples=10, deadline=None)
@given(st.lists(st.binary(max_size=2000), min_size=1, max_size=10))
def test_tensorflow_reads_our_framing(tmp_path_factory, records):
    import tensorflow as tf

    path = tmp_path_factory.mktemp("tfr") / "data.tfrecord"
    path.write_bytes(b"".join(frame_record(r) for r in records))
    assert [t.numpy() for t in tf.data.TFRecordDataset(str(path))] == records


def test_flipped_payload_byte_is_reported_with_its_record_offset():
    data = bytearray(GOLDEN)
    data[12] ^= 0x01  # the 'h' of the first record's payload
    with pytest.raises(TFRecordCorruption, match="at byte 0: data CRC mismatch"):
        list(read_records(io.BytesIO(bytes(data))))


def test_flipped_length_byte_in_second_record():
    data = bytearray(GOLDEN)
    second = len(frame_record(b"hello"))
    data[second] ^= 0x01
    records = read_records(io.BytesIO(bytes(data)))
    assert next(records) == b"hello"
    with pytest.raises(TFRecordCorruption, match=f"at byte {second}: length CRC mismatch"):
        next(records)


def test_truncated_stream():
    with pytest.raises(TFRecordCorruption, match="truncated record"):
        list(read_records(io.BytesIO(GOLDEN[:15])))
    with pytest.raises(TFRecordCorruption, match="truncated header"):
        list(read_records(io.BytesIO(GOLDEN[:5])))
