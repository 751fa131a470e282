"""Reading a CSV file as a stream of typed rows, with exact row numbers and per-row errors."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from recordforge.schemas.csv.cells import (
    convert_list_column,
    convert_values,
    not_a_value,
    short_repr,
)
from recordforge.schemas.csv.schema import CsvSchema
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.tables.ranges import WHOLE, CsvRange
from recordforge.transforms.core.tables.scan import LooseQuote
from recordforge.transforms.core.tables.stream import (
    CsvReadFailure,
    RecordStream,
    close_reader,
    column_names,
    next_batch,
    open_text_reader,
)

_ROW_TEXT_LIMIT = 80
_NULL_BINARY = pa.scalar(None, pa.binary())


@dataclass(frozen=True)
class ParsedRow:
    """One data row converted to typed values.

    Attributes:
        row: the 1-based data row number (the header is not counted, rows with errors are; blank
            lines are not rows).
        values: column name -> typed values (int, float or bytes); a scalar is a 1-tuple, a list
            cell an n-tuple. A missing cell is absent under missing="omit" and the default tuple
            under missing="default".
    """

    row: int
    values: dict[str, tuple]


def missing_label(column: str) -> InputError:
    """A row's label cell is missing: empty, or a text the reader takes as missing (`NA`,
    `null`, ...: pandas' defaults, or --null-values), which reaches the label as no value."""
    return InputError(
        "MissingLabel",
        f"label column {column!r} has a missing value: its cell is empty or a text read as "
        "missing, such as NA (--null-values sets those texts)",
    )


@dataclass(frozen=True)
class RowError:
    """One data row that cannot be converted.

    Attributes:
        row: the 1-based data row number, numbered like ParsedRow.row.
        error: kind "WrongFieldCount", "BadCell" or "MissingValue". When a row has several bad
            cells, the message describes the first (in column order) and counts the others.
    """

    row: int
    error: InputError


@dataclass(frozen=True)
class CsvEnd:
    """The end of a CSV file (or of a range of one), read to its last byte: the last item
    `read_csv_batches` yields.

    Attributes:
        rows: the data rows read (good or not), as many as the scanner counted in the bytes.
        num_bytes: the (decompressed) bytes read from the stream.
    """

    rows: int
    num_bytes: int


@dataclass(frozen=True)
class CellBatch:
    """Consecutive data rows of a file, converted column-wise.

    Attributes:
        rows: the row number of each row of the batch (numbered like ParsedRow.row).
        values: column name -> typed array (int64, float64 or binary; a list array of those for
            list columns), null where the cell is missing, whatever the missing rule, and
            meaningless where the row has an error.
        missing: column name -> the batch positions of its missing cells.
        errors: batch position -> the error of each row that cannot be converted.
        skipped: rows with the wrong number of fields that pyarrow skipped, numbered between
            the previous batch's last row and this batch's last row.
    """

    rows: np.ndarray
    values: dict[str, pa.Array]
    missing: dict[str, list[int]]
    errors: dict[int, InputError]
    skipped: tuple[RowError, ...] = field(default=())

    @property
    def num_rows(self) -> int:
        return len(self.rows)


def read_csv_rows(
    stream: BinaryIO,
    schema: CsvSchema,
    *,
    source_name: str,
    block_size: int = 1 << 20,
    part: CsvRange = WHOLE,
) -> Iterator[ParsedRow | RowError | CsvEnd]:
    """Read every data row of a CSV file, in file order, as ParsedRow or RowError, then CsvEnd.

    The row-by-row view of `read_csv_batches` (same arguments, same errors).
    """
    converter = _RowConverter(schema)
    batches = read_csv_batches(
        stream, schema, source_name=source_name, block_size=block_size, part=part
    )
    for item in batches:
        if isinstance(item, (RowError, CsvEnd)):
            yield item
            continue
        skipped = deque(item.skipped)
        for position, outcome in enumerate(converter.rows(item)):
            row = int(item.rows[position])
            while skipped and skipped[0].row < row:
                yield skipped.popleft()
            if isinstance(outcome, InputError):
                yield RowError(row, outcome)
            else:
                yield ParsedRow(row, outcome)
        yield from skipped


def read_csv_batches(
    stream: BinaryIO,
    schema: CsvSchema,
    *,
    source_name: str,
    block_size: int = 1 << 20,
    part: CsvRange = WHOLE,
) -> Iterator[CellBatch | RowError | CsvEnd]:
    """Read every data row of a CSV file, in file order, as CellBatches (and RowErrors for the
    skipped rows after the last batch), then a CsvEnd.

    The file is read as a stream of record batches of whole records (transforms.core.tables.stream.
    RecordStream: memory stays bounded by `block_size` and the largest row), every column as
    raw text, converted column-wise. Nothing is read before the first row is asked for; header
    and parse errors are raised from the iteration.

    Args:
        stream: the CSV file, opened for binary reading.
        schema: the schema the file must follow.
        source_name: the file's name, for messages about the whole file.
        block_size: about how many bytes pyarrow parses at once.
        part: the range of the file that `stream` holds (core.tables.ranges; by default the
            whole file). A range after the header is read with the file's header, row numbers
            and offsets, and gives the rows, errors and messages a whole reading gives there.

    Yields:
        The batches in file order. How rows are batched depends on `block_size`; the rows, their
        numbers and their errors do not. A row holding a quote that swallowed the lines after it
        (transforms.core.tables.scan.LooseQuote) is an `UnterminatedQuote` error.

    Raises:
        InputError: kind "CsvHeaderMismatch" when the header is not exactly the schema's (dropped
            columns included); kind "UnreadableCsv" when pyarrow cannot parse its start.
        CsvReadFailure: the file cannot be read to its end (the stream fails, a row is larger
            than the limit, the file ends inside a quoted field, pyarrow stops), so the number of
            rows it holds is unknown.
    """
    header = schema.expected_header
    invalid: deque[tuple[int, InputError]] = deque()
    unnumbered: list[InputError] = []
    # pyarrow counts the header as record 1; in a range after it, records from 1 at its start.
    number_shift = -1 if part.has_header else part.first_row - 1

    def on_invalid(row: pa_csv.InvalidRow) -> str:
        error = InputError(
            "WrongFieldCount",
            f"expected {row.expected_columns} fields, found {row.actual_columns}: "
            f"{short_repr(row.text, _ROW_TEXT_LIMIT)}",
        )
        if row.number is None:
            unnumbered.append(error)
        else:
            invalid.append((row.number + number_shift, error))
        return "skip"

    start = None
    if not part.has_header:
        start = (part.start, part.first_row, part.previous, part.header_fields)
    source = RecordStream(stream, delimiter=schema.delimiter, block_size=block_size, start=start)
    try:
        reader = open_text_reader(
            source,
            header,
            delimiter=schema.delimiter,
            on_invalid_row=on_invalid,
            headerless=not part.has_header,
        )
    except BaseException:
        source.stop()
        raise
    try:
        names = tuple(column_names(reader))
        if names != header:
            raise InputError(
                "CsvHeaderMismatch", _header_mismatch(names, header, source_name, schema)
            )
        converter = _BatchConverter(schema, names)
        yield from _batches(reader, source, converter, invalid, unnumbered, part.first_row)
    finally:
        # Also when the caller stops early: pyarrow reads ahead on an IO thread.
        close_reader(reader, source)


def _batches(
    reader: pa_csv.CSVStreamingReader,
    source: RecordStream,
    converter: _BatchConverter,
    invalid: deque[tuple[int, InputError]],
    unnumbered: list[InputError],
    first_row: int,
) -> Iterator[CellBatch | RowError | CsvEnd]:
    """Convert batches and number their rows around the rows pyarrow skipped; then CsvEnd."""
    row = first_row
    loose = _LooseRows(source)
    while (batch := next_batch(reader, source)) is not None:
        size = batch.num_rows
        numbers, skipped = [], []
        done = 0
        while done < size:
            if invalid and invalid[0][0] <= row:
                skipped.append(loose.replace(RowError(row, invalid.popleft()[1])))
                row += 1
                continue
            # Good rows up to the next bad one (bad rows are rare: few passes through here).
            end = size
            if invalid:
                end = min(end, done + invalid[0][0] - row)
            numbers.append(np.arange(row, row + end - done, dtype=np.int64))
            row += end - done
            done = end
        rows = np.concatenate(numbers) if numbers else np.zeros(0, dtype=np.int64)
        yield loose.mark(converter.convert(batch, rows, tuple(skipped)))
    for _, error in invalid:
        yield loose.replace(RowError(row, error))
        row += 1
    # pyarrow leaves only a truncated last record unnumbered; it is the file's last row.
    for error in unnumbered:
        yield RowError(row, error)
        row += 1
    if not source.complete:
        raise CsvReadFailure("the reader stopped before the end of the file", source.returned)
    counted = max(source.scanner.records - 1, 0)  # the header is a record
    if counted != row - 1:
        # Rows pyarrow dropped or invented: which ones is unknown, so nothing can be trusted.
        raise CsvReadFailure(
            f"pyarrow read {row - 1:,} rows where the file holds {counted:,}", source.returned
        )
    yield CsvEnd(row - first_row, source.stream_bytes)


class _LooseRows:
    """Rows whose quote swallowed the lines after it (the scanner's LooseQuotes), as errors."""

    def __init__(self, source: RecordStream) -> None:
        self._found = source.scanner.loose
        self._seen = 0
        self._rows: dict[int, LooseQuote] = {}

    def _refresh(self) -> dict[int, LooseQuote]:
        # The scanner runs ahead of the batches (it scans what pyarrow reads): a row's loose
        # quote is known before the row's batch. A quote still without its row (-1) is being
        # scanned on pyarrow's IO thread, which gives it its row before pyarrow sees its bytes:
        # it and those after it are taken later (taken now, it was lost, depending on timing).
        while self._seen < len(self._found):
            quote = self._found[self._seen]
            if quote.row < 0:
                break
            self._rows[quote.row] = quote
            self._seen += 1
        return self._rows

    def mark(self, batch: CellBatch) -> CellBatch:
        rows = self._refresh()
        if not rows or not batch.num_rows:
            return batch
        first, last = int(batch.rows[0]), int(batch.rows[-1])
        positions = {
            position: rows[row]
            for row in rows
            if first <= row <= last
            for position in np.flatnonzero(batch.rows == row).tolist()
        }
        if not positions:
            return batch
        errors = dict(batch.errors)
        for position, quote in positions.items():
            errors[position] = _loose_error(quote)
        return CellBatch(batch.rows, batch.values, batch.missing, errors, batch.skipped)

    def replace(self, error: RowError) -> RowError:
        quote = self._refresh().get(error.row)
        return error if quote is None else RowError(error.row, _loose_error(quote))


def _loose_error(quote: LooseQuote) -> InputError:
    return InputError(
        "UnterminatedQuote",
        f"a quote opened in this row (at byte {quote.offset:,}) is closed only "
        f"{quote.lines:,} line(s) later, by a quote followed by more text: those lines were "
        "read as part of one cell of this row. Close the quote (a quote inside a quoted "
        'field is written "")',
    )


class _BatchConverter:
    """Converts record batches of raw cell texts into typed columns and per-row errors."""

    def __init__(self, schema: CsvSchema, names: Sequence[str]) -> None:
        self._specs = [(names.index(spec.column), spec) for spec in schema.columns]
        self._null_set = pa.array([v.encode("utf-8") for v in schema.null_values], pa.binary())

    def convert(
        self, batch: pa.RecordBatch, rows: np.ndarray, skipped: tuple[RowError, ...]
    ) -> CellBatch:
        values: dict[str, pa.Array] = {}
        missing_cells: dict[str, list[int]] = {}
        problems: dict[int, list[tuple[str, str, str]]] = {}  # row: (kind, message, column)
        for index, spec in self._specs:
            raw = batch.column(index)
            arr, missing = raw, []
            if len(self._null_set):
                is_null = pc.is_in(raw, value_set=self._null_set)
                if is_null.true_count:
                    missing = pc.indices_nonzero(is_null).to_pylist()
                    arr = pc.if_else(is_null, _NULL_BINARY, raw)
            if spec.is_list:
                typed, bad = convert_list_column(arr, spec.dtype, spec.separator, spec.column)
            else:
                typed, bad_positions = convert_values(arr, spec.dtype)
                bad = {
                    i: f"column {spec.column!r}: {short_repr(arr[i].as_py())} "
                    f"{not_a_value(arr[i].as_py(), spec.dtype)}"
                    for i in bad_positions
                }
            for i, message in bad.items():
                problems.setdefault(i, []).append(("BadCell", message, spec.column))
            if missing and spec.missing == "error":
                for i in missing:
                    text = short_repr(raw[i].as_py())
                    problems.setdefault(i, []).append(
                        (
                            "MissingValue",
                            f"column {spec.column!r}: the value is missing ({text}) and the "
                            "schema says missing: error",
                            spec.column,
                        )
                    )
            values[spec.column] = typed
            missing_cells[spec.column] = missing
        errors = {}
        for i, found in sorted(problems.items()):
            kind, message, _ = found[0]
            if len(found) > 1:
                others = ", ".join(repr(column) for _, _, column in found[1:4])
                more = f" and {len(found) - 4:,} more" if len(found) > 4 else ""
                message += f" (also bad in this row: {others}{more})"
            errors[i] = InputError(kind, message)
        return CellBatch(rows, values, missing_cells, errors, skipped)


class _RowConverter:
    """The per-row view of a CellBatch: a values dict (see ParsedRow) or an InputError per row."""

    def __init__(self, schema: CsvSchema) -> None:
        self._specs = schema.columns
        self._names = [spec.column for spec in schema.columns]

    def rows(self, batch: CellBatch) -> list[dict | InputError]:
        columns = []
        absent: list[tuple[str, list[int]]] = []
        for spec in self._specs:
            typed = batch.values[spec.column]
            if spec.is_list:
                values = typed.values.to_pylist()
                offsets = typed.offsets.to_pylist()
                cells = [tuple(values[offsets[i] : offsets[i + 1]]) for i in range(len(typed))]
            else:
                cells = list(zip(typed.to_pylist()))
            missing = batch.missing[spec.column]
            if missing and spec.missing == "default":
                for i in missing:
                    cells[i] = spec.default
            elif missing and spec.missing == "omit":
                absent.append((spec.column, missing))
            columns.append(cells)
        if columns:
            rows: list = [
                dict(zip(self._names, cells, strict=True)) for cells in zip(*columns, strict=True)
            ]
        else:
            rows = [{} for _ in range(batch.num_rows)]
        for name, positions in absent:
            for i in positions:
                del rows[i][name]
        for i, error in batch.errors.items():
            rows[i] = error
        return rows


def _header_mismatch(
    found: Sequence[str], expected: Sequence[str], source_name: str, schema: CsvSchema
) -> str:
    for position, (got, want) in enumerate(zip(found, expected, strict=False)):
        if got != want:
            detail = (
                f"column {position + 1} is {short_repr(got, 40)}, expected {short_repr(want, 40)}"
            )
            break
    else:
        if len(found) > len(expected):
            detail = f"extra column {short_repr(found[len(expected)], 40)}"
        else:
            detail = f"column {short_repr(expected[len(found)], 40)} is missing"
    origin = f" ({schema.origin})" if schema.origin else ""
    listed = ", ".join(found).replace("\r", "\\r").replace("\n", "\\n")
    if len(listed) > _ROW_TEXT_LIMIT:
        listed = listed[: _ROW_TEXT_LIMIT - 3] + "..."
    return (
        f"the header of {source_name} does not match the schema{origin}: {detail} "
        f"(header: {listed})"
    )
