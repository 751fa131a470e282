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
    present = present or {}
    entries = np.zeros(count, dtype=np.int64)
    holds_any = np.zeros(count, dtype=bool)
    for key, (dtype, column) in features.items():
        column = np.asarray(column, dtype=np.int64)
        if dtype == "bytes":
            body = _delimited_sizes(column)
        elif dtype == "int64":
            body = _delimited_sizes(varint_sizes(column))
        elif dtype == "float":
            body = np.full(count, _delimited(4), dtype=np.int64)
        else:
            raise ValueError(f"feature {key!r}: unknown dtype {dtype!r}")
        key_size = _delimited(len(key.encode("utf-8")))
        entry = _delimited_sizes(key_size + _delimited_sizes(_delimited_sizes(body)))
        mask = present.get(key)
        if mask is None:
            entries += entry
            holds_any[:] = True
        else:
            entries += np.where(mask, entry, 0)
            holds_any |= mask
    return np.where(holds_any, _delimited_sizes(entries), 0)


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """`varint_size` of each int64 value, as an int64 array."""
    values = np.asarray(values, dtype=np.int64)
    sizes = np.ones(values.shape, dtype=np.int64)
    for bits in range(7, 63, 7):  # one more byte from each of 2**7, 2**14, ... 2**56 on
        sizes += values >= (1 << bits)
    sizes[values < 0] = 10
    return sizes


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
