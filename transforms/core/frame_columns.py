"""TFRecord framing of a column of records at once: a table's shard (and its index) is written
in bulk.

`frame_binary_array(array)` gives the same bytes as `frame_record` of each record, concatenated, but
builds them with array operations: only each record's CRC takes a call per record, and the
framed records are assembled by one element-wise join instead of a Python list of parts.
"""

from __future__ import annotations

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.core.tfrecord import FRAMING_BYTES

_MASK_DELTA = np.uint32(0xA282EAD8)
_INT32_MAX = 2**31 - 1


def frame_binary_array(records: pa.Array) -> pa.Buffer:
    """The records of a binary array (no nulls), each in TFRecord framing, concatenated."""
    if records.null_count:
        raise ValueError("a record to frame is null")
    count = len(records)
    if not count:
        return pa.py_buffer(b"")
    offsets = _offsets(records)
    if int(offsets[-1] - offsets[0]) + FRAMING_BYTES * count > _INT32_MAX:
        records = records.cast(pa.large_binary())  # framed, they pass int32 offsets
    binary_type = records.type
    lengths = np.diff(offsets).astype("<u8")
    heads = np.empty((count, 12), np.uint8)
    heads[:, :8] = lengths.view(np.uint8).reshape(count, 8)
    heads[:, 8:] = _mask(_length_crcs(lengths)).astype("<u4").view(np.uint8).reshape(count, 4)
    data_crcs = np.fromiter(map(google_crc32c.value, records.to_pylist()), np.uint32, count)
    tails = _mask(data_crcs).astype("<u4").view(np.uint8)
    framed = pc.binary_join_element_wise(
        _fixed_width(heads.reshape(-1), 12, count, binary_type),
        records,
        _fixed_width(tails, 4, count, binary_type),
        pa.scalar(b"", binary_type),
    )
    bounds = _offsets(framed)
    return framed.buffers()[2].slice(int(bounds[0]), int(bounds[-1] - bounds[0]))


def index_lines(records: pa.Array) -> pa.Buffer:
    """The index of a shard holding `records` (a binary array), framed back to back from its
    start: "offset length\\n" per record, in decimal; the index DALI and the `tfrecord`
    package read."""
    framed = np.diff(_offsets(records)).astype(np.int64) + FRAMING_BYTES
    starts = np.cumsum(framed) - framed
    lines = pc.binary_join_element_wise(
        pa.array(starts).cast(pa.string()),
        pa.scalar(" "),
        pa.array(framed).cast(pa.string()),
        pa.scalar("\n"),
        pa.scalar(""),
    )
    bounds = _offsets(lines)
    return lines.buffers()[2].slice(int(bounds[0]), int(bounds[-1] - bounds[0]))


def _offsets(array: pa.Array) -> np.ndarray:
    """The value offsets of a binary or large_binary array (its own slice of them)."""
    width = np.int64 if array.type == pa.large_binary() else np.int32
    size = np.dtype(width).itemsize
    return np.frombuffer(array.buffers()[1], width, len(array) + 1, array.offset * size)


def _length_crcs(lengths: np.ndarray) -> np.ndarray:
    """The CRC32C of each record's 8-byte length field.

    A table's records have few distinct lengths, so each distinct one takes a call.
    """
    distinct, where = np.unique(lengths, return_inverse=True)
    crcs = np.fromiter(
        (google_crc32c.value(length.tobytes()) for length in distinct), np.uint32, len(distinct)
    )
    return crcs[where]


def _mask(crcs: np.ndarray) -> np.ndarray:
    """TFRecord's masking of CRCs (rotate right by 15, add a constant), element-wise."""
    return ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + _MASK_DELTA


def _fixed_width(data: np.ndarray, width: int, count: int, binary_type: pa.DataType) -> pa.Array:
    """`count` values of `width` bytes each, laid end to end in `data`, as a binary array."""
    offset_type = np.int64 if binary_type == pa.large_binary() else np.int32
    offsets = np.arange(0, (count + 1) * width, width, dtype=offset_type)
    return pa.Array.from_buffers(
        binary_type, count, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
