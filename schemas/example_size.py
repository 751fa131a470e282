"""The serialized size of an Example, computed from its values without serializing it.

Planning needs each record's exact size, not its bytes: `recordforge plan` sizes image
records this way instead of serializing each one. The size is a sum over protobuf's wire
format (see schemas/spliced.py for the layout), which does not depend on the order protobuf
writes the map entries in. tests/test_example_size.py checks it against `codec.serialize`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

FeatureValues = tuple[str, Sequence]  # (dtype, values), as codec.build_example takes them


def varint_size(value: int) -> int:
    """Bytes protobuf's varint encoding of `value` takes (a negative int64 takes ten)."""
    if value < 0:
        return 10
    return max(1, (value.bit_length() + 6) // 7)


def example_size(
    features: Mapping[str, FeatureValues], blobs: Mapping[str, int] | None = None
) -> int:
    """`len(codec.serialize(codec.build_example(features)))`, without building it.

    Args:
        features: {key: (dtype, values)}.
        blobs: {key: n}, more features that each hold one bytes value of n bytes (an image
            file's, say), so the value itself is not needed; keys distinct from `features`'.

    Raises:
        ValueError: a dtype other than bytes, int64 or float.
    """
    entries = 0
    for key, (dtype, values) in features.items():
        # All an entry's size depends on: the lengths of bytes, the values of int64s, the count
        # of floats.
        if dtype == "bytes":
            shape: tuple | int = tuple(map(len, values))
        elif dtype == "int64":
            shape = tuple(values)
        else:
            shape = len(values)
        entries += _entry_size(key, dtype, shape)
    for key, length in (blobs or {}).items():
        entries += _entry_size(key, "bytes", (length,))
    return _delimited(entries) if features or blobs else 0


def scalar_example_sizes(
    features: Mapping[str, tuple[str, np.ndarray]],
    count: int,
    present: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """`example_size` of `count` Examples at once, each feature holding one value.

    What `plan` needs for a batch of image records: array operations instead of a call per
    record. Record i's Example holds every key of `features` (but those `present[key][i]`
    marks absent), each with one value.

    Args:
        features: {key: (dtype, column)}, `column` one int per record: the value for "int64",
            the value's length in bytes for "bytes", ignored for "float".
        count: the number of records (the columns' length).
        present: {key: bool column} for the keys some records lack.

    Returns:
        An int64 array of `count` sizes (0 for a record without any feature).

    Raises:
        ValueError: a dtype other than bytes, int64 or float.
    """
    if not features:
        return np.zeros(count, dtype=np.int64)
    # One row per feature, so each step below is one array operation for the whole batch.
    dtypes = [dtype for dtype, _ in features.values()]
    for key, dtype in zip(features, dtypes, strict=True):
        if dtype not in ("bytes", "int64", "float"):
            raise ValueError(f"feature {key!r}: unknown dtype {dtype!r}")
    columns = np.array([column for _, column in features.values()], dtype=np.int64)
    columns = columns.reshape(len(features), count)
    is_bytes = np.array([dtype == "bytes" for dtype in dtypes])[:, None]
    is_int64 = np.array([dtype == "int64" for dtype in dtypes])[:, None]
    # The value list's body: the bytes, delimited; the int64's varint, in a delimited packed
    # list (its length, at most 10, is a one-byte varint); a float's 4 bytes, the same.
    values = varint_sizes(columns)
    body = np.where(is_bytes, 1 + values + columns, np.where(is_int64, 2 + values, 6))
    feature = _delimited_sizes(_delimited_sizes(body))  # in its list, in the Feature
    key_sizes = np.array([[_delimited(len(key.encode("utf-8")))] for key in features])
    entries = _delimited_sizes(key_sizes + feature)
    if present:
        held = np.ones((len(features), count), dtype=bool)
        for row, key in enumerate(features):
            if key in present:
                held[row] = present[key]
        entries = np.where(held, entries, 0)
        holds_any = held.any(axis=0)
    else:
        holds_any = np.ones(count, dtype=bool)
    return np.where(holds_any, _delimited_sizes(entries.sum(axis=0)), 0)


# The smallest values whose varint takes 2, 3, ... 9 bytes.
_VARINT_STEPS = np.array([1 << bits for bits in range(7, 63, 7)], dtype=np.int64)


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """`varint_size` of each int64 value, as an int64 array."""
    values = np.asarray(values, dtype=np.int64)
    sizes = 1 + np.searchsorted(_VARINT_STEPS, values, side="right")
    return np.where(values < 0, 10, sizes)


def _delimited_sizes(lengths: np.ndarray) -> np.ndarray:
    """`_delimited` of each length."""
    return 1 + varint_sizes(lengths) + lengths


# Records repeat the same keys with few distinct value sizes: entry sizes are worth keeping.
@functools.lru_cache(maxsize=1 << 16)
def _entry_size(key: str, dtype: str, shape: tuple | int) -> int:
    """One map entry of Features: the key, then the Feature (`shape` as in example_size)."""
    if dtype == "bytes":
        body = sum(_delimited(length) for length in shape)
    elif dtype == "int64":
        body = _delimited(sum(varint_size(value) for value in shape)) if shape else 0
    elif dtype == "float":
        body = _delimited(4 * shape) if shape else 0
    else:
        raise ValueError(f"feature {key!r}: unknown dtype {dtype!r}")
    feature = _delimited(body)  # the Feature's one set field: its BytesList, Int64List, ...
    return _delimited(_delimited(len(key.encode("utf-8"))) + _delimited(feature))


def _delimited(length: int) -> int:
    """A one-byte tag, the length as a varint, and `length` bytes."""
    return 1 + varint_size(length) + length
