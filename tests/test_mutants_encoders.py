"""The Example codec and the spliced encoder on the inputs they refuse or rarely see.

Written for mutation testing (docs/testing.md): error paths and the inspection helper, which
the property tests (valid Examples of every shape) do not reach.
"""

from __future__ import annotations

import numpy as np
import pytest

from recordforge.schemas import codec
from recordforge.schemas.example_size import scalar_example_sizes, varint_sizes
from recordforge.schemas.spliced import serialize_around, widen_empty_value


def test_an_unknown_dtype_is_refused_with_its_key():
    with pytest.raises(ValueError) as raised:
        codec.build_example({"k": ("int32", [1])})
    assert str(raised.value) == "feature 'k': unknown dtype 'int32'"


def test_to_python_gives_each_feature_its_dtype():
    example = codec.build_example(
        {"b": ("bytes", [b"x", b""]), "f": ("float", [0.5]), "i": ("int64", [-3, 4])}
    )
    example.features.feature["none"].Clear()  # a Feature with no list set
    assert codec.to_python(example) == {
        "b": ("bytes", [b"x", b""]),
        "f": ("float", [0.5]),
        "i": ("int64", [-3, 4]),
        "none": ("bytes", []),
    }


def test_an_example_without_features_is_left_without_them():
    empty = codec.Example()
    skeleton, offset = serialize_around(empty, "image/encoded", 3)
    expected = codec.serialize(codec.build_example({"image/encoded": ("bytes", [b"abc"])}))
    assert skeleton[:offset] + b"abc" + skeleton[offset:] == expected
    assert not empty.HasField("features") and codec.serialize(empty) == b""


def _with_empty(key: str, **others) -> bytes:
    return codec.serialize(codec.build_example({key: ("bytes", [b""]), **others}))


@pytest.mark.parametrize(
    ("serialized", "message"),
    [
        (b"", "not a serialized Example with only its `features` field"),
        (b"\x12\x00", "not a serialized Example with only its `features` field"),
        (_with_empty("k") + b"\x00", "not a serialized Example with only its `features` field"),
        (_with_empty("other"), "no entry for b'k'"),
        (
            codec.serialize(codec.build_example({"k": ("bytes", [b"x"])})),
            "the Example's 'k' is not a single empty bytes value",
        ),
        (
            codec.serialize(codec.build_example({"k": ("bytes", [b"", b""])})),
            "the Example's 'k' is not a single empty bytes value",
        ),
    ],
)
def test_widening_refuses_what_is_not_a_stand_in(serialized, message):
    with pytest.raises(ValueError) as raised:
        widen_empty_value(serialized, "k", 5)
    assert str(raised.value) == message


def test_widening_finds_the_stand_in_among_other_entries():
    serialized = _with_empty("k", a=("int64", [1]), z=("bytes", [b"z" * 200]))
    skeleton, offset = widen_empty_value(serialized, "k", 300)
    expected = codec.build_example(
        {"k": ("bytes", [b"p" * 300]), "a": ("int64", [1]), "z": ("bytes", [b"z" * 200])}
    )
    assert skeleton[:offset] + b"p" * 300 + skeleton[offset:] == codec.serialize(expected)


def test_feature_facts_give_each_key_its_dtype_and_count_in_key_order():
    example = codec.build_example(
        {
            "z": ("int64", [-3, 4, 5]),
            "b": ("bytes", [b"x", b""]),
            "f": ("float", [0.5]),
            "e": ("float", []),
        }
    )
    example.features.feature["a"].Clear()  # a Feature with no list set: any type, no value
    assert codec.feature_facts(example) == (
        ("a", None, 0),
        ("b", "bytes", 2),
        ("e", "float", 0),
        ("f", "float", 1),
        ("z", "int64", 3),
    )
    assert codec.feature_facts(codec.Example()) == ()


def test_the_encoder_refuses_a_row_of_another_length():
    """A row with fewer or more values than the encoder's features is refused, not encoded
    without the features it lacks (or with values dropped)."""
    encoder = codec.ExampleEncoder([("a", "int64"), ("b", "bytes")])
    assert encoder.encode([[1], None]) == codec.serialize(
        codec.build_example({"a": ("int64", [1])})
    )
    for row in ([[1]], [[1], [b"x"], [2]], [None]):
        with pytest.raises(ValueError):
            encoder.encode(row)


@pytest.mark.parametrize("before", [20_000, 3_000_000])
def test_widening_reads_lengths_of_three_and_four_varint_bytes(before):
    """The stand-in after an entry of more than 2^14 (2^21) bytes: the Example's length and
    that entry's are varints of 3 (4) bytes, read to find the stand-in."""
    serialized = _with_empty("k", a=("bytes", [b"a" * before]))
    skeleton, offset = widen_empty_value(serialized, "k", 5)
    expected = codec.build_example({"k": ("bytes", [b"12345"]), "a": ("bytes", [b"a" * before])})
    assert skeleton[:offset] + b"12345" + skeleton[offset:] == codec.serialize(expected)


def test_batch_sizes_without_absent_features():
    """Every record holds every feature (no `present`): each size is protobuf's length."""
    records = [
        {"a": ("int64", [7]), "b": ("bytes", [b"xyz"]), "f": ("float", [0.5])},
        {"a": ("int64", [-1]), "b": ("bytes", [b"q" * 300]), "f": ("float", [2.0])},
    ]
    columns = {
        "a": ("int64", [7, -1]),
        "b": ("bytes", np.array([3, 300], dtype=np.int64)),
        "f": ("float", [0, 0]),
    }
    sizes = scalar_example_sizes(columns, 2)
    assert sizes.dtype == np.int64
    assert sizes.tolist() == [len(codec.serialize(codec.build_example(r))) for r in records]


def test_batch_sizes_of_records_without_features_are_int64_zeros():
    sizes = scalar_example_sizes({}, 3)
    assert sizes.dtype == np.int64 and sizes.tolist() == [0, 0, 0]
    assert len(codec.serialize(codec.build_example({}))) == 0


def varint_length_by_hand(value: int) -> int:
    """Bytes of protobuf's varint of an int64 (two's complement: 10 when negative)."""
    value &= (1 << 64) - 1
    length = 1
    while value >= 0x80:
        value >>= 7
        length += 1
    return length


def test_varint_sizes_at_every_step():
    """At and around each power of 2^7, where a varint takes one more byte."""
    values = [0, 1, -1, -(1 << 63), (1 << 63) - 1]
    for bits in range(7, 63, 7):
        values += [(1 << bits) - 1, 1 << bits, (1 << bits) + 1]
    sizes = varint_sizes(np.array(values, dtype=np.int64))
    assert sizes.tolist() == [varint_length_by_hand(v) for v in values]
