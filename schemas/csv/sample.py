"""Inferring a CSV column's dtype from a sample of its cell texts (`read_sample`, core.tables)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from recordforge.schemas.csv.cells import INT_PATTERN, convert_values, out_of_range

# A cell longer than this is not a number: its column is text (bytes).
_LONGEST_NUMBER = 400


def infer_dtype(values: pa.Array | pa.ChunkedArray, null_values: Sequence[str]) -> str:
    """Infer a column's dtype from sample texts with pyarrow's own CSV type inference.

    Integer -> "int64", floating point -> "float", anything else (strings, dates, booleans, a
    column with no values) -> "bytes". The result is then checked with the converter that reads
    the real rows, so a column pyarrow reads as integers but this tool does not (hex such as
    "0x1F") falls back to the next kind that converts every sample value.

    Args:
        values: the column's cell texts as binary, as read by `read_sample`.
        null_values: cell texts that mean "missing"; they do not count against a dtype.

    Returns:
        One of "int64", "float", "bytes".
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.binary())
    values = values.cast(pa.binary())
    if len(values) == 0:
        return "bytes"
    if (pc.max(pc.binary_length(values)).as_py() or 0) > _LONGEST_NUMBER:
        return "bytes"  # no number is written so long; pyarrow would try every type on it
    try:
        text = values.cast(pa.string())
    except pa.ArrowInvalid:
        return "bytes"  # not UTF-8: certainly not a number
    inferred = _pyarrow_type(text, null_values)
    if pa.types.is_floating(inferred):
        # pyarrow reads an integer beyond int64 as a double, which would make a whole column of
        # integers float (rounded) for one such cell. An integer is an integer however large: the
        # column's type is decided with a stand-in of the same spelling (its digits "0") in
        # place of each, and such a cell is then a BadCell of the int64 column.
        text = _int64_stand_ins(text)
        if text is not None:
            inferred = _pyarrow_type(text, null_values)
            values = text.cast(pa.binary())
    null_set = pa.array([v.encode("utf-8") for v in null_values], pa.binary())
    present = values.filter(pc.invert(pc.is_in(values, value_set=null_set)))
    if pa.types.is_integer(inferred) or (
        # pyarrow reads "+5" as a double, pandas as an integer: a column of integers, some
        # written with a "+", is an int64 column (as float32 its large values would change).
        pa.types.is_floating(inferred) and _all_integers(present)
    ):
        candidates = ("int64", "float")
    elif pa.types.is_floating(inferred):
        candidates = ("float",)
    else:
        return "bytes"
    for dtype in candidates:
        # A number of the dtype too large for it ("1e39" for float32) is a BadCell of its row
        # when the rows are read; it does not make the column another type.
        bad = convert_values(present, dtype)[1]
        if all(out_of_range(present[i].as_py(), dtype) for i in bad):
            return dtype
    return "bytes"


def _pyarrow_type(text: pa.Array, null_values: Sequence[str]) -> pa.DataType:
    """The type pyarrow's CSV reader infers for a column of these texts (with these nulls)."""
    # Round-trip through pyarrow's CSV reader so its inference (with these null values) decides.
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(
        pa.table({"c": text}), sink, write_options=pa_csv.WriteOptions(include_header=False)
    )
    return (
        pa_csv.read_csv(
            pa.BufferReader(sink.getvalue()),
            # One block: a cell of any size is whole in it.
            read_options=pa_csv.ReadOptions(
                column_names=["c"], use_threads=False, block_size=sink.getvalue().size + 1
            ),
            parse_options=pa_csv.ParseOptions(newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(
                null_values=list(null_values),
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )
        .schema.field("c")
        .type
    )


def _all_integers(present: pa.Array) -> bool:
    """Whether every one of these (non-missing) cell texts is an integer literal."""
    matches = pc.match_substring_regex(present.cast(pa.string()), INT_PATTERN)
    return len(present) > 0 and pc.all(pc.fill_null(matches, False)).as_py()


def _int64_stand_ins(text: pa.Array) -> pa.Array | None:
    """The texts with each integer literal outside int64 spelled with "0" for its digits.

    The sign and surrounding whitespace are kept, so pyarrow takes the stand-in as an integer
    exactly when it would take the original were it in range ("+5" it reads as a double).

    Returns:
        The new texts, or None when no text is an integer outside int64.
    """
    integers = pc.fill_null(pc.match_substring_regex(text, INT_PATTERN), False)
    if not integers.true_count:
        return None
    positions = pc.indices_nonzero(integers)
    too_large = convert_values(pc.take(text, positions).cast(pa.binary()), "int64")[1]
    if not too_large:
        return None  # (the grammar matched, so every failure is a number beyond int64)
    mask = np.zeros(len(text), dtype=bool)
    mask[positions.to_numpy()[too_large]] = True
    stand_ins = pc.replace_substring_regex(text, pattern="[0-9]+", replacement="0")
    return pc.if_else(pa.array(mask), stand_ins, text)
