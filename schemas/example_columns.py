"""Columnar Example encoding: the Example bytes of many rows from arrays, without a loop per cell.

Protobuf's wire format is simple enough to write column by column. An Example is

    Example   = 0x0A len(Features) Features               (nothing at all when it has no feature)
    Features  = one map entry per feature, in upb's key order (see _map_order)
    entry     = 0x0A len(body) body
    body      = 0x0A len(key) key 0x12 len(Feature) Feature
    Feature   = tag len(List) List        tag: 0x0A bytes_list, 0x12 float_list, 0x1A int64_list
    List      = bytes: (0x0A len(value) value) per value
                float, int64: 0x0A len(packed) packed, or nothing for an empty list
    packed    = little-endian float32s, or varints (two's complement: 10 bytes when negative)

with every length a varint. Each column's entries are computed with numpy (lengths, varint
digits) and pyarrow (joining byte strings row-wise), so the cost per cell is a few machine
instructions instead of a Python call. The bytes are exactly `codec.serialize` of
`codec.build_example` with the same features (tests/test_example_columns.py checks that).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.schemas import codec

_KIND_TAGS = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}
_FIELD_ONE = 0x0A  # field 1, length-delimited: every nesting level above uses it
_MAP_VALUE = 0x12  # field 2 of a map entry: the Feature
# A value needs k+1 varint bytes when it is at least 2^(7k).
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)
_NO_SEPARATOR = pa.scalar(b"", pa.binary())
# pa.binary()'s offsets are int32: a larger array's would wrap.
_MAX_BINARY_BYTES = int(np.iinfo(np.int32).max)


@dataclass(frozen=True)
class FeatureColumn:
    """One feature's values for every row of a batch.

    Attributes:
        key: the feature key.
        dtype: "int64", "float" or "bytes".
        values: int64, float64 (written as float32) or binary array for a scalar feature; a
            list array of those for a list feature. A null means the row lacks the feature.
        default: when not None, rows where `values` is null get these values instead.
    """

    key: str
    dtype: str
    values: pa.Array
    default: Sequence | None = None


@dataclass(frozen=True)
class EncodedExamples:
    """The Examples of a batch of rows.

    Attributes:
        sizes: the serialized size of each row's Example (int64).
        counts: (rows, columns) int64: how many values each row has of each column's feature,
            -1 when it lacks the feature; columns in the order given.
        examples: the serialized Examples (binary array), or None when only sizes were asked for.
    """

    sizes: np.ndarray
    counts: np.ndarray
    examples: pa.Array | None


def encode_examples(
    columns: Sequence[FeatureColumn], num_rows: int, *, with_bytes: bool = True
) -> EncodedExamples:
    """Serialize one Example per row holding the given features.

    Args:
        columns: the features, each with `num_rows` values; their keys must differ.
        num_rows: how many rows (needed when there are no columns).
        with_bytes: False to compute only sizes and counts (planning), which is cheaper.

    Returns:
        Sizes, value counts and (with_bytes) the bytes of each row's Example.
    """
    for column in columns:
        if len(column.values) != num_rows:
            raise ValueError(
                f"feature {column.key!r}: {len(column.values)} values, {num_rows} rows"
            )
    counts = np.empty((num_rows, len(columns)), dtype=np.int64)
    if num_rows == 0:
        empty = pa.array([], pa.binary()) if with_bytes else None
        return EncodedExamples(np.zeros(0, dtype=np.int64), counts, empty)
    entries: list[tuple[str, _Entries]] = []
    for index, column in enumerate(columns):
        encoded = _encode_column(column, with_bytes)
        counts[:, index] = encoded.counts
        entries.append((column.key, encoded))
    features_length = np.zeros(num_rows, dtype=np.uint64)
    for _, encoded in entries:
        features_length += encoded.lengths
    # An Example without features serializes to nothing, not to an empty Features message.
    nonempty = (features_length > 0).astype(np.uint64)
    tag, digits = _constant(num_rows, bytes([_FIELD_ONE])), _varint(features_length)
    header, header_lengths = _pieces(
        num_rows, [(tag[0], tag[1] * nonempty), (digits[0], digits[1] * nonempty)]
    )
    sizes = (header_lengths + features_length).astype(np.int64)
    examples = None
    if with_bytes:
        parts = [_binary(header, header_lengths, header_lengths.shape[0])]
        ordered = sorted(entries, key=lambda item: _map_order(item[0]))
        for _, encoded in ordered:
            parts += encoded.parts
        examples = pc.binary_join_element_wise(*parts, _NO_SEPARATOR, null_handling="skip")
    return EncodedExamples(sizes=sizes, counts=counts, examples=examples)


@functools.cmp_to_key
def _map_order(a: str, b: str) -> int:
    """The order of protobuf's (upb's) deterministic map serialization for string keys: bytewise
    over the common length, then the LONGER key first ("ab" before "a")."""
    x, y = a.encode("utf-8"), b.encode("utf-8")
    common = min(len(x), len(y))
    if x[:common] != y[:common]:
        return -1 if x[:common] < y[:common] else 1
    return len(y) - len(x)


@dataclass(frozen=True)
class _Entries:
    lengths: np.ndarray  # uint64 bytes of each row's map entry (0 when absent)
    counts: np.ndarray  # int64 values per row, -1 when absent
    # The entries, as arrays to join row-wise (all null where absent); None without bytes.
    parts: list[pa.Array] | None


def _encode_column(column: FeatureColumn, with_bytes: bool) -> _Entries:
    values = column.values
    n = len(values)
    present = _valid(values)
    if isinstance(values.type, pa.ListType | pa.LargeListType):
        list_length, counts, tail, payload = _list_body(column.dtype, values, present, with_bytes)
    else:
        list_length, counts, tail, payload = _scalar_body(column.dtype, values, with_bytes)
    key = column.key.encode("utf-8")
    key_head = bytes([_FIELD_ONE]) + _varint_bytes(len(key)) + key + bytes([_MAP_VALUE])
    # Each length's varint size is computed once: it serves the size above and the bytes.
    list_digits = _varint_length(list_length)
    feature_length = 1 + list_digits + list_length
    feature_digits = _varint_length(feature_length)
    body_length = len(key_head) + feature_digits + feature_length
    body_digits = _varint_length(body_length)
    lengths = 1 + body_digits + body_length
    lengths = np.where(present, lengths, 0).astype(np.uint64)
    counts = np.where(present, counts, -1)
    parts = None
    if with_bytes:
        head, head_lengths = _pieces(
            n,
            [
                _constant(n, bytes([_FIELD_ONE])),
                _varint(body_length, body_digits),
                _constant(n, key_head),
                _varint(feature_length, feature_digits),
                _constant(n, bytes([_KIND_TAGS[column.dtype]])),
                _varint(list_length, list_digits),
                *tail,
            ],
        )
        # The payload (null where absent, as the head is) stays a separate part of the final
        # join: joining it to the head here would copy every value once more.
        parts = [_binary(head, head_lengths, n, present)]
        if payload is not None:
            parts.append(payload)
    if column.default is not None and not present.all():
        default_entry = _default_entry(column)
        missing = ~present
        lengths = np.where(missing, len(default_entry), lengths).astype(np.uint64)
        counts = np.where(missing, len(column.default), counts)
        if parts is not None:
            # Absent rows take the default entry whole, so the parts must be joined first.
            joined = parts[0]
            if len(parts) > 1:
                joined = pc.binary_join_element_wise(*parts, _NO_SEPARATOR)
            parts = [pc.fill_null(joined, pa.scalar(default_entry, pa.binary()))]
    return _Entries(lengths=lengths, counts=counts, parts=parts)


def _scalar_body(dtype: str, values: pa.Array, with_bytes: bool):
    """(List length, counts, header pieces after the List's length, payload) of scalars."""
    n = len(values)
    counts = np.ones(n, dtype=np.int64)
    if dtype == "bytes":
        value_lengths = _binary_lengths(values)
        value_digits = _varint_length(value_lengths)
        list_length = 1 + value_digits + value_lengths
        tail = []
        if with_bytes:
            tail = [_constant(n, bytes([_FIELD_ONE])), _varint(value_lengths, value_digits)]
        return list_length, counts, tail, values if with_bytes else None
    if dtype == "float":
        packed = (_float32_bytes(values), np.full(n, 4, dtype=np.uint64))
    elif dtype == "int64":
        packed = _varint(_int64_as_uint64(values))
    else:
        raise ValueError(f"unknown dtype {dtype!r}")
    packed_length = packed[1]
    packed_digits = _varint_length(packed_length)
    list_length = 1 + packed_digits + packed_length
    tail = []
    if with_bytes:
        tail = [_constant(n, bytes([_FIELD_ONE])), _varint(packed_length, packed_digits), packed]
    return list_length, counts, tail, None


def _list_body(dtype: str, values: pa.Array, present: np.ndarray, with_bytes: bool):
    """(List length, counts, header pieces after the List's length, payload) of lists."""
    n = len(values)
    counts = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
    counts = counts.astype(np.int64)
    elements = values.flatten()  # leaves out what null lists may hide
    row_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=row_offsets[1:])
    if dtype == "bytes":
        element_lengths = _binary_lengths(elements)
        element_digits = _varint_length(element_lengths)
        element_heads = [
            _constant(len(elements), bytes([_FIELD_ONE])),
            _varint(element_lengths, element_digits),
        ]
        element_sizes = 1 + element_digits + element_lengths
        list_length = _row_sums(element_sizes, row_offsets)
        payload = None
        if with_bytes:
            heads, head_lengths = _pieces(len(elements), element_heads)
            joined = pc.binary_join_element_wise(
                _binary(heads, head_lengths, len(elements)),
                elements,
                _NO_SEPARATOR,
            )
            payload = _regroup(joined, list_length, present)
        return list_length, counts, [], payload
    if dtype == "float":
        element_bytes = (_float32_bytes(elements), np.full(len(elements), 4, dtype=np.uint64))
    elif dtype == "int64":
        element_bytes = _varint(_int64_as_uint64(elements))
    else:
        raise ValueError(f"unknown dtype {dtype!r}")
    packed_length = _row_sums(element_bytes[1], row_offsets)
    nonempty = counts > 0
    packed_digits = _varint_length(packed_length)
    list_length = np.where(nonempty, 1 + packed_digits + packed_length, 0)
    list_length = list_length.astype(np.uint64)
    tail, payload = [], None
    if with_bytes:
        field = _constant(n, bytes([_FIELD_ONE]))
        digits = _varint(packed_length, packed_digits)
        # An empty packed list writes no field at all.
        tail = [(field[0], field[1] * nonempty), (digits[0], digits[1] * nonempty)]
        data, _ = _pieces(len(elements), [element_bytes])
        payload = _binary(data, packed_length, n, present)
    return list_length, counts, tail, payload


# --- numpy helpers: a "piece" is (matrix of bytes (rows, width), used bytes per row) ---


def _varint_length(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.uint64)
    lengths = np.ones(len(values), dtype=np.uint64)
    if not len(values):
        return lengths
    # One comparison over the column per byte its largest value needs beyond the first (most
    # columns need none or one), rather than a binary search per value.
    wider = int(np.searchsorted(_VARINT_STEPS, values.max(), side="right"))
    for step in _VARINT_STEPS[:wider]:
        lengths += values >= step
    return lengths


def _varint(values: np.ndarray, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The varint bytes of unsigned 64-bit values, as a piece (`lengths`: their
    `_varint_length`, when already known)."""
    values = np.asarray(values, dtype=np.uint64)
    if lengths is None:
        lengths = _varint_length(values)
    width = int(lengths.max()) if len(values) else 1
    if width == 1:
        return values.astype(np.uint8).reshape(-1, 1), lengths
    # One byte column at a time: 7 bits of the value, and the high bit when more bytes follow.
    # (A (rows, width) uint64 broadcast does the same with ~4x the memory traffic.)
    digits = np.empty((len(values), width), dtype=np.uint8)
    rest = values.copy()
    for k in range(width):
        digit = (rest & np.uint64(0x7F)).astype(np.uint8)
        digit |= (lengths > np.uint64(k + 1)).view(np.uint8) << np.uint8(7)
        digits[:, k] = digit
        rest >>= np.uint64(7)
    return digits, lengths


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _constant(rows: int, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    matrix = np.broadcast_to(np.frombuffer(data, dtype=np.uint8), (rows, len(data)))
    return matrix, np.full(rows, len(data), dtype=np.uint64)


def _pieces(rows: int, pieces) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate pieces row-wise: (all bytes, row after row), bytes per row)."""
    total = np.zeros(rows, dtype=np.uint64)
    width = sum(matrix.shape[1] for matrix, _ in pieces)
    matrix = np.empty((rows, width), dtype=np.uint8)
    used = None  # which bytes of `matrix` rows use; None while all of them
    column = 0
    for piece, lengths in pieces:
        total += lengths
        piece_width = piece.shape[1]
        if not piece_width:
            continue
        matrix[:, column : column + piece_width] = piece
        if rows and lengths.min() != piece_width:  # ragged: some rows use fewer bytes
            if used is None:
                used = np.ones((rows, width), dtype=bool)
            used[:, column : column + piece_width] = _widths(piece_width) < lengths[:, None]
        column += piece_width
    # Rows using every byte need no compaction (the common case); else one pass drops the rest.
    return (matrix.ravel() if used is None else matrix[used]), total


def _widths(width: int) -> np.ndarray:
    """0, 1, ... width - 1 as uint64: compared with uint64 lengths without a cast to float."""
    return np.arange(width, dtype=np.uint64)


def _binary(
    data: np.ndarray, lengths: np.ndarray, rows: int, valid: np.ndarray | None = None
) -> pa.Array:
    """A binary array over bytes laid out row after row, `lengths` of them per row."""
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths.astype(np.int64), out=offsets[1:])
    if offsets[-1] > _MAX_BINARY_BYTES:
        raise ValueError(
            f"{int(offsets[-1]):,} bytes in one column of one batch: a binary array holds at "
            f"most {_MAX_BINARY_BYTES:,}; encode fewer rows at a time"
        )
    buffers = [
        None,
        pa.py_buffer(offsets.astype(np.int32)),
        pa.py_buffer(np.ascontiguousarray(data)),
    ]
    null_count = 0
    if valid is not None and not valid.all():
        buffers[0] = pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = int(rows - valid.sum())
    return pa.Array.from_buffers(pa.binary(), rows, buffers, null_count=null_count)


def _regroup(elements: pa.Array, row_lengths: np.ndarray, present: np.ndarray) -> pa.Array:
    """Rows made of consecutive elements (already back to back), `row_lengths` bytes each."""
    elements = elements.cast(pa.binary())
    offsets = np.frombuffer(elements.buffers()[1], dtype=np.int32)[elements.offset :]
    start = int(offsets[0]) if len(offsets) else 0
    data = elements.buffers()[2]
    total = int(row_lengths.sum())
    raw = (
        np.frombuffer(data, dtype=np.uint8)[start : start + total]
        if data
        else np.zeros(0, np.uint8)
    )
    return _binary(raw, row_lengths, len(row_lengths), present)


def _row_sums(per_element: np.ndarray, row_offsets: np.ndarray) -> np.ndarray:
    cumulative = np.zeros(len(per_element) + 1, dtype=np.uint64)
    np.cumsum(per_element.astype(np.uint64), out=cumulative[1:])
    return cumulative[row_offsets[1:]] - cumulative[row_offsets[:-1]]


def _valid(values: pa.Array) -> np.ndarray:
    if values.null_count == 0:
        return np.ones(len(values), dtype=bool)
    return values.is_valid().to_numpy(zero_copy_only=False)


def _binary_lengths(values: pa.Array) -> np.ndarray:
    lengths = pc.fill_null(pc.binary_length(values), 0)
    return lengths.to_numpy(zero_copy_only=False).astype(np.uint64)


def _int64_as_uint64(values: pa.Array) -> np.ndarray:
    filled = pc.fill_null(values, 0).cast(pa.int64())
    return filled.to_numpy(zero_copy_only=False).view(np.uint64)


def _float32_bytes(values: pa.Array) -> np.ndarray:
    filled = pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False)
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, as protobuf does
        single = filled.astype("<f4")
    return single.view(np.uint8).reshape(len(filled), 4)


def _default_entry(column: FeatureColumn) -> bytes:
    """The map entry of the default values, taken from the codec's own serialization."""
    data = codec.serialize(codec.build_example({column.key: (column.dtype, column.default)}))
    # data = 0x0A varint(len) entry: skip the tag and the varint.
    position = 1
    while data[position] & 0x80:
        position += 1
    return data[position + 1 :]
