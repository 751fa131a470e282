"""Following a CSV byte stream as pyarrow parses it: quotes, record ends, row numbers.

pyarrow reports neither where a row starts nor a quote left open: a quote that is never closed
swallows the rest of the file into one cell, and one closed by the opening quote of a later
field swallows the lines in between. The scanner reads the same bytes first, with the rules of
pyarrow's parser (`newlines_in_values`, doubled quotes): a quote opens a quoted field only at
the start of a field; inside one, a doubled quote is a quote and any other quote closes it; a
line ends at `\\n`, `\\r` or `\\r\\n` outside quotes, and empty lines are not records. So it
knows where every record ends (the reader hands pyarrow whole records only, and a row of any
size up to a limit is read), how many records the data holds (checked against the rows
pyarrow produced), and which quotes went wrong, with the row where each opened.

Cost: a chunk without quotes costs a few passes of memchr-speed byte counting; one with quotes
a few numpy passes over its quote positions, and, where the quotes do not pair up as strict CSV
would (a quote inside an unquoted field, a quote closed with text after it), a Python loop over
that chunk's quotes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_QUOTE, _LF, _CR = 0x22, 0x0A, 0x0D
_BOM = b"\xef\xbb\xbf"
_START = -1  # the "byte" before the data: a field and a line start there


@dataclass(frozen=True)
class LooseQuote:
    """A quoted field that spans line breaks and whose closing quote is followed by more text
    in the field: most likely a quote never closed, whose field swallowed the lines after it
    up to the next quote.

    Attributes:
        row: the data row (1-based, the header not counted) where the quote opened.
        offset: the byte offset of the opening quote.
        lines: the line breaks inside the quoted text.
    """

    row: int
    offset: int
    lines: int


class CsvScanner:
    """Scans a CSV file's bytes, fed in order, in any pieces (see the module docstring).

    Attributes:
        delimiter: the field delimiter.
        offset: bytes scanned so far.
        records: complete records so far, the header included (empty lines are not records).
        boundary: the offset just past the last line end outside quotes: the data before it
            holds whole records only.
        loose: the LooseQuotes found so far, in file order.
    """

    def __init__(self, delimiter: str = ",") -> None:
        self.delimiter = delimiter
        self._delimiter = ord(delimiter)
        self.offset = 0
        self.records = 0
        self.boundary = 0
        self.loose: list[LooseQuote] = []
        self._in_quotes = False
        self._open_offset = -1  # where the open quoted field began
        self._open_row = -1
        # Line breaks inside the open quoted field so far: \n and \r counted apart, so that the
        # count does not depend on where the pieces fed were cut (see _lines).
        self._open_lf = self._open_cr = 0
        self._previous = _START  # the last byte scanned
        self._held = b""  # a final quote, whose meaning depends on the byte after it
        self._bom_end = -1  # offset just past a UTF-8 byte order mark at the start

    def start_at(self, offset: int, records: int, previous: int) -> None:
        """Scan from `offset`, a record's start inside a file (see core.tables.ranges), as if
        the bytes before it had been scanned: `records` records end before it (the header
        included), `previous` is the line-break byte just before it. Offsets and row numbers
        are then the file's, and no byte order mark is looked for."""
        self.offset = self.boundary = offset
        self.records = records
        self._previous = previous
        self._bom_end = 0  # offsets here are past the file's start: never a BOM's end

    @property
    def open_quote(self) -> tuple[int, int] | None:
        """(row, byte offset) of the quote of a quoted field still open, else None."""
        return (self._open_row, self._open_offset) if self._in_quotes else None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Scan the next bytes of the file."""
        data = bytes(data) if not isinstance(data, bytes) else data
        if self._held:
            data, self._held = self._held + data, b""
        if self._bom_end < 0:
            if len(data) < len(_BOM) and _BOM.startswith(data):
                self._held = data  # maybe a byte order mark: wait for its end
                return
            self._bom_end = len(_BOM) if data.startswith(_BOM) else 0
        if data.endswith(b'"'):
            # Inside quotes, a quote followed by a quote is one quote, else it closes: the
            # quotes at the end wait for the byte after them to tell.
            kept = data.rstrip(b'"')
            data, self._held = kept, data[len(kept) :]
        if data:
            self._scan(data)

    def finish(self) -> None:
        """The file ends: scan what was held back. Check `open_quote` afterwards."""
        if self._bom_end < 0:
            self._bom_end = 0
        if self._held:
            held, self._held = self._held, b""
            self._scan(held, at_end=True)

    def _scan(self, data: bytes, at_end: bool = False) -> None:
        base = self.offset
        has_quotes = self._in_quotes or data.find(b'"') >= 0
        arr = np.frombuffer(data, dtype=np.uint8) if has_quotes or b"\r" in data else None
        bounds = self._quote_spans(data, arr, base, at_end) if has_quotes else None
        self._count_records(data, arr, base, bounds)
        if data:
            self._previous = data[-1]
        self.offset = base + len(data)

    def _before(self, data: bytes, position: int, base: int) -> int:
        """The byte before `position` of `data` (_START at the start of the file)."""
        if base + position == self._bom_end:
            return _START
        return data[position - 1] if position > 0 else self._previous

    def _quote_spans(self, data: bytes, arr: np.ndarray, base: int, at_end: bool) -> np.ndarray:
        """The quoted spans of `data`, flattened [start, end, start, end, ...] (data offsets),
        the state carried over; loose quotes noted."""
        quotes = np.flatnonzero(arr == _QUOTE)
        spans = self._strict_spans(data, arr, quotes, base, at_end)
        if spans is None:
            spans = self._exact_spans(data, quotes.tolist(), base, at_end)
        return spans

    def _strict_spans(
        self, data: bytes, arr: np.ndarray, quotes: np.ndarray, base: int, at_end: bool
    ) -> np.ndarray | None:
        """The spans when the quotes pair up as in strict CSV (each opens at a field start,
        each closing one is followed by a delimiter, a line end or a quote); else None."""
        carried = self._in_quotes
        if len(quotes):
            first_opens = not carried
            opening = quotes[0 if first_opens else 1 :: 2]
            closing = quotes[1 if first_opens else 0 :: 2]
            if not self._pairs_strictly(data, arr, opening, closing, base, at_end):
                return None
        else:
            opening = closing = quotes
        starts = [0] if carried else []
        starts += opening.tolist()
        ends = closing.tolist()
        still_open = len(starts) > len(ends)
        if still_open:
            ends.append(len(data))
            if carried and len(starts) == 1:
                self._add_line_breaks(data, 0, len(data))
            else:
                self._open_offset, self._open_row = base + starts[-1], -1
                self._open_lf = self._open_cr = 0
                self._add_line_breaks(data, starts[-1], len(data))
        self._in_quotes = still_open
        flat = np.empty(2 * len(starts), dtype=np.int64)
        flat[0::2], flat[1::2] = starts, ends
        return flat

    def _pairs_strictly(
        self,
        data: bytes,
        arr: np.ndarray,
        opening: np.ndarray,
        closing: np.ndarray,
        base: int,
        at_end: bool,
    ) -> bool:
        """Whether quotes taken alternately as opening and closing ones follow strict CSV."""
        before = np.where(
            opening > 0, arr[np.maximum(opening - 1, 0)].astype(np.int16), self._previous
        )
        if self._bom_end > 0:
            before = np.where(base + opening == self._bom_end, _START, before)
        delimiters = (self._delimiter, _LF, _CR)
        at_start = np.isin(before, (*delimiters, _START))
        if not at_start.all():
            # Also fine: the second quote of a doubled one ("" inside a quoted field).
            doubled = (before == _QUOTE) & np.isin(opening - 1, closing)
            if not (at_start | doubled).all():
                return False
        if len(closing):
            after_close = closing + 1
            # A quote at the very end is followed by the quote held back, or by the file's end.
            beyond = _QUOTE if self._held else _START
            following = np.where(
                after_close < len(data),
                arr[np.minimum(after_close, len(data) - 1)].astype(np.int16),
                beyond,
            )
            if not np.isin(following, (*delimiters, _QUOTE, _START)).all():
                return False
        return True

    def _exact_spans(self, data: bytes, quotes: list[int], base: int, at_end: bool) -> np.ndarray:
        """The spans by pyarrow's own rules, one quote at a time (see the module docstring)."""
        delimiters = (self._delimiter, _LF, _CR)
        flat: list[int] = []
        in_quotes = self._in_quotes
        if in_quotes:
            flat.append(0)
        index, count = 0, len(quotes)
        while index < count:
            position = quotes[index]
            if not in_quotes:
                if self._before(data, position, base) in (*delimiters, _START):
                    in_quotes = True
                    flat.append(position)
                    self._open_offset, self._open_row = base + position, -1
                    self._open_lf = self._open_cr = 0
                index += 1  # else a quote inside an unquoted field: text
                continue
            if position + 1 < len(data):
                following = data[position + 1]
            else:  # the quote held back, or the end of the file
                following = _QUOTE if self._held else None
            if following == _QUOTE:
                index += 2  # a doubled quote: one quote of text
                continue
            in_quotes = False
            start = flat[-1]
            flat.append(position)
            self._add_line_breaks(data, start, position)
            if following not in (*delimiters, None) and self._lines:
                self.loose.append(LooseQuote(self._open_row, self._open_offset, self._lines))
            index += 1
        if in_quotes:
            self._add_line_breaks(data, flat[-1], len(data))
            flat.append(len(data))
        self._in_quotes = in_quotes
        return np.array(flat, dtype=np.int64)

    def _add_line_breaks(self, data: bytes, start: int, end: int) -> None:
        self._open_lf += data.count(b"\n", start, end)
        self._open_cr += data.count(b"\r", start, end)

    @property
    def _lines(self) -> int:
        """The lines the open quoted field spans so far: its \n, or its \r when it has none
        (whatever pieces its bytes came in: the reader's blocks, or a range's)."""
        return self._open_lf or self._open_cr

    def _count_records(
        self, data: bytes, arr: np.ndarray | None, base: int, bounds: np.ndarray | None
    ) -> None:
        """Count the records ending in `data`, move `boundary`, and give pending quotes their
        rows."""
        if arr is None:  # neither quotes nor carriage returns: lines end at \n only
            count = data.count(b"\n")
            if not count:
                self._settle_open_rows(np.zeros(0, dtype=np.int64), base)
                return
            empty = data.find(b"\n\n") >= 0 or (
                data[0] == _LF and self._before(data, 0, base) in (_LF, _CR, _START)
            )
            if not empty and base > self._bom_end:
                self.records += count
                self.boundary = base + data.rfind(b"\n") + 1
                return
            arr = np.frombuffer(data, dtype=np.uint8)
        # Most files have no \r: one comparison pass over the bytes instead of three.
        line_ends = (arr == _LF) | (arr == _CR) if b"\r" in data else arr == _LF
        ends = np.flatnonzero(line_ends)
        if bounds is not None and len(bounds) and len(ends):
            outside = np.searchsorted(bounds, ends, side="right") % 2 == 0
            ends = ends[outside]
        if not len(ends):
            self._settle_open_rows(ends, base)
            return
        before = np.where(ends > 0, arr[np.maximum(ends - 1, 0)].astype(np.int16), self._previous)
        if self._bom_end > 0:
            before = np.where(base + ends == self._bom_end, _START, before)
        crlf = (arr[ends] == _LF) & (before == _CR)
        self.boundary = base + int(ends[-1]) + 1
        ends, before = ends[~crlf], before[~crlf]
        record_ends = ends[~np.isin(before, (_LF, _CR, _START))]
        self._settle_open_rows(record_ends, base)
        self.records += len(record_ends)

    def _settle_open_rows(self, record_ends: np.ndarray, base: int) -> None:
        """Give the quotes opened in this piece (row -1 so far) the row they opened in."""
        for index, loose in enumerate(self.loose):
            if loose.row < 0:
                row = self.records + int(np.searchsorted(record_ends, loose.offset - base))
                self.loose[index] = LooseQuote(row, loose.offset, loose.lines)
        if self._in_quotes and self._open_row < 0:
            offset = self._open_offset - base
            self._open_row = self.records + int(np.searchsorted(record_ends, max(offset, 0)))


def record_fields(data: bytes, delimiter: str, *, file_start: bool) -> np.ndarray:
    """The records of `data`, as pyarrow parses them: an array of (start, end, fields) rows,
    `end` the offset of the record's line break, `fields` how many fields it holds.

    `data` holds whole records, from a record's start: the file's start (`file_start`, where a
    byte order mark is skipped) or just after a line break. Only files that hold bytes that are
    not UTF-8 need it (see undecodable_rows_mended), so it favours brevity over speed.
    """
    scanner = CsvScanner(delimiter)
    scanner._bom_end = len(_BOM) if file_start and data.startswith(_BOM) else 0
    scanner._previous = _START if file_start else _LF
    arr = np.frombuffer(data, dtype=np.uint8)
    spans = scanner._quote_spans(data, arr, 0, True) if b'"' in data else np.zeros(0, np.int64)

    def outside_quotes(positions: np.ndarray) -> np.ndarray:
        return positions[np.searchsorted(spans, positions, side="right") % 2 == 0]

    breaks = outside_quotes(np.flatnonzero((arr == _LF) | (arr == _CR)))
    before = np.where(breaks > 0, arr[np.maximum(breaks - 1, 0)].astype(np.int16), _LF)
    if file_start:
        before = np.where(breaks == scanner._bom_end, _START, before)
    lf_after_cr = (arr[breaks] == _LF) & (before == _CR)  # \r\n is one break, at the \r
    starts = np.concatenate(([scanner._bom_end], breaks + 1))[:-1]  # each line's first byte
    keep = ~lf_after_cr
    breaks, before, starts = breaks[keep], before[keep], starts[keep]
    is_record = ~np.isin(before, (_LF, _CR, _START))  # an empty line is no record
    starts, ends = starts[is_record], breaks[is_record]
    delimiters = outside_quotes(np.flatnonzero(arr == scanner._delimiter))
    owners = np.searchsorted(ends, delimiters)
    fields = 1 + np.bincount(owners[owners < len(ends)], minlength=len(ends))
    return np.column_stack((starts, ends, fields[: len(ends)]))


def header_fields(data: bytes, delimiter: str, *, file_start: bool) -> int:
    """The number of fields in the first record of `data` (see record_fields); 0 when `data`
    holds no whole record (only empty lines)."""
    first = first_record(data, delimiter, file_start=file_start)
    return first[1] if first else 0


def first_record(data: bytes, delimiter: str, *, file_start: bool) -> tuple[int, int] | None:
    """(offset of the line break that ends the first record of `data`, its number of fields),
    or None when `data` holds no whole record (see record_fields)."""
    size = 4096
    while True:
        records = record_fields(data[:size], delimiter, file_start=file_start)
        if len(records) or size >= len(data):
            return (int(records[0, 1]), int(records[0, 2])) if len(records) else None
        size *= 4


def undecodable_rows_mended(
    data: bytes, delimiter: str, fields: int, *, file_start: bool, header: bool
) -> bytes:
    """`data` (whole records, see record_fields) with the records that hold bytes that are not
    UTF-8 and a number of fields other than `fields` made UTF-8: each undecodable byte
    sequence becomes U+FFFD. Delimiters, quotes and line breaks are ASCII and stay where they
    are, so the record keeps its (wrong) number of fields; every other record keeps its bytes.

    Why: pyarrow hands a row with the wrong number of fields to the reader's handler as text,
    decoded strictly; when that fails it stops the whole file (pyarrow's _csv.pyx,
    _handle_invalid_row) instead of calling the handler.
    """
    pieces, kept = [], 0
    records = record_fields(data, delimiter, file_start=file_start)
    if header:
        records = records[1:]  # `data` starts with the header: what the rows are held to
    for start, end in records[records[:, 2] != fields, :2].tolist():
        record = data[start:end]
        if record.isascii():
            continue
        try:
            record.decode("utf-8")
        except UnicodeDecodeError:
            pieces += (data[kept:start], record.decode("utf-8", "replace").encode("utf-8"))
            kept = end
    if not pieces:
        return data
    pieces.append(data[kept:])
    return b"".join(pieces)
