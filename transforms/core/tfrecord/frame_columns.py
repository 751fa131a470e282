"""TFRecord framing of a column of records at once: a table's shard (and its index) is written
in bulk.

`frame_in_order(records, order)` gives the same bytes as `frame_record` of each record, in the
given order, concatenated, but builds them with array operations: only each record's CRC takes a
call per record. The records are not sorted first: each piece of the output (a record's 12-byte
header, the record, its 4-byte footer) is described by an Arrow binary *view* (a length, then the
bytes themselves when at most 12, else which buffer and where), in output order, and casting the
views to a plain binary array copies every record once, straight into its place in the shard.
Sorting the records and then joining them with their framing would copy each twice.
"""

from __future__ import annotations

from collections.abc import Iterator

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.transforms.core.tfrecord.framing import FRAMING_BYTES

_MASK_DELTA = np.uint32(0xA282EAD8)
_INT32_MAX = 2**31 - 1
_INLINE = 12  # a binary view holds at most this many bytes itself
_VIEW = 16  # bytes per binary view


def frame_binary_array(records: pa.Array | pa.ChunkedArray) -> pa.Buffer:
    """The records of a binary array (no nulls), each in TFRecord framing, concatenated."""
    whole = max(len(records), 1)
    buffers = list(frame_in_order(records, np.arange(len(records)), whole, buffer_bytes=2**62))
    return buffers[0] if buffers else pa.py_buffer(b"")


# A buffer of framed records holds at most this many bytes, unless one record alone is more:
# a shard of large records (Examples holding images) is not copied whole into one buffer.
BUFFER_BYTES = 16 << 20


def frame_in_order(
    records: pa.Array | pa.ChunkedArray,
    order: np.ndarray,
    per_buffer: int,
    buffer_bytes: int = BUFFER_BYTES,
) -> Iterator[pa.Buffer]:
    """`records[order[0]]`, `records[order[1]]`, ... (binary, no nulls), each in TFRecord
    framing, concatenated; as buffers of at most `per_buffer` records and `buffer_bytes` bytes
    (or one record) each. How they are cut does not change the bytes."""
    chunks = _binary_chunks(records)
    if not chunks:
        return
    views = np.concatenate([_record_views(chunk, number) for number, chunk in enumerate(chunks)])
    lengths = views.view("<i4")[:, 1, 0].astype(np.int64)  # a record's view starts with it
    data = [c.buffers()[2] or pa.py_buffer(b"") for c in chunks]
    order = np.asarray(order, dtype=np.int64)
    first = 0
    while first < len(order):
        taken = order[first : first + per_buffer]
        framed_sizes = np.cumsum(lengths[taken] + FRAMING_BYTES)
        count = max(int(np.searchsorted(framed_sizes, buffer_bytes, side="right")), 1)
        taken = taken[:count]
        first += count
        total = int(framed_sizes[count - 1])
        # Framed records beyond int32 offsets are copied out as large_binary.
        binary_type = pa.large_binary() if total > _INT32_MAX else pa.binary()
        pieces = pa.Array.from_buffers(
            pa.binary_view(), 3 * count, [None, pa.py_buffer(views[taken]), *data]
        )
        framed = pieces.cast(binary_type)
        bounds = _offsets(framed)
        yield framed.buffers()[2].slice(int(bounds[0]), int(bounds[-1] - bounds[0]))


def record_lengths(records: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The length of each record of a binary array (no nulls), int64."""
    return pc.binary_length(records).to_numpy().astype(np.int64)


def index_lines(lengths: np.ndarray) -> pa.Buffer:
    """The index of a shard holding records of these lengths, framed back to back from its
    start: "offset length\\n" per record, in decimal; the index DALI and the `tfrecord`
    package read."""
    framed = np.asarray(lengths, dtype=np.int64) + FRAMING_BYTES
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


def _binary_chunks(records: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    """The non-empty chunks of the records as binary arrays: a view addresses its bytes by an
    int32 offset, so a large_binary chunk is cut into pieces of less than 2 GiB each."""
    chunks = records.chunks if isinstance(records, pa.ChunkedArray) else [records]
    out = []
    for chunk in chunks:
        if chunk.null_count:
            raise ValueError("a record to frame is null")
        if chunk.type == pa.binary():
            out += [chunk] if len(chunk) else []
            continue
        offsets = _offsets(chunk)
        first = 0
        while first < len(chunk):
            # The records from `first` whose bytes end within int32 reach of its start.
            reach = int(np.searchsorted(offsets, offsets[first] + _INT32_MAX, side="right"))
            last = min(max(reach - 1, first + 1), len(chunk))
            # Built here rather than cast: a cast keeps the original (int64) offsets' values.
            start, end = int(offsets[first]), int(offsets[last])
            if end - start > _INT32_MAX:  # one record alone; protobuf refuses 2 GiB anyway
                raise ValueError(f"a record of {end - start} bytes is too large to frame")
            part_offsets = (offsets[first : last + 1] - start).astype(np.int32)
            data = (chunk.buffers()[2] or pa.py_buffer(b"")).slice(start, end - start)
            out.append(
                pa.Array.from_buffers(
                    pa.binary(), last - first, [None, pa.py_buffer(part_offsets), data]
                )
            )
            first = last
    return out


def _record_views(chunk: pa.Array, buffer_number: int) -> np.ndarray:
    """(records, 3 views, 16 bytes): each record's header, the record (in data buffer
    `buffer_number`) and its footer, as binary views.

    A view is its length (int32), then, up to 12 bytes, the bytes themselves; longer, their
    first 4 bytes, the buffer's number and the offset in it (int32 each).
    """
    count = len(chunk)
    offsets = _offsets(chunk).astype(np.int64)
    lengths = np.diff(offsets)
    views = np.zeros((count, 3, _VIEW), np.uint8)
    fields = views.view("<i4").reshape(count, 3, 4)
    fields[:, 0, 0] = _INLINE  # the header: length (8 bytes), its masked CRC (4)
    views[:, 0, 4:12] = lengths.astype("<u8").view(np.uint8).reshape(count, 8)
    fields[:, 0, 3] = _mask(_length_crcs(lengths.astype("<u8"))).view("<i4")
    # The footer: the record's masked CRC. One call a record (google-crc32c has no batch call);
    # it reads the chunk, so that reading each record's prefix next finds it in cache.
    crcs = np.fromiter(map(google_crc32c.value, chunk.to_pylist()), np.uint32, count)
    fields[:, 2, 0] = 4
    fields[:, 2, 1] = _mask(crcs).view("<i4")
    fields[:, 1, 0] = lengths
    fields[:, 1, 2] = buffer_number
    fields[:, 1, 3] = offsets[:-1]
    data = chunk.buffers()[2]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    if len(raw) >= 4:  # every record's first 4 bytes (a short record's are redone below)
        prefix_starts = np.minimum(offsets[:-1], len(raw) - 4)
        views[:, 1, 4:8] = np.lib.stride_tricks.sliding_window_view(raw, 4)[prefix_starts]
    short = np.flatnonzero(lengths <= _INLINE)
    if len(short):  # rare (an empty Example): held inline, byte by byte, zeros after
        positions = offsets[short, None] + np.arange(_INLINE)
        inside = positions < offsets[short + 1, None]
        inline = raw[np.minimum(positions, len(raw) - 1)] if len(raw) else 0
        views[short, 1, 4:] = np.where(inside, inline, 0)
    return views


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
