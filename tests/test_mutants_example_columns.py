"""The columnar Example encoder (schemas/example_columns.py) where a broken rule went unnoticed.

Written for mutation testing (docs/testing.md): the property tests in
tests/test_example_columns.py compare every row's bytes with the codec's, but never met a key
long enough for a two-byte length (written by `_varint_bytes`, not by the columns' varints),
nor a default whose entry follows a Features length of two or three bytes (cut out of the
codec's bytes by a loop over that varint; one mutant of it loops forever, a timeout), an
unknown dtype's message, a batch of no rows, the documented int64 dtypes of `sizes` and
`counts` (compared there as values, where 1.0 == 1), or the RuntimeWarnings numpy raises when
it is not told otherwise (a float beyond float32 overflowing, a signalling NaN, the length of
a missing bytes value cast from NaN): the encoder writes those bytes silently. The oracle is
protobuf's own serialization (`codec.serialize`) of the same Example, and the bytes parsed
back. Each test was red with its mutant applied.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.schemas import codec
from recordforge.schemas.example_columns import FeatureColumn, _binary, encode_examples


def _codec_bytes(features: dict) -> bytes:
    return codec.serialize(codec.build_example(features))


@pytest.mark.parametrize("with_bytes", [True, False])
def test_a_batch_of_no_rows(with_bytes):
    columns = [
        FeatureColumn("i", "int64", pa.array([], pa.int64())),
        FeatureColumn("l", "bytes", pa.array([], pa.list_(pa.binary())), default=[b"d"]),
    ]
    encoded = encode_examples(columns, 0, with_bytes=with_bytes)
    assert encoded.sizes.dtype == np.int64
    assert encoded.sizes.shape == (0,)
    assert encoded.counts.dtype == np.int64
    assert encoded.counts.shape == (0, 2)
    if with_bytes:
        assert encoded.examples.type == pa.binary()
        assert len(encoded.examples) == 0
    else:
        assert encoded.examples is None


def test_a_batch_of_no_rows_still_checks_each_column_has_no_values():
    column = FeatureColumn("i", "int64", pa.array([7], pa.int64()))
    with pytest.raises(ValueError, match="feature 'i': 1 values, 0 rows"):
        encode_examples([column], 0)


def test_more_bytes_than_a_binary_array_holds_are_refused_not_wrapped():
    # 2 GiB + 2 bytes of zeros: numpy's zeroed pages are not touched, so this costs no memory.
    data = np.zeros((1 << 31) + 2, dtype=np.uint8)
    with pytest.raises(ValueError, match="2,147,483,650 bytes in one column of one batch"):
        _binary(data, np.array([1 << 30, (1 << 30) + 2]), 2)
    # Up to the bound the offsets are exact.
    fits = _binary(data[: (1 << 31) - 1], np.array([1 << 30, (1 << 30) - 1]), 2)
    offsets = np.frombuffer(fits.buffers()[1], dtype=np.int32)
    assert offsets.tolist() == [0, 1 << 30, (1 << 31) - 1]


@pytest.mark.parametrize("with_bytes", [True, False])
def test_sizes_and_counts_are_int64(with_bytes):
    rows = [
        {"i": [-1], "t": [b"ab"], "l": [1.5, 2.5, 3.5]},
        {"t": [b""], "l": []},
        {},
    ]
    columns = [
        FeatureColumn("i", "int64", pa.array([-1, None, None], pa.int64())),
        FeatureColumn("t", "bytes", pa.array([b"ab", b"", None], pa.binary())),
        FeatureColumn("l", "float", pa.array([[1.5, 2.5, 3.5], [], None], pa.list_(pa.float64()))),
    ]
    encoded = encode_examples(columns, 3, with_bytes=with_bytes)
    assert encoded.sizes.dtype == np.int64
    assert encoded.counts.dtype == np.int64
    dtypes = {"i": "int64", "t": "bytes", "l": "float"}
    expected = [_codec_bytes({k: (dtypes[k], v) for k, v in row.items()}) for row in rows]
    assert encoded.sizes.tolist() == [len(data) for data in expected]
    assert encoded.counts.tolist() == [[1, 1, 3], [-1, 1, 0], [-1, -1, -1]]
    if with_bytes:
        assert encoded.examples.to_pylist() == expected


@pytest.mark.parametrize("length", [127, 128, 200, 16383, 16384, 20000])
def test_keys_of_two_and_three_byte_lengths(length):
    """A key's length is a varint too: two bytes from 128 bytes of UTF-8, three from 16384."""
    long_key = "k" * (length - 2) + "\u00e9"  # é: two bytes of UTF-8
    columns = [
        FeatureColumn(long_key, "bytes", pa.array([b"v", None], pa.binary())),
        FeatureColumn("a", "int64", pa.array([7, 8], pa.int64())),
    ]
    encoded = encode_examples(columns, 2)
    expected = [
        _codec_bytes({long_key: ("bytes", [b"v"]), "a": ("int64", [7])}),
        _codec_bytes({"a": ("int64", [8])}),
    ]
    assert encoded.examples.to_pylist() == expected
    assert encoded.sizes.tolist() == [len(data) for data in expected]
    parsed = codec.to_python(codec.parse(encoded.examples[0].as_py()))
    assert parsed == {long_key: ("bytes", [b"v"]), "a": ("int64", [7])}


@pytest.mark.parametrize(
    ("dtype", "default"),
    [
        ("bytes", [b"x" * 116]),  # a scalar's Features of 127 bytes: a one-byte length
        ("bytes", [b"x" * 117]),  # 128 bytes: a two-byte length
        ("bytes", [b"x" * 200]),
        ("bytes", [b"y" * 100, b"z" * 100]),
        ("bytes", [b"w" * 20000]),  # three-byte lengths
        ("int64", [-1] * 20),  # 20 ten-byte varints: 200 bytes packed
        ("float", [0.5] * 40),
    ],
)
@pytest.mark.parametrize("is_list", [True, False])
def test_defaults_whose_entry_needs_a_long_length(dtype, default, is_list):
    """Missing rows take the default's map entry, cut out of the codec's serialization of an
    Example holding only it: after the Features' length, which may take several bytes."""
    if not is_list:
        default = default[:1]
    arrow_type = {"int64": pa.int64(), "float": pa.float64(), "bytes": pa.binary()}[dtype]
    own = {"bytes": [b"own"], "int64": [3], "float": [-2.0]}[dtype]
    if is_list:
        values = pa.array([own, None, [], None], pa.list_(arrow_type))
        cells = [own, None, [], None]
    else:
        values = pa.array([own[0], None, own[0], None], arrow_type)
        cells = [own, None, own, None]
    columns = [
        FeatureColumn("d", dtype, values, default=default),
        FeatureColumn("e", "int64", pa.array([1, 2, None, None], pa.int64())),
    ]
    encoded = encode_examples(columns, 4)
    others = [[1], [2], None, None]
    for index, (cell, other) in enumerate(zip(cells, others, strict=True)):
        features = {"d": (dtype, default if cell is None else cell)}
        if other is not None:
            features["e"] = ("int64", other)
        data = encoded.examples[index].as_py()
        assert data == _codec_bytes(features), f"row {index}"
        assert codec.to_python(codec.parse(data))["d"] == features["d"]
        assert encoded.sizes[index] == len(data)
    assert encoded.counts[:, 0].tolist() == [
        len(default if cell is None else cell) for cell in cells
    ]


@settings(max_examples=25, deadline=None)
@given(
    key=st.text(min_size=1, max_size=200),
    default=st.lists(st.binary(max_size=200), min_size=0, max_size=3),
    present=st.lists(st.booleans(), min_size=1, max_size=4),
)
def test_long_keys_and_defaults_as_the_codec_writes_them(key, default, present):
    cells = [[b"c" * index] if here else None for index, here in enumerate(present)]
    values = pa.array(cells, pa.list_(pa.binary()))
    encoded = encode_examples([FeatureColumn(key, "bytes", values, default=default)], len(cells))
    for index, cell in enumerate(cells):
        expected = _codec_bytes({key: ("bytes", default if cell is None else cell)})
        assert encoded.examples[index].as_py() == expected


@pytest.mark.parametrize("is_list", [False, True])
def test_an_unknown_dtype_is_refused_in_words(is_list):
    values = pa.array([[1]], pa.list_(pa.int64())) if is_list else pa.array([1], pa.int64())
    for with_bytes in (True, False):
        with pytest.raises(ValueError) as raised:
            encode_examples([FeatureColumn("k", "int32", values)], 1, with_bytes=with_bytes)
        assert str(raised.value) == "unknown dtype 'int32'"


def _signalling_nans() -> np.ndarray:
    bits = np.array([0x7FF0000000000001, 0xFFF4000000000000], dtype=np.uint64)
    return bits.view(np.float64)


@pytest.mark.parametrize("with_bytes", [True, False])
def test_encoding_raises_no_warnings(with_bytes):
    """Floats beyond float32 become infinities and signalling NaNs quiet ones, as protobuf
    writes them, and a missing bytes value is no NaN: all without a RuntimeWarning (which a
    conversion would print, or raise under -W error)."""
    floats = [1e39, -1e300, math.inf, 0.5, *_signalling_nans().tolist()]
    texts = [b"a", None, b"", None, b"b" * 130, None]
    columns = [
        FeatureColumn("f", "float", pa.array(floats, pa.float64())),
        FeatureColumn("l", "float", pa.array([floats, [], None, [1e40], None, []])),
        FeatureColumn("t", "bytes", pa.array(texts, pa.binary())),
        FeatureColumn("u", "bytes", pa.array([None] * 6, pa.binary())),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        encoded = encode_examples(columns, 6, with_bytes=with_bytes)
    lists = [floats, [], None, [1e40], None, []]
    for index in range(6):
        features = {"f": ("float", [floats[index]])}
        if lists[index] is not None:
            features["l"] = ("float", lists[index])
        if texts[index] is not None:
            features["t"] = ("bytes", [texts[index]])
        data = _codec_bytes(features)
        assert encoded.sizes[index] == len(data)
        if with_bytes:
            assert encoded.examples[index].as_py() == data, f"row {index}"
    assert encoded.counts[:, 2].tolist() == [1, -1, 1, -1, 1, -1]
    assert encoded.counts[:, 3].tolist() == [-1] * 6
