"""Records that arrive serialized: keys, blocks, feature facts, inferred specs, dict typing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.schemas import codec
from recordforge.schemas.features import (
    FeatureTally,
    FeatureType,
    InferredFeatures,
    MixedFeatureTypes,
    derive_specs,
    feature_types,
    infer_features,
)
from recordforge.schemas.values import UnusableValue, example_from_values
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.planning.keys import SplitChooser, content_key, order_key
from recordforge.transforms.core.records import REF_SCHEMA, refs_of
from recordforge.transforms.core.tfrecord.serialized import SerializedRecords, serialized_element


def example(**features) -> bytes:
    """Serialized Example of {key: (dtype, values)}."""
    return codec.serialize(codec.build_example(features))


def test_content_key_is_a_128_bit_blake2b_of_the_bytes():
    # Golden: hashlib.blake2b(b"hello", digest_size=16).hexdigest(), computed once; a change
    # here changes every reshard's order and splits.
    assert content_key(b"hello") == "46fb7408d4f285228f4af516ea25851b"
    assert content_key(b"hello") != content_key(b"hello ")


def test_a_block_holds_the_records_as_given_sized_keyed_and_split():
    records = [example(id=("int64", [i]), name=("bytes", [b"x" * i])) for i in range(50)]
    builder = SerializedRecords((("train", 0.5), ("test", 0.5)), "salt")
    for data in records:
        builder.add(data, None, None)
    builder.add(records[0], "given", None)  # a record that names its split keeps it
    batch, failed = builder.take()
    assert failed == [] and len(builder) == 0
    assert batch.schema == REF_SCHEMA and batch.num_rows == 51
    refs = refs_of(batch)
    chooser = SplitChooser((("train", 0.5), ("test", 0.5)), "salt")
    for ref, data in zip(refs, [*records, records[0]], strict=True):
        assert ref.example == data  # byte for byte
        assert ref.size == len(data) + 16
        assert ref.order == order_key("salt", content_key(data))
        assert ref.payload_path is None and ref.label is None
    assert [ref.split for ref in refs[:50]] == [chooser.choose(content_key(d)) for d in records]
    assert refs[50].split == "given"
    assert {"train", "test"} <= {ref.split for ref in refs}


def test_sequence_examples_and_records_with_foreign_fields_are_not_examples():
    # protobuf (and TensorFlow's parser) read a SequenceExample as an Example of its context
    # features, its feature_lists set aside: they were kept as Examples, and the dataset's spec
    # had no word of the sequences.
    import tensorflow as tf

    sequence = tf.train.SequenceExample()
    sequence.context.feature["id"].int64_list.value.append(7)
    sequence.feature_lists.feature_list["frames"].feature.add().float_list.value.extend([1, 2])
    context_only = tf.train.SequenceExample()
    context_only.context.feature["id"].int64_list.value.append(7)
    extra_varint = example(id=("int64", [7])) + b"\x18\x01"  # field 3, a varint
    for records in (
        [sequence.SerializeToString()],
        [extra_varint],
        [example(id=("int64", [7]))] * 3,
    ):
        builder = SerializedRecords((("train", 1.0),), "s", {})
        for data in records:
            builder.add(data, None, "it")
        batch, failed = builder.take()
        if records[0] == extra_varint:
            assert [e.message for _, e in failed] == [
                "the record is not a tf.train.Example: it holds fields an Example does not have "
                "(numbered 3), which would be lost"
            ]
        elif len(records) == 1:
            assert batch is None or batch.num_rows == 0
            assert [(e.kind, e.message) for _, e in failed] == [
                (
                    "NotAnExample",
                    "the record is a tf.train.SequenceExample (it has feature_lists), not a "
                    "tf.train.Example",
                )
            ]
        else:
            assert batch.num_rows == 3 and not failed
    # A SequenceExample of context alone has the bytes of an Example: nothing is lost.
    builder = SerializedRecords((("train", 1.0),), "s", {})
    builder.add(context_only.SerializeToString(), None, "it")
    assert builder.take()[0].num_rows == 1


def test_records_that_are_not_examples_or_disagree_with_the_schema_fail_with_their_origin():
    types = {"age": FeatureType("int64"), "tags": FeatureType("bytes", (2,))}
    builder = SerializedRecords((("train", 1.0),), "s", types)
    builder.add(example(age=("int64", [3]), tags=("bytes", [b"a", b"b"])), None, "good")
    builder.add(b"\xff\xff\xff not protobuf", None, "garbage")
    builder.add(example(age=("float", [3.0])), None, "float age")
    builder.add(example(tags=("bytes", [b"a"])), None, "one tag")
    builder.add(example(other=("float", [1.0])), None, "untyped key")
    batch, failed = builder.take()
    assert batch.num_rows == 2
    kinds = {origin: (error.kind, error.message) for origin, error in failed}
    assert kinds["garbage"][0] == "NotAnExample"
    assert kinds["float age"] == (
        "FeatureTypeMismatch",
        "feature 'age' holds float values; the feature schema says int64",
    )
    assert kinds["one tag"] == (
        "FeatureShapeMismatch",
        "feature 'tags' holds 1 value; the feature schema's shape [2] needs exactly 2",
    )
    assert set(kinds) == {"garbage", "float age", "one tag"}


def test_the_tally_counts_each_key_its_dtype_and_value_counts():
    builder = SerializedRecords((("train", 1.0),), "s")
    builder.add(example(a=("int64", [1]), b=("float", [1.0, 2.0])))
    builder.add(example(a=("int64", [2]), b=("float", [])))
    empty = codec.Example()
    empty.features.feature["b"].SetInParent()  # a Feature with no list: any type, no values
    builder.add(codec.serialize(empty))
    builder.take()
    tally = builder.take_tally()
    assert tally.num_records == 3
    assert tally.keys == {"a": [2, 1, 1], "b": [3, 0, 2]}
    assert tally.dtypes == {"a": {"int64": 2}, "b": {"float": 2}}
    assert builder.take_tally().num_records == 0  # taken


def test_a_block_is_full_at_its_byte_size():
    builder = SerializedRecords((("train", 1.0),), "s", block_bytes=100)
    builder.add(b"x" * 60)
    assert not builder.full
    builder.add(b"x" * 40)
    assert builder.full


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=60),
    st.integers(1, 400),
)
def test_records_do_not_depend_on_how_they_are_cut_into_blocks(lengths, block_bytes):
    records = [example(v=("bytes", [b"r" * n]), i=("int64", [i])) for i, n in enumerate(lengths)]

    def refs(size):
        builder = SerializedRecords((("a", 0.3), ("b", 0.7)), "s", block_bytes=size)
        batches = []
        for data in records:
            builder.add(data)
            if builder.full:
                batches.append(builder.take()[0])
        batches.append(builder.take()[0])
        rows = [ref for batch in batches if batch is not None for ref in refs_of(batch)]
        return sorted(rows, key=lambda ref: ref.order), builder.take_tally()

    one, tally_one = refs(1 << 30)
    cut, tally_cut = refs(block_bytes)
    assert one == cut
    assert tally_one.keys == tally_cut.keys and tally_one.dtypes == tally_cut.dtypes


# -- feature specs inferred from the records ----------------------------------------------------


def _tally(*records: bytes) -> FeatureTally:
    builder = SerializedRecords((("train", 1.0),), "s")
    for data in records:
        builder.add(data)
    builder.take()
    return builder.take_tally()


def test_inferred_spec_scalars_lists_and_optional_keys():
    tally = _tally(
        example(id=("int64", [1]), v=("float", [1.0, 2.0]), t=("bytes", [b"x"])),
        example(id=("int64", [2]), v=("float", [3.0, 4.0])),
    )
    specs = {k: s.to_dict() for k, s in derive_specs(InferredFeatures(), tally).items()}
    assert specs == {
        "id": {"dtype": "int64", "shape": [], "optional": False},
        "t": {"dtype": "bytes", "shape": [-1], "optional": True},
        "v": {"dtype": "float", "shape": [2], "optional": False},
    }


def test_a_key_with_two_dtypes_has_no_spec_and_says_how_to_fix_it():
    tally = _tally(example(x=("int64", [1])), example(x=("int64", [2])), example(x=("float", [1])))
    with pytest.raises(MixedFeatureTypes) as raised:
        infer_features(tally)
    assert str(raised.value).startswith(
        "feature 'x' holds int64 values in 2 records and float values in 1 record: one feature "
        "spec cannot parse them all. Declare its dtype"
    )
    # Declared, it is what the schema says.
    declared = infer_features(tally, {"x": FeatureType("float")})
    assert [(f.key, f.dtype, f.is_list) for f in declared] == [("x", "float", False)]


def test_a_manifest_is_a_feature_schema_and_round_trips():
    tally = _tally(example(a=("int64", [1]), b=("bytes", [b"p", b"q"])), example(a=("int64", [5])))
    specs = derive_specs(InferredFeatures(), tally)
    manifest_features = {key: spec.to_dict() for key, spec in specs.items()}
    types = feature_types({"features": manifest_features})
    assert derive_specs(InferredFeatures(types), tally) == specs


@pytest.mark.parametrize(
    "document, message",
    [
        ({}, "a feature schema needs a `features` mapping of key: dtype"),
        (
            {"features": {"a": "text"}},
            "feature 'a': dtype 'text' is not one of int64, float, bytes",
        ),
        ({"features": {"a": {"dtype": "int64", "shape": [2, 3]}}}, "is not [], [k] or [-1]"),
        ({"features": {"a": {"dtype": "int64", "size": 3}}}, "feature 'a': unknown field 'size'"),
    ],
)
def test_feature_schema_mistakes_are_named(document, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        feature_types(document)


# -- dict records ---------------------------------------------------------------------------------


def test_dict_values_are_typed_as_tensorflow_would_store_them():
    tf = pytest.importorskip("tensorflow")
    values = {
        "id": 7,
        "flag": True,
        "score": np.float32(0.25),
        "mixed": [1, 2.5],
        "name": "héllo",
        "raw": b"\x00\x01",
        "ints": np.array([1, 2, 3], dtype=np.int32),
        "words": ["a", b"b"],
        "missing": None,
    }
    expected = tf.train.Example(
        features=tf.train.Features(
            feature={
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[7])),
                "flag": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
                "score": tf.train.Feature(float_list=tf.train.FloatList(value=[0.25])),
                "mixed": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 2.5])),
                "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=["héllo".encode()])),
                "raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x00\x01"])),
                "ints": tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2, 3])),
                "words": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a", b"b"])),
            }
        )
    )
    ours = codec.serialize(example_from_values(values))
    assert ours == expected.SerializeToString(deterministic=True)
    # A tf.train.Example object itself, and its bytes, become those same bytes.
    assert serialized_element(expected) == (None, ours)
    assert serialized_element(("test", ours)) == ("test", ours)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"a": {"b": 1}}, "feature 'a': a dict is not a number, text, bytes or a list of them"),
        ({"a": np.zeros((2, 2))}, "feature 'a': a 2-D array; features are flat lists"),
        ({"a": [1, "x"]}, "feature 'a': a list mixing numbers and text"),
        ({"a": [[1]]}, "feature 'a': a list holding a list"),
        ({"a": 2**63}, "feature 'a': an integer beyond the int64 range"),
        ({"a": 1e39}, "feature 'a': a float beyond the float32 range"),
        ({1: 2}, "feature keys are text; 1 is a int"),
    ],
)
def test_values_no_feature_can_hold_are_refused(values, message):
    with pytest.raises(UnusableValue) as raised:
        example_from_values(values)
    assert str(raised.value).startswith(message)


def test_declared_dtypes_type_dict_values():
    data = codec.serialize(
        example_from_values({"x": [1, 2], "e": []}, {"x": "float", "e": "int64"})
    )
    assert codec.to_python(codec.parse(data)) == {"x": ("float", [1.0, 2.0]), "e": ("int64", [])}
    with pytest.raises(UnusableValue, match="declared int64; it holds a float"):
        example_from_values({"x": 1.5}, {"x": "int64"})
    # Without a declared dtype, an empty list is a Feature of no type (any dtype parses it).
    empty = codec.parse(codec.serialize(example_from_values({"e": []})))
    assert empty.features.feature["e"].WhichOneof("kind") is None


@pytest.mark.parametrize(
    "element, kind",
    [
        (("train", "b", "c"), "UnusableElement"),
        ((3, b""), "UnusableElement"),
        (("no.dots", b""), "BadSplitName"),
        (42, "UnusableElement"),
        ({"a": object()}, "UnusableValue"),
    ],
)
def test_elements_write_dataset_cannot_use_are_input_errors(element, kind):
    with pytest.raises(InputError) as raised:
        serialized_element(element)
    assert raised.value.kind == kind


def test_complete_batches_leave_payload_columns_empty():
    builder = SerializedRecords((("train", 1.0),), "s")
    builder.add(example(a=("int64", [1])))
    batch, _ = builder.take()
    for name in ("payload_path", "path", "row", "label"):
        assert batch.column(name).null_count == 1
    assert batch.column("example").type == pa.binary()
