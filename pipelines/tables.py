"""A pandas DataFrame or a pyarrow Table as the input of a conversion: staged as a CSV file.

The table is written once, as the CSV file its own library writes (`df.to_csv(index=False)`,
`pyarrow.csv.write_csv`), and converted as that file: the same reader, type inference, per-row
errors, record keys and order as the same data given as CSV, with no second reader to keep in
step (an Arrow IPC path would need its own type mapping and its own errors). The workers read
the file in blocks from storage as they read any CSV, so the rows never travel inside the
pipeline's graph (as `beam.Create` would put them) nor through a shuffle, and workers on other
machines reach it under Beam's --temp_location.

The file is always called `table.csv` (its name is part of every record key, so of the split
and order hashes); relative image paths in its cells are taken from the caller's working
folder; the errors files name the table (`<pandas.DataFrame>`) rather than the staged file,
which is deleted when the call returns.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.transforms.core.errors import OutOfSpace, UsageError, out_of_space_message
from recordforge.transforms.core.files.filenames import from_os
from recordforge.transforms.write import remove_tree

STAGED_NAME = "table.csv"
DATAFRAME = "<pandas.DataFrame>"
ARROW_TABLE = "<pyarrow.Table>"


@dataclass(frozen=True)
class StagedTable:
    """A table written as a CSV file for the run.

    Attributes:
        path: the staged CSV file.
        label: how messages, the manifest and the errors files name it.
        references: the folder relative image paths in its cells are resolved against.
    """

    path: str
    label: str
    references: str


def table_kind(value) -> str | None:
    """DATAFRAME or ARROW_TABLE for a table recordforge can convert, else None.

    Neither library is imported here: a value can only be a DataFrame if pandas was imported
    to make it.
    """
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.DataFrame):
        return DATAFRAME
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None and isinstance(value, pyarrow.Table):
        return ARROW_TABLE
    return None


@contextlib.contextmanager
def staged_table(table, temp_location: str | None) -> Iterator[StagedTable]:
    """Write `table` as `table.csv` in a fresh folder (under `temp_location` when given, else
    a local temporary folder); the folder is removed when the context ends.

    Raises:
        UsageError: the table has no columns or no rows (a CSV file needs a header and a row).
        OutOfSpace: the disk or quota ran out while the table was written (the message names
            the file), a RunFailed.
    """
    kind = table_kind(table)
    if kind is None:
        raise UsageError(f"not a pandas DataFrame or a pyarrow Table: {type(table).__name__}")
    if table.shape[1] == 0 or table.shape[0] == 0:
        raise UsageError(f"the {kind} has no rows or no columns: there is nothing to convert")
    if temp_location:
        folder = FileSystems.join(temp_location, f"recordforge-table-{uuid.uuid4().hex}")
        FileSystems.mkdirs(folder)
    else:
        folder = tempfile.mkdtemp(prefix="recordforge-table-")
    try:
        path = FileSystems.join(folder, STAGED_NAME)
        try:
            with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                _write_csv(table, kind, f)
        except OSError as error:  # a bare OSError naming no file came out of convert()
            message = out_of_space_message(error, f"{kind} staged as CSV", path)
            if message is None:
                raise
            raise OutOfSpace(message) from None
        yield StagedTable(path, kind, from_os(os.getcwd()))
    finally:
        remove_tree(folder)


def _write_csv(table, kind: str, stream) -> None:
    if kind == DATAFRAME:
        # As df.to_csv(path, index=False) writes a file: UTF-8, "\n" line ends.
        text = io.TextIOWrapper(stream, encoding="utf-8", newline="")
        table.to_csv(text, index=False)
        text.flush()
        text.detach()
    else:
        import pyarrow as pa
        import pyarrow.csv

        nested = [
            f"{name!r} ({kind})"
            for name, kind in zip(table.column_names, table.schema.types, strict=True)
            if pa.types.is_nested(kind)
        ]
        if nested:
            raise UsageError(
                f"the Table's column {', '.join(nested)} holds lists or structs, which a CSV "
                "cell (what recordforge reads a Table as) cannot; make them text first"
            )
        try:
            pyarrow.csv.write_csv(table, stream)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:  # binary not UTF-8
            raise UsageError(
                f"the Table cannot be written as CSV, which recordforge reads it as: {error}; "
                "make such columns text first (or give a DataFrame)"
            ) from None
