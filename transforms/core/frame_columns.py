"""TFRecord framing of a column of records at once: a table's shard is written in bulk.

`frame_binary_array(array)` gives the same bytes as `frame_records(array.to_pylist())`, but
builds them with array operations: only each record's CRC takes a call per record, and the
framed records are assembled by one element-wise join instead of a Python list of parts.
"""

from __future__ import annotations

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.core.tfrecord import masked_crc32c

_MASK_DELTA = np.uint32(0xA282EAD8)


def frame_binary_array(records: pa.Array) -> pa.Buffer:
    """The records of a binary array (no nulls), each in TFRecord framing, concatenated."""
    if records.null_count:
        raise ValueError("a record to frame is null")
    count = len(records)
    if not count:
        return pa.py_buffer(b"")
    records = records.cast(pa.large_binary())  # int64 offsets: framed bytes may pass 2 GiB
    offsets = np.frombuffer(records.buffers()[1], np.int64, count + 1, records.offset * 8)
    lengths = np.diff(offsets).astype("<u8")
    # Records of a table have few distinct lengths: each length's CRC is computed once.
    distinct, which = np.unique(lengths, return_inverse=True)
    length_crcs = np.array([masked_crc32c(n.tobytes()) for n in distinct], "<u4")[which]
    data_crcs = _mask(np.fromiter(map(google_crc32c.value, records.to_pylist()), np.uint32, count))
    heads = np.empty((count, 12), np.uint8)
    heads[:, :8] = lengths.view(np.uint8).reshape(count, 8)
    heads[:, 8:] = length_crcs.view(np.uint8).reshape(count, 4)
    tails = data_crcs.astype("<u4").view(np.uint8)
    framed = pc.binary_join_element_wise(
        _fixed_width(heads.reshape(-1), 12, count),
        records,
        _fixed_width(tails, 4, count),
        pa.scalar(b"", pa.large_binary()),
    )
    _, framed_offsets, data = framed.buffers()
    bounds = np.frombuffer(framed_offsets, np.int64, count + 1, framed.offset * 8)
    return data.slice(int(bounds[0]), int(bounds[-1] - bounds[0]))


def _mask(crcs: np.ndarray) -> np.ndarray:
    """TFRecord's masking of CRCs (rotate right by 15, add a constant), element-wise."""
    return ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + _MASK_DELTA


def _fixed_width(data: np.ndarray, width: int, count: int) -> pa.Array:
    """`count` values of `width` bytes each, laid end to end in `data`, as a large_binary array."""
    offsets = np.arange(0, (count + 1) * width, width, dtype=np.int64)
    return pa.Array.from_buffers(
        pa.large_binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
