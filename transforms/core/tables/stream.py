"""Streaming a CSV file into pyarrow as record batches of raw cell bytes."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import BinaryIO

import pyarrow as pa
import pyarrow.csv as pa_csv

from recordforge.transforms.core.errors import InputError, without_file_bytes
from recordforge.transforms.core.tables.scan import (
    CsvScanner,
    header_fields,
    undecodable_rows_mended,
)

_MESSAGE_LIMIT = 200
_PARSE_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError)


# The largest record (a row, all its cells) read: larger ones stop the file (CsvReadFailure).
# Documented in the README ("CSV files"); a single cell may take nearly all of it.
MAX_RECORD_BYTES = 512 << 20
# What pyarrow is told a block may hold: blocks are whole records (RecordStream), so any record
# up to the limit fits in one, and pyarrow never sees a record cut at a block's end.
_PYARROW_BLOCK_BYTES = MAX_RECORD_BYTES + (64 << 20)


class CsvReadFailure(Exception):
    """A CSV file that cannot be read to its end: the rows after `offset` are unknown.

    Attributes:
        reason: what stopped the reading, in words.
        offset: the byte offset (of the decompressed data) where it stopped.
        rows: the data rows wholly in the bytes before it (-1 when not known).
    """

    def __init__(self, reason: str, offset: int, rows: int = -1) -> None:
        before = f"; rows 1 to {rows:,} come before it" if rows > 0 else ""
        super().__init__(f"{reason} (at byte {offset:,}{before})")
        self.reason = reason
        self.offset = offset
        self.rows = rows

    def __reduce__(self):
        return (type(self), (self.reason, self.offset, self.rows))


class RecordStream:
    """A read-only file object over a CSV stream that hands out whole records only.

    The bytes go through a CsvScanner on their way: each read returns data that ends where a
    record ends, about `block_size` of it, more when one record is larger (up to
    `max_record_bytes`). pyarrow makes each read one block, and so never meets a record that
    straddles its blocks: rows of any size up to the limit are read, with no second pass.
    pyarrow reads a final data line without a newline, but not a header without one, so a
    missing final newline is added. pyarrow stops the whole file at a row with the wrong number
    of fields whose bytes are not UTF-8 (it cannot hand it to the handler as text): such rows
    are handed out with those bytes replaced (csv_scan.undecodable_rows_mended), and so reach
    the handler, as the other rows with the wrong number of fields do.

    A read that fails (the stream raises, a record is too long, the file ends inside a quoted
    field) raises CsvReadFailure, which pyarrow hands back unchanged, and is kept in `failure`.

    pyarrow calls `read` ahead of the batches it returns, on an IO thread. A Python read still
    running when the interpreter exits aborts the process, so a reader that is abandoned early
    must be closed with `close_reader`, which uses `stop`.
    """

    def __init__(
        self,
        stream: BinaryIO,
        *,
        delimiter: str = ",",
        block_size: int = 1 << 20,
        max_record_bytes: int = MAX_RECORD_BYTES,
        start: tuple[int, int, int, int] | None = None,
    ) -> None:
        self._stream = stream
        self.scanner = CsvScanner(delimiter)
        self._block = max(block_size, 1)
        self._limit = max_record_bytes
        self._pending = bytearray()  # read and scanned, not returned yet
        self._returned = 0  # bytes returned so far (the file's offset of the next byte)
        self._added = 0  # the final newline added, if one was
        self._header_fields: int | None = None  # fields in the file's first record
        self.start_offset = 0
        if start is not None:
            # A range of a file after its header (core.tables.ranges): offsets, record counts
            # and the header's field count are the file's, as if read from its start.
            offset, records, previous, header_fields = start
            self.scanner.start_at(offset, records, previous)
            self._returned = self.start_offset = offset
            self._header_fields = header_fields
        self._aligned = True  # the next read starts where a record starts
        self._eof = False
        self.failure: CsvReadFailure | None = None
        self._state = threading.Condition()
        self._active = 0
        self._stopped = False

    @property
    def pyarrow_block_size(self) -> int:
        """The block size to give pyarrow: larger than any read returns."""
        return _PYARROW_BLOCK_BYTES

    def read(self, size: int | None = -1) -> bytes:
        with self._state:
            if self._stopped:
                return b""
            self._active += 1
        try:
            return self._read(size)
        finally:
            with self._state:
                self._active -= 1
                self._state.notify_all()

    def stop(self) -> None:
        """Make further reads return end-of-file, and wait for a read in progress to finish."""
        with self._state:
            self._stopped = True
            self._state.wait_for(lambda: self._active == 0)

    @property
    def returned(self) -> int:
        """Bytes handed out so far."""
        return self._returned

    @property
    def stream_bytes(self) -> int:
        """Bytes read from the stream so far (without the final newline added)."""
        return self.scanner.offset - self._added - self.start_offset

    @property
    def complete(self) -> bool:
        """Whether the whole stream was read and handed out."""
        return self._eof and not self._pending and self.failure is None

    # The file-object surface pyarrow uses besides `read`.
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        pass  # pyarrow closes its input when a reader is done; the caller owns the stream

    def _read(self, size: int | None) -> bytes:
        if self.failure is not None:
            raise self.failure
        if size is None or size < 0:
            size = 1 << 62
        while not self._eof:
            whole = self.scanner.boundary - self._returned
            if whole > 0 and (len(self._pending) >= self._block or whole >= size):
                break
            self._fill()
        end = len(self._pending) if self._eof else self.scanner.boundary - self._returned
        whole = end
        end = min(end, size)
        data = bytes(self._pending[:end])
        del self._pending[:end]
        start, self._returned = self._returned, self._returned + end
        aligned, self._aligned = self._aligned, end == whole  # pyarrow asks for more: always
        header = False
        if self._header_fields is None and aligned:  # the header is in the first record read
            self._header_fields = (
                header_fields(data, self.scanner.delimiter, file_start=start == 0) or None
            )
            header = self._header_fields is not None
        if aligned and end == whole and self._header_fields and not data.isascii():
            data = self._decodable_for_pyarrow(data, start, header)
        return data

    def _decodable_for_pyarrow(self, data: bytes, start: int, header: bool) -> bytes:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return undecodable_rows_mended(
                data,
                self.scanner.delimiter,
                self._header_fields or 0,
                file_start=start == 0,
                header=header,
            )
        return data

    def _fill(self) -> None:
        chunk, error = self._read_raw(self._block)
        if chunk:
            self.scanner.feed(chunk)
            self._pending += chunk
        if error is not None:  # after what was read before it, to say where it happened
            self._fail(_read_error_reason(error))
        if chunk:
            record = len(self._pending) - (self.scanner.boundary - self._returned)
            if record > self._limit:
                row = self.scanner.records  # the header is record 0: this is the data row
                self._fail(
                    f"row {row:,}, which starts there, is larger than {self._limit:,} bytes, "
                    "the most a row may hold",
                    self.scanner.boundary,
                )
            return
        self._eof = True
        if self._pending and self._pending[-1:] not in (b"\n", b"\r"):
            self._pending += b"\n"
            self.scanner.feed(b"\n")
            self._added = 1
        self.scanner.finish()
        opened = self.scanner.open_quote
        if opened is not None:
            row, offset = opened
            where = f"row {row:,}" if row > 0 else "the header"
            self._fail(
                f"a quote opened in {where} is never closed, so the rest of the file would be "
                "one cell",
                offset,
                row - 1,
            )

    def _read_raw(self, size: int) -> tuple[bytes, BaseException | None]:
        return read_stream_piece(self._stream, size)

    def _fail(self, reason: str, offset: int | None = None, rows: int | None = None) -> None:
        if offset is None:
            offset = self.scanner.offset
        if rows is None:
            rows = max(self.scanner.records - 1, 0)  # whole rows in what was read
        self.failure = CsvReadFailure(reason, offset, rows)
        raise self.failure


def read_stream_piece(stream: BinaryIO, size: int) -> tuple[bytes, BaseException | None]:
    """Up to `size` bytes of `stream` (b"" at its end), and the error that stopped it.

    Read in the stream's own pieces (`read1`) where it has them: a gzip stream cut short
    raises from a `read` that asked for more, losing what it had decompressed before.
    """
    read_piece = getattr(stream, "read1", None) or stream.read
    pieces, got = [], 0
    try:
        while got < size:
            piece = read_piece(size - got)
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
    except Exception as error:  # noqa: BLE001  (any failure of the stream stops the file)
        return b"".join(pieces), error
    return b"".join(pieces), None


def _read_error_reason(error: BaseException) -> str:
    if isinstance(error, EOFError):
        return "the compressed data ends early: the file is cut short"
    text = without_file_bytes(str(error).strip() or type(error).__name__).splitlines()[0][:200]
    if isinstance(error, (zlib.error, gzip.BadGzipFile)):
        return f"the compressed data is damaged ({text})"
    if isinstance(error, OSError) and error.strerror:
        return f"the file could not be read further: {error.strerror}"
    return f"the file could not be read further: {text}"


def unreadable(error: Exception) -> InputError:
    """Turn a pyarrow parse error into InputError("UnreadableCsv") with a one-line message."""
    text = " ".join(str(error).split())
    if len(text) > _MESSAGE_LIMIT:
        text = text[: _MESSAGE_LIMIT - 3] + "..."
    return InputError("UnreadableCsv", f"not a readable CSV file: {text}")


def column_names(reader: pa_csv.CSVStreamingReader) -> list[str]:
    """The names in the header row of the file `reader` reads.

    Raises:
        InputError: kind "UnreadableCsv" when the header is not UTF-8 text (pyarrow keeps the
            cells of a row as bytes, but decodes the names).
    """
    try:
        names = reader.schema.names
    except UnicodeDecodeError as e:
        raise InputError(
            "UnreadableCsv",
            f"not a readable CSV file: its header row is not UTF-8 text (byte "
            f"{e.object[e.start : e.start + 1]!r} in a column name); is it compressed, or in "
            "another encoding?",
        ) from None
    if any("\x00" in name for name in names):
        # Valid UTF-8, but no header is written so: UTF-16 without its byte-order mark.
        raise InputError(
            "UnreadableCsv",
            "not a readable CSV file: its header row holds NUL bytes; is it UTF-16, or in "
            "another encoding? Save it as UTF-8",
        )
    return names


def read_text_table(data: bytes, names: Sequence[str], delimiter: str) -> pa.Table:
    """Read CSV bytes held in memory, every named column as raw bytes; skip invalid rows.

    pyarrow reads from a native buffer here, so no Python code runs on its IO threads.

    Raises:
        InputError: kind "UnreadableCsv" when pyarrow cannot parse the data.
    """
    try:
        return pa_csv.read_csv(
            pa.BufferReader(data),
            # One block: every record is whole, however large.
            read_options=pa_csv.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=_parse_options(delimiter, lambda row: "skip"),
            convert_options=_text_convert_options(names),
        )
    except _PARSE_ERRORS as e:
        raise unreadable(e) from None


def header_names(data: bytes, delimiter: str) -> list[str]:
    """Return the column names of the header at the start of `data` (the rest may be cut off).

    Raises:
        InputError: kind "UnreadableCsv" when pyarrow cannot parse it.
    """
    try:
        reader = pa_csv.open_csv(
            pa.BufferReader(data),
            read_options=pa_csv.ReadOptions(block_size=len(data) + 1, use_threads=False),
            parse_options=_parse_options(delimiter, lambda row: "skip"),
        )
    except _PARSE_ERRORS as e:
        raise unreadable(e) from None
    return column_names(reader)


def open_text_reader(
    source: RecordStream,
    names: Sequence[str],
    *,
    delimiter: str,
    on_invalid_row: Callable[[pa_csv.InvalidRow], str],
    headerless: bool = False,
) -> pa_csv.CSVStreamingReader:
    """Open a streaming reader that reads every named column as raw, never-null bytes.

    Rows with the wrong number of fields go to `on_invalid_row`. Without threads, pyarrow
    reports them in file order, each while parsing its block, so before the batch holding the
    rows after it. `headerless`: the source starts after the header (a range of a file), and
    `names` are its columns; pyarrow then numbers the invalid rows from 1 at the source's
    start, where it numbers the header 1 otherwise.

    Raises:
        InputError: kind "UnreadableCsv" when pyarrow cannot parse the start of the file.
    """
    try:
        return pa_csv.open_csv(
            source,
            read_options=pa_csv.ReadOptions(
                block_size=source.pyarrow_block_size,
                use_threads=False,
                column_names=list(names) if headerless else None,
            ),
            parse_options=_parse_options(delimiter, on_invalid_row),
            convert_options=_text_convert_options(names),
        )
    except _PARSE_ERRORS as e:
        raise unreadable(e) from None


def close_reader(reader: pa_csv.CSVStreamingReader, source: RecordStream) -> None:
    """Stop a streaming reader's source and let pyarrow finish its read-ahead.

    Further reads return end-of-file, so the remaining batches come from what is already read;
    once the reader reports its end, pyarrow makes no more calls into Python from its IO thread
    (such a call during interpreter exit hangs or aborts the process).
    """
    source.stop()
    while True:
        try:
            reader.read_next_batch()
        except StopIteration:
            return
        except (*_PARSE_ERRORS, CsvReadFailure):
            return  # nothing more will be read


def next_batch(reader: pa_csv.CSVStreamingReader, source: RecordStream) -> pa.RecordBatch | None:
    """Return the reader's next batch, or None at the end of the file.

    Raises:
        CsvReadFailure: the stream failed, or pyarrow cannot parse further into the file
            (the rows after are unknown).
    """
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None
    except _PARSE_ERRORS as e:
        text = " ".join(str(e).split())
        if "columns, got" in text:
            # pyarrow hands a row with the wrong field count to the handler as text: it stops
            # instead when the row is not UTF-8.
            reason = (
                "a row has the wrong number of fields and bytes that are not UTF-8 text, "
                "which pyarrow's reader cannot skip"
            )
        else:
            reason = f"pyarrow cannot parse it: {text[:_MESSAGE_LIMIT]}"
        raise CsvReadFailure(reason, source.returned) from None


def _text_convert_options(names: Sequence[str]) -> pa_csv.ConvertOptions:
    return pa_csv.ConvertOptions(
        column_types={name: pa.binary() for name in names},
        null_values=[],
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )


def _parse_options(
    delimiter: str, on_invalid_row: Callable[[pa_csv.InvalidRow], str]
) -> pa_csv.ParseOptions:
    # Quoted newlines are always allowed: without them pyarrow splits records at every newline.
    return pa_csv.ParseOptions(
        delimiter=delimiter, newlines_in_values=True, invalid_row_handler=on_invalid_row
    )


# --- a bounded sample, for schema inference --------------------------------------------------

_SAMPLE_BLOCK_SIZE = 1 << 20
# The sample stops growing here once it holds a row (rows of tens of MB are possible).
_SAMPLE_MAX_BYTES = 64 << 20


def read_sample(
    stream: BinaryIO, *, delimiter: str = ",", max_rows: int = 10_000
) -> tuple[list[str], pa.Table]:
    """Read the header and up to max_rows rows of a CSV for inference.

    Rows with the wrong number of fields are skipped. Every column is read as the raw bytes of
    its cells (type inference happens in `infer_dtype`, once the null values are known).
    Deterministic for the same bytes. Reads the stream only about as far as the rows need
    (at least 1 MiB, at most twice what the rows take, and no more than _SAMPLE_MAX_BYTES
    once it holds a row).

    Args:
        stream: the CSV file, opened for binary reading.
        delimiter: the field delimiter.
        max_rows: the most data rows to return.

    Returns:
        The header's column names, and a table of binary columns in header order.

    Raises:
        InputError: kind "UnreadableCsv" when pyarrow cannot parse the start of the file.
        CsvReadFailure: the part of the file read cannot be read (a row larger than the
            limit, a quote never closed, the stream failing).
    """
    # The sample is parsed from memory (pyarrow reads a native buffer, with no Python calls on its
    # IO threads). The stream hands out whole records only (RecordStream): the prefix read is
    # doubled until it holds max_rows + 1 rows, the file ends, or it is large enough.
    source = RecordStream(stream, delimiter=delimiter, block_size=_SAMPLE_BLOCK_SIZE)
    data = source.read()
    names = header_names(data, delimiter)
    target = _SAMPLE_BLOCK_SIZE
    while True:
        table = read_text_table(data, names, delimiter)
        if (
            source.complete
            or table.num_rows > max_rows
            or (table.num_rows and len(data) >= _SAMPLE_MAX_BYTES)
        ):
            return list(names), table.slice(0, max_rows)
        target *= 2
        while len(data) < target and not source.complete:
            data += source.read()
