"""The column-wise reader of Example facts agrees with protobuf, on records and on damaged ones.

Wherever schemas/example_shapes.py gives a record's facts, protobuf (upb) must parse that
record and give the same facts (codec.feature_facts); on records serialized as TensorFlow and
recordforge serialize them it must give them all. Mutated records (bytes flipped, cut,
inserted) check that it never vouches for one protobuf would refuse or read otherwise.
"""

from __future__ import annotations

import random
import struct

import pyarrow as pa
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.schemas import codec
from recordforge.schemas.example_shapes import facts_by_shape

KEYS = st.text(min_size=0, max_size=6) | st.sampled_from(["id", "image/encoded", "ключ", "a"])
VALUES = {
    "int64": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
    "float": st.lists(st.floats(width=32, allow_nan=False), max_size=5),
    "bytes": st.lists(st.binary(max_size=40), max_size=5),
}
FEATURE = st.sampled_from(["int64", "float", "bytes", None]).flatmap(
    lambda dtype: st.tuples(st.just(dtype), VALUES[dtype] if dtype else st.just([]))
)
EXAMPLES = st.dictionaries(KEYS, FEATURE, max_size=8)


def serialized(features: dict) -> bytes:
    example = codec.Example()
    for key, (dtype, values) in features.items():
        if dtype is None:
            example.features.feature[key].SetInParent()
        else:
            codec.add_features(example, {key: (dtype, values)})
    return codec.serialize(example)


def protobuf_facts(data: bytes):
    try:
        return codec.feature_facts(codec.parse(data))
    except DecodeError:
        return None


def assert_agrees(records: list[bytes], must_read: bool) -> int:
    """Check every record; returns how many the column-wise reader read."""
    shape_of, shapes = facts_by_shape(pa.array(records, pa.binary()))
    read = 0
    for data, shape in zip(records, shape_of, strict=True):
        if shape < 0:
            assert not must_read, f"not read: {data!r}"
            continue
        read += 1
        assert protobuf_facts(data) == shapes[shape], data
    return read


@settings(max_examples=200, deadline=None)
@given(st.lists(EXAMPLES, min_size=1, max_size=12))
def test_every_canonical_record_is_read_and_agrees(examples):
    assert_agrees([serialized(features) for features in examples], must_read=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(EXAMPLES, min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_damaged_records_are_never_read_otherwise_than_protobuf_reads_them(examples, rng):
    records = []
    for features in examples:
        data = bytearray(serialized(features))
        for _ in range(rng.randint(1, 3)):
            action = rng.choice(["flip", "cut", "insert", "set", "field"])
            where = rng.randrange(len(data) + 1)
            if action == "flip" and data:
                data[where % len(data)] ^= 1 << rng.randrange(8)
            elif action == "cut":
                del data[where : where + rng.randint(1, 4)]
            elif action == "field":  # a well-formed field where none belongs
                body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 3)))
                tag = rng.choice([0x0A, 0x12, 0x1A, 0x0D, 0x08, 0x10])
                piece = bytes([tag]) + (bytes([len(body)]) + body if tag & 7 == 2 else b"\x01")
                data[where:where] = piece
            elif action == "insert":
                data[where:where] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
            elif data:
                data[where % len(data)] = rng.choice([0x0A, 0x12, 0x1A, 0x80, 0xFF, 0x00, 0x0D])
        records.append(bytes(data))
    assert_agrees(records, must_read=False)


def test_tensorflow_serialized_records_are_read():
    tf = pytest.importorskip("tensorflow")
    rng = random.Random(3)
    records = []
    for i in range(300):
        feature = {
            f"k{j}": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, -j]))
            for j in range(rng.randint(0, 4))
        }
        feature["text"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"t"] * (i % 7)))
        feature["f"] = tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * (i % 3)))
        # Not deterministic: TensorFlow's map order, as ExampleGen writes records.
        records.append(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    assert assert_agrees(records, must_read=True) == 300


def field(tag: int, body: bytes) -> bytes:
    """A length-delimited field (every one here is shorter than 128 bytes)."""
    assert len(body) < 128
    return bytes([tag, len(body)]) + body


def example_of(*entries: tuple[bytes, bytes]) -> bytes:
    """An Example from (key, Feature bytes) map entries, in the order given."""
    features = b"".join(
        field(0x0A, field(0x0A, key) + field(0x12, value)) for key, value in entries
    )
    return field(0x0A, features)


def test_what_is_left_to_protobuf():
    canonical = serialized({"a": ("float", [1.0]), "b": ("bytes", [b"x"])})
    one_int = field(0x1A, field(0x0A, b"\x01"))
    unpacked_float = example_of((b"a", field(0x12, b"\x0d" + struct.pack("<f", 1.0))))
    duplicate_key = example_of((b"a", one_int), (b"a", one_int))
    bad_utf8_key = example_of((b"\xff", one_int))
    many_strings = serialized({"s": ("bytes", [b"v"] * 300)})
    eleven_byte_varint = example_of((b"a", field(0x1A, field(0x0A, b"\xff" * 10 + b"\x01"))))
    unknown_field = canonical + b"\x10\x01"
    # A packed list in two pieces: protobuf joins them.
    two_pieces = example_of((b"a", field(0x1A, field(0x0A, b"\x01") + field(0x0A, b"\x02\x03"))))
    records = [canonical, unpacked_float, duplicate_key, bad_utf8_key, many_strings]
    # Two lists in one Feature: its oneof keeps the last.
    two_kinds = example_of((b"a", field(0x12, field(0x0A, b"\0" * 4)) + one_int))
    records += [eleven_byte_varint, unknown_field, two_pieces, two_kinds]
    shape_of, shapes = facts_by_shape(pa.array(records, pa.binary()))
    assert shapes[shape_of[0]] == (("a", "float", 1), ("b", "bytes", 1))
    assert list(shape_of[1:]) == [-1] * 8
    # What protobuf makes of them: read, merged, or refused (a NotAnExample).
    assert protobuf_facts(unpacked_float) == (("a", "float", 1),)
    assert protobuf_facts(duplicate_key) == (("a", "int64", 1),)
    assert protobuf_facts(bad_utf8_key) is None
    assert protobuf_facts(many_strings) == (("s", "bytes", 300),)
    assert protobuf_facts(eleven_byte_varint) is None
    assert protobuf_facts(unknown_field) == (("a", "float", 1), ("b", "bytes", 1))
    assert protobuf_facts(two_pieces) == (("a", "int64", 3),)
    assert protobuf_facts(two_kinds) == (("a", "int64", 1),)


def test_records_of_one_shape_share_it():
    records = [serialized({"a": ("int64", [i]), "b": ("float", [i, i])}) for i in range(100)]
    records.append(b"")
    shape_of, shapes = facts_by_shape(pa.array(records, pa.binary()))
    assert len(shapes) == 2 and shapes[shape_of[-1]] == ()
    assert len(set(shape_of[:100].tolist())) == 1


def test_odd_records_found_by_the_fuzzer_are_read_as_protobuf_reads_them():
    # Each once crashed the reader: an int64 list of zero bytes alone in its block; a length
    # varint of nine bytes (a position far past the block); a float list cut mid-length.
    zero_packed = example_of((b"", field(0x1A, field(0x0A, b""))))
    huge_length = bytes([0x0A, 0x0C, 0x0A, 0x0A, 0x0A]) + b"\x80" * 8 + b"\x01" + b"\x12\x00"
    cut_float = example_of((b"f", field(0x12, b"\x0a\x84")))
    for records in ([zero_packed], [huge_length], [cut_float], [zero_packed, huge_length]):
        assert_agrees(records, must_read=False)
    assert protobuf_facts(zero_packed) == (("", "int64", 0),)
