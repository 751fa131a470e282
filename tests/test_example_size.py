"""example_size: the serialized size of an Example, computed, against protobuf's own bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.schemas import codec
from recordforge.schemas import features as keys
from recordforge.schemas.example_size import (
    example_size,
    scalar_example_sizes,
    varint_size,
    varint_sizes,
)
from recordforge.transforms.build import build_record
from recordforge.transforms.core.planning.keys import SplitChooser
from recordforge.transforms.core.planning.labels import LabelMap
from recordforge.transforms.core.records import Candidate, ImageInfo

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
VALUES = st.one_of(
    st.tuples(st.just("bytes"), st.lists(st.binary(max_size=300), max_size=4)),
    st.tuples(st.just("int64"), st.lists(INT64, max_size=4)),
    st.tuples(st.just("float"), st.lists(st.floats(width=32), max_size=40)),
)
FEATURES = st.dictionaries(st.text(min_size=1, max_size=20), VALUES, max_size=8)


@given(FEATURES)
@settings(max_examples=300, deadline=None)
def test_size_is_the_serialized_length(features) -> None:
    assert example_size(features) == len(codec.serialize(codec.build_example(features)))


@given(FEATURES, st.integers(min_value=0, max_value=1 << 21))
@settings(max_examples=100, deadline=None)
def test_a_blob_counts_as_a_bytes_value_of_its_length(features, length) -> None:
    features.pop("blob", None)
    with_blob = {**features, "blob": ("bytes", [b"x" * length])}
    expected = len(codec.serialize(codec.build_example(with_blob)))
    assert example_size(features, {"blob": length}) == expected


@pytest.mark.parametrize(
    ("value", "size"), [(0, 1), (127, 1), (128, 2), (2**63 - 1, 9), (-1, 10), (-(2**63), 10)]
)
def test_varint_size(value, size) -> None:
    assert varint_size(value) == size


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="dtype"):
        example_size({"a": ("string", ["x"])})


@given(
    label=st.sampled_from(["cat", "a", "ünïcode-class", "x" * 200]),
    name=st.text(min_size=1, max_size=300),
    size=st.integers(min_value=1, max_value=2**40),
    width=st.integers(min_value=1, max_value=2**20),
    height=st.integers(min_value=1, max_value=2**20),
    channels=st.sampled_from([1, 2, 3, 4]),
    fmt=st.sampled_from(["jpeg", "png", "gif", "bmp", "webp"]),
)
@settings(max_examples=200, deadline=None)
def test_planning_sizes_image_records_exactly_as_convert_builds_them(
    label, name, size, width, height, channels, fmt
) -> None:
    """`plan` builds records without their Example; their sizes are what convert's are."""
    candidate = Candidate(
        key=f"0:{label}/{name}",
        path=f"/data/{label}/{name}",
        row=None,
        image_path=f"/data/{label}/{name}",
        image_name=f"{label}/{name}",
        label=label,
        depth=1,
    )
    image = ImageInfo(size, fmt, width, height, channels)
    labels = LabelMap(names=("a", "cat", "x" * 200, "ünïcode-class"), labelled_sources={0})
    chooser = SplitChooser((("train", 0.5), ("test", 0.5)), "salt")
    built, counts = build_record(candidate, image, labels, chooser, "salt")
    planned, planned_counts = build_record(
        candidate, image, labels, chooser, "salt", with_example=False
    )
    assert planned.size == built.size
    assert planned._replace(example=b"", payload_offset=0) == built._replace(
        example=b"", payload_offset=0
    )
    assert planned_counts == counts
    assert planned.example == b""
    assert built.size == len(built.example) + size + 16
    assert keys.IMAGE_ENCODED in dict(counts)


# One record's scalar features: {key: (dtype, value)}; scalar_example_sizes sizes many at once.
SCALAR_VALUES = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=300)),
    st.tuples(st.just("int64"), INT64),
    st.tuples(st.just("float"), st.floats(width=32)),
)
SCALAR_KEYS = st.sampled_from(["a", "image/width", "ünïcode", "k" * 130])


@given(
    st.lists(
        st.dictionaries(SCALAR_KEYS, SCALAR_VALUES, max_size=4), min_size=1, max_size=30
    ).filter(
        # One dtype per key, as a batch's column has.
        lambda records: all(
            len({r[k][0] for r in records if k in r}) == 1 for k in set().union(*records)
        )
    )
)
@settings(max_examples=300, deadline=None)
def test_batch_sizes_equal_each_records_size(records) -> None:
    """scalar_example_sizes over a batch == example_size and protobuf's length, per record."""
    dtypes = {k: dtype for record in records for k, (dtype, _) in record.items()}
    columns = {
        key: (
            dtype,
            [
                (len(r[key][1]) if dtype == "bytes" else r[key][1] if dtype == "int64" else 0)
                if key in r
                else 0
                for r in records
            ],
        )
        for key, dtype in dtypes.items()
    }
    present = {key: np.array([key in r for r in records]) for key in dtypes}
    sizes = scalar_example_sizes(columns, len(records), present)
    for record, size in zip(records, sizes, strict=True):
        features = {key: (dtype, (value,)) for key, (dtype, value) in record.items()}
        assert size == example_size(features)
        assert size == len(codec.serialize(codec.build_example(features)))


@given(st.lists(INT64, max_size=50))
def test_varint_sizes_equal_varint_size(values) -> None:
    assert varint_sizes(np.array(values, dtype=np.int64)).tolist() == list(map(varint_size, values))


def test_batch_sizes_refuse_an_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="dtype"):
        scalar_example_sizes({"a": ("string", [1])}, 1)
