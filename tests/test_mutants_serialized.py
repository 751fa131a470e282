"""What reshard and WriteDataset trust of records that arrive serialized, and of the TFRecord files
they read: the tests that mutmut's survivors in core/tfrecord/serialized.py and inputs.py asked
for (docs/testing.md). Each was red with its mutant applied."""

from __future__ import annotations

import pyarrow as pa
import pytest

from recordforge.schemas import codec
from recordforge.schemas.example_shapes import facts_by_shape
from recordforge.schemas.features import FeatureType
from recordforge.schemas.values import UnusableValue, example_from_values
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.tfrecord.inputs import is_metadata
from recordforge.transforms.core.tfrecord.serialized import (
    SerializedRecords,
    check_types,
    serialized_element,
)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _unpacked_int64_example(key: str, value: int) -> bytes:
    """A valid Example whose int64 list is written unpacked, as protobuf may: the column
    reader does not vouch for it and protobuf reads it (schemas/example_shapes.py)."""
    int64_list = _varint(1 << 3 | 0) + _varint(value)
    entry = _field(1, key.encode()) + _field(2, _field(3, int64_list))
    return _field(1, _field(1, entry))


def test_a_block_is_not_full_one_byte_short_of_its_size_before_and_after_a_take():
    builder = SerializedRecords((("train", 1.0),), "s", block_bytes=100)
    builder.add(b"x" * 99)
    assert not builder.full
    builder.add(b"x")
    assert builder.full
    builder.take()
    builder.add(b"x" * 99)
    assert not builder.full


def test_records_protobuf_reads_are_checked_against_the_schema_too():
    record = _unpacked_int64_example("age", 3)
    shape_of, _ = facts_by_shape(pa.array([record], pa.binary()))
    assert shape_of[0] == -1  # read by protobuf, not by the column reader
    assert codec.feature_facts(codec.parse(record)) == (("age", "int64", 1),)
    builder = SerializedRecords((("train", 1.0),), "s", {"age": FeatureType("float")})
    builder.add(record, None, "unpacked")
    batch, failed = builder.take()
    assert batch is None
    [(origin, error)] = failed
    assert origin == "unpacked"
    assert (error.kind, error.message) == (
        "FeatureTypeMismatch",
        "feature 'age' holds int64 values; the feature schema says float",
    )


def test_bytes_that_are_no_example_are_named_so():
    builder = SerializedRecords((("train", 1.0),), "s")
    builder.add(b"\xff\xff\xff not protobuf", None, "garbage")
    _, [(_, error)] = builder.take()
    assert (error.kind, error.message) == (
        "NotAnExample",
        "the record's bytes do not parse as a tf.train.Example",
    )


def test_a_key_the_schema_does_not_name_does_not_stop_the_check_of_the_keys_after_it():
    types = {"age": FeatureType("int64")}
    with pytest.raises(InputError, match="feature 'age' holds float values"):
        check_types((("other", "bytes", 1), ("age", "float", 1)), types)


@pytest.mark.parametrize(
    "count, says", [(1, "holds 1 value;"), (3, "holds 3 values;")], ids=["one", "three"]
)
def test_a_shape_mismatch_counts_its_values_in_words(count, says):
    with pytest.raises(InputError) as raised:
        check_types((("tags", "bytes", count),), {"tags": FeatureType("bytes", (2,))})
    assert raised.value.message == (
        f"feature 'tags' {says} the feature schema's shape [2] needs exactly 2"
    )


def test_dict_elements_are_typed_by_the_schema():
    types = {"x": FeatureType("float")}
    split, data = serialized_element({"x": [1, 2]}, types)
    assert split is None
    assert codec.feature_facts(codec.parse(data)) == (("x", "float", 2),)
    assert data == codec.serialize(example_from_values({"x": [1, 2]}, {"x": "float"}))
    # Without a schema the same values are integers.
    assert codec.feature_facts(codec.parse(serialized_element({"x": [1, 2]})[1])) == (
        ("x", "int64", 2),
    )


def _refusal(element) -> InputError:
    with pytest.raises(InputError) as raised:
        serialized_element(element)
    return raised.value


def test_elements_write_dataset_cannot_use_are_named_in_their_messages():
    assert _refusal((b"a", b"b", b"c")).message == (
        "a tuple of 3 items is not a (split, record) pair"
    )
    long_name = "s" * 45 + "/"
    assert _refusal((long_name, b"")).message == (
        f"split {long_name[:40]!r} cannot name shard files (letters, digits, '_', '-')"
    )
    assert _refusal(2.5).message == (
        "a float: WriteDataset takes serialized tf.train.Example bytes, tf.train.Example "
        "objects, dicts of feature values, or (split, record) pairs of them"
    )
    nested = {"k": {"inner": 1}}
    with pytest.raises(UnusableValue) as direct:
        example_from_values(nested)
    refusal = _refusal(nested)
    assert (refusal.kind, refusal.message) == ("UnusableValue", str(direct.value))


@pytest.mark.parametrize(
    "relative",
    ["ds/errors/probe.jsonl", "exports/ds/errors/write.jsonl", "errors/probe.jsonl"],
)
def test_a_datasets_errors_files_are_metadata_at_any_depth(relative):
    assert is_metadata(relative)
    assert not is_metadata(relative.replace("errors/", "kept/"))
