"""Splitting one CSV file into byte ranges of whole records, so that several workers read it.

A range may start only where a record starts: a line break outside quotes, which only a reading
from the file's start can tell (a quoted cell may hold line breaks). So the file is read once,
sequentially, through the CsvScanner that the reader itself uses (memchr-speed byte counts and
numpy passes over the quotes; no parsing, no encoding), which notes a cut every `range_bytes`
or so and how many records come before each cut. Each range is then read on its own: it starts
with its first row's number, the file's offsets and the scanner's state at its start, so its
rows, numbers, errors and messages are those a reading of the whole file gives.

A file is not split, and is read whole as before (WHOLE), when splitting could change what its
reading gives: a gzip file (a compressed stream cannot be entered at a byte offset); a file no
larger than one range; a header that is not the schema's or cannot be read (the whole file is
then one error record); a file that cannot be read to its end (a failing stream, a record
larger than the limit, a quote never closed: the run fails, with the message a whole reading
gives). A cut is never placed between a `\\r` and a `\\n`, nor before bytes that look like a
byte order mark (pyarrow skips one at the start of its input).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import BinaryIO, NamedTuple

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.tables.scan import CsvScanner, first_record
from recordforge.transforms.core.tables.stream import (
    MAX_RECORD_BYTES,
    header_names,
    read_stream_piece,
)

_LF, _CR = 0x0A, 0x0D
_BOM = b"\xef\xbb\xbf"
# The most read at a time while splitting: the scanner finds a cut after each read, so a range
# overshoots its size by up to this (reads are smaller for small ranges).
_READ_BYTES = 4 << 20


class CsvRange(NamedTuple):
    """A part of a CSV file, read by one task.

    Attributes:
        start: the offset of its first byte (a record's start, or 0).
        end: the offset just past its last byte (a record's end); -1: the file's end, for a
            file read whole (WHOLE).
        first_row: the data row number of its first record (1-based, the header not counted).
        rows: the data rows it holds, as the splitting counted them (-1 when read whole).
        previous: the byte just before `start` (a line break), -1 at the file's start.
        header_fields: the number of fields in the file's header, for a range after the
            header (0 for a range that starts with it).
        stored_size: the file's size when it was split (-1 when read whole).
    """

    start: int = 0
    end: int = -1
    first_row: int = 1
    rows: int = -1
    previous: int = -1
    header_fields: int = 0
    stored_size: int = -1

    @property
    def whole(self) -> bool:
        return self.end < 0

    @property
    def has_header(self) -> bool:
        return self.start == 0

    def describe(self) -> str:
        if self.whole:
            return "the whole file"
        return f"bytes {self.start:,} to {self.end:,} (rows {self.first_row:,} on)"


WHOLE = CsvRange()


def split_csv(
    stream: BinaryIO,
    *,
    delimiter: str,
    header: Sequence[str],
    range_bytes: int,
    stored_size: int,
    max_record_bytes: int = MAX_RECORD_BYTES,
    count_multiple: int = 1,
) -> tuple[CsvRange, ...]:
    """The ranges of an uncompressed CSV file, about `range_bytes` each, in file order.

    Args:
        stream: the file, from its start (its text: these are the stored bytes).
        delimiter: the field delimiter.
        header: the header the file must have (the schema's).
        range_bytes: about how many bytes a range holds (at least one record): the file is
            cut into about stored_size / range_bytes ranges of even sizes.
        stored_size: the file's size: the last range ends there.
        max_record_bytes: the reader's limit on a record (a larger one stops the file).
        count_multiple: cut the file into a multiple of this many ranges (rounded up), where
            it holds enough records: a runner that deals tasks out round-robin to this many
            workers then gives each the same share of the file.

    Returns:
        (WHOLE,) when the file is not to be split (see the module docstring); else ranges that
        cover the file, with no gap and no overlap, each holding at least one record.
    """
    if range_bytes <= 0 or stored_size <= range_bytes:
        return (WHOLE,)
    scanner = CsvScanner(delimiter)
    cuts: list[tuple[int, int, int]] = []  # (offset, records before it, the byte before it)
    fields = 0  # the header's, once read and found to be the schema's
    head = bytearray()  # the start of the file, until it holds the header
    window, window_start = b"", 0  # the bytes read last, a few before them, and their offset
    fed = 0
    # A record end found too near the end of a read to tell whether a range may start there:
    # (offset, records before it), told after the next read.
    pending: tuple[int, int] | None = None
    # Even ranges, so that workers sharing a file get even shares of it.
    count = max(1, round(stored_size / range_bytes))
    count = -(-count // count_multiple) * count_multiple
    step = stored_size / count
    read_bytes = max(1, min(_READ_BYTES, int(step) // 8))
    while True:
        piece, error = read_stream_piece(stream, read_bytes)
        if error is not None:
            return (WHOLE,)
        if not piece:
            break
        kept = window[-8:]
        window, window_start = kept + piece, fed - len(kept)
        fed += len(piece)
        scanner.feed(piece)
        if not fields:
            head += piece
            if scanner.records:
                fields = _header_fields(bytes(head), delimiter, header)
                if not fields:
                    return (WHOLE,)
                head = bytearray()
        if fed - scanner.boundary > max_record_bytes:  # as RecordStream measures a record
            return (WHOLE,)
        if pending is not None and pending[0] + len(_BOM) <= fed:
            # Cut there, not a read later: the ranges keep their even sizes.
            previous = _cut_after(window, window_start, pending[0], fed)
            if previous is not None:
                cuts.append((*pending, previous))
            pending = None
        at = scanner.boundary
        before = cuts[-1] if cuts else (0, 1, -1)
        # The last record end of a read after a range's mark: up to a read past the mark, so
        # marks are half a read early and cuts fall around multiples of `step`.
        mark = step * (len(cuts) + 1) - read_bytes / 2
        if fields and len(cuts) < count - 1 and at >= mark and scanner.records > before[1]:
            previous = _cut_after(window, window_start, at, fed)
            if previous is not None:
                cuts.append((at, scanner.records, previous))
            elif at + len(_BOM) > fed:
                pending = (at, scanner.records)
    if fed != stored_size:
        return (WHOLE,)  # the file changed as it was read: its reading will tell
    if window[-1:] not in (b"\n", b"\r", b""):
        scanner.feed(b"\n")  # the reader adds a missing final line break too
    scanner.finish()
    if scanner.open_quote is not None or not fields:
        return (WHOLE,)
    while cuts and cuts[-1][1] >= scanner.records:
        cuts.pop()  # only empty lines after the last cut: no range there
    if not cuts:
        return (WHOLE,)
    bounds = [(0, 1, -1), *cuts, (stored_size, scanner.records, -1)]
    return tuple(
        CsvRange(
            start=start,
            end=end,
            first_row=before,  # `before` records precede it, the header among them
            rows=after - before,
            previous=previous,
            header_fields=fields if start else 0,
            stored_size=stored_size,
        )
        for (start, before, previous), (end, after, _) in itertools.pairwise(bounds)
    )


def _header_fields(head: bytes, delimiter: str, header: Sequence[str]) -> int:
    """The number of fields of the header at the start of `head` when it is `header`, else 0
    (the file is then read whole, and its reading reports the header)."""
    first = first_record(head, delimiter, file_start=True)
    if first is None:
        return 0
    end, fields = first
    try:
        names = header_names(head[: end + 1], delimiter)
    except InputError:
        return 0
    return fields if tuple(names) == tuple(header) else 0


def _cut_after(window: bytes, window_start: int, at: int, fed: int) -> int | None:
    """The byte before offset `at` (a line break outside quotes) when a range may start at
    `at`, else None: not between \\r and \\n, not before a byte order mark, and only where
    the bytes around it were read."""
    position = at - window_start
    if position < 1 or at + len(_BOM) > fed:
        return None
    previous = window[position - 1]
    if previous == _CR and window[position] == _LF:
        return None
    if window[position : position + len(_BOM)] == _BOM:
        return None
    return previous
