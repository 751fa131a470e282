"""Column-wise conversion of CSV cell text (pyarrow binary arrays) into int64, float and bytes."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

_WHITESPACE = " \t\n\v\f\r"
# The int64 grammar: an optional sign and digits, surrounding ASCII whitespace. Checked by a
# regex first because pyarrow's cast is laxer (it accepts "0x1F") and stricter (it rejects "+5").
INT_PATTERN = r"^[ \t\n\v\f\r]*[+-]?[0-9]+[ \t\n\v\f\r]*$"
# A superset of what pyarrow's string->float cast accepts (checked by fuzzing): texts it rejects
# are bad without a cast, which keeps a column of non-numbers (dates, words) off the slow path.
_FLOAT_SHAPE = (
    r"^[ \t\n\v\f\r]*[+-]?"
    r"(?:[0-9.]+(?:[eE][+-]?[0-9]+)?|[AaFfIiNnTtYy]+(?:\([A-Za-z0-9_]*\))?)"
    r"[ \t\n\v\f\r]*$"
)
# Texts that spell an infinity: written as one (see the README's NaN and infinity policy).
_INFINITY = r"^[ \t\n\v\f\r]*[+-]?(?:inf|infinity)[ \t\n\v\f\r]*$"
_DTYPE_NAMES = {"int64": "an int64", "float": "a float", "bytes": "bytes"}
_EMPTY = pa.scalar(b"", pa.binary())


def short_repr(text: bytes | str, limit: int = 60) -> str:
    """Return a one-line repr of cell text, cut to about `limit` characters.

    Args:
        text: the text; bytes are decoded as UTF-8, undecodable bytes shown as escapes.
        limit: how many characters of the text to keep before adding "...".

    Returns:
        A quoted string such as `'abc'` or `'a very long te...'`.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    # repr shows an undecodable byte (a lone surrogate here) as \udcNN: shown as \xNN, one
    # backslash, as file names are (a backslashreplace before repr doubled it: '\\xe9').
    return _ESCAPED_BYTE.sub(r"\\x\1", repr(text))


_ESCAPED_BYTE = re.compile(r"(?<!\\)\\udc([89a-f][0-9a-f])")


def dtype_phrase(dtype: str) -> str:
    """Return the dtype with an article ("an int64", "a float") for messages."""
    return _DTYPE_NAMES[dtype]


def not_a_value(text: bytes | str | None, dtype: str) -> str:
    """Why a cell text that `convert_values` rejected is bad, as a phrase ("is not a float").

    A number that does not fit its feature type is named as such: an integer outside int64, a
    finite number beyond float32's range (Example floats are float32).
    """
    if out_of_range(text, dtype):
        if dtype == "int64":
            return "is outside the int64 range"
        return "is too large for a float feature (float32, at most ±3.4028235e38)"
    return f"is not {dtype_phrase(dtype)}"


def out_of_range(text: bytes | str | None, dtype: str) -> bool:
    """Whether a cell text `convert_values` rejected is a number of the dtype that does not fit.

    True for an integer literal outside int64 (dtype "int64") and for a finite number beyond
    float32's range, such as "1e39" or "1e400" (dtype "float"; an infinity's name is not one).
    Such a cell is a value of the column's kind, just too large: it does not make its column
    another type (`csv.sample.infer_dtype`), it is a BadCell of its row.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = (text or "").strip(_WHITESPACE)
    if dtype == "int64":
        return re.fullmatch(r"[+-]?[0-9]+", text) is not None
    if dtype == "float" and re.fullmatch(_FLOAT_SHAPE, text):
        try:
            number = float(text)
            struct.pack("<f", number)
            if math.isinf(number):  # "1e400", not an infinity's name
                raise OverflowError
        except OverflowError:
            return True
        except ValueError:
            pass
    return False


def _nonzero(mask: pa.Array) -> list[int]:
    """Return the indices where a boolean array is true (nulls count as false)."""
    if mask.true_count == 0:
        return []
    return pc.indices_nonzero(mask).to_pylist()


def _apply_locating(
    arr: pa.Array, fn: Callable[[pa.Array], pa.Array], out_type: pa.DataType
) -> tuple[pa.Array, list[int]]:
    """Apply a whole-array function, and if it fails, find the elements that make it fail.

    pyarrow has no "cast or null" mode: one bad value fails the whole cast. Bisecting keeps the
    common case (no bad value) at one vectorised call and costs O(k log n) calls for k bad values.

    Returns:
        The result with nulls at the failing positions, and those positions in ascending order.
    """
    try:
        return fn(arr), []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if len(arr) == 1:
        return pa.nulls(1, out_type), [0]
    mid = len(arr) // 2
    left, left_bad = _apply_locating(arr.slice(0, mid), fn, out_type)
    right, right_bad = _apply_locating(arr.slice(mid), fn, out_type)
    return pa.concat_arrays([left, right]), left_bad + [mid + i for i in right_bad]


def _null_where(arr: pa.Array, positions: list[int]) -> pa.Array:
    """Return `arr` with nulls at `positions` (a short list)."""
    mask = [False] * len(arr)
    for i in positions:
        mask[i] = True
    return pc.if_else(pa.array(mask, pa.bool_()), pa.scalar(None, arr.type), arr)


def convert_values(arr: pa.Array, dtype: str) -> tuple[pa.Array, list[int]]:
    """Convert text values to a dtype, column-wise.

    Args:
        arr: binary array of cell texts; nulls (missing cells) stay null.
        dtype: one of "int64", "float", "bytes".

    Returns:
        The typed array (int64, float64 or binary) with nulls where the input was null or the text
        does not convert, and the ascending positions of the texts that do not convert.
    """
    if dtype == "bytes":
        return arr, []
    if dtype == "int64":
        pattern, cast_type, extra = INT_PATTERN, pa.int64(), "+"
    elif dtype == "float":
        pattern, cast_type, extra = _FLOAT_SHAPE, pa.float64(), ""
    else:
        raise ValueError(f"unknown dtype {dtype!r}")
    bad = _nonzero(pc.invert(pc.match_substring_regex(arr, pattern)))
    if bad:
        arr = _null_where(arr, bad)
    # Texts that match are ASCII, so the cast to string cannot fail. pyarrow rejects "+5" as an
    # int64, hence the extra "+" trimmed there.
    text = pc.ascii_rtrim_whitespace(
        pc.ascii_ltrim(arr.cast(pa.string()), characters=_WHITESPACE + extra)
    )
    typed, failed = _apply_locating(text, lambda a: a.cast(cast_type), cast_type)
    if dtype == "float":
        failed += _beyond_float32(typed, text)
    return typed, sorted(bad + failed)


def _beyond_float32(typed: pa.Array, text: pa.Array) -> list[int]:
    """Positions of numbers an Example's float32 cannot hold: they would become infinities.

    Only a text that spells an infinity ("inf", "-Infinity") is one; "1e39" or "1e400" is not.
    """
    narrowed = pc.cast(typed, pa.float32(), safe=False)
    infinite = pc.fill_null(pc.is_inf(narrowed), False)
    if not infinite.true_count:
        return []
    spelled = pc.match_substring_regex(text, _INFINITY, ignore_case=True)
    return _nonzero(pc.and_(infinite, pc.invert(pc.fill_null(spelled, False))))


def convert_list_column(
    arr: pa.Array, dtype: str, separator: str, column: str
) -> tuple[pa.Array, dict[int, str]]:
    """Convert a column of list cells: each text split on `separator`, each element converted.

    A non-missing empty cell is the empty list. An empty element ("1;;2") makes the cell bad.

    Args:
        arr: binary array of cell texts, null where the cell is missing.
        dtype: the element dtype.
        separator: the element separator.
        column: the column name, for messages.

    Returns:
        A list array of typed elements, null where the cell is missing (its content is
        meaningless where the cell is bad), and a BadCell message per bad cell position.
    """
    # Splitting "" would give one empty element; nulling those cells gives zero elements instead.
    empty_cells = pc.fill_null(pc.equal(arr, _EMPTY), False)
    if empty_cells.true_count:
        arr = pc.if_else(empty_cells, pa.scalar(None, pa.binary()), arr)
    lists = pc.split_pattern(arr, pattern=separator)
    elements = lists.flatten()
    typed, bad = convert_values(elements, dtype)
    empty_elements = _nonzero(pc.equal(elements, _EMPTY))
    messages: dict[int, str] = {}
    if bad or empty_elements:
        parents = lists.value_parent_indices()
        empty_set = set(empty_elements)
        for e in sorted(set(bad) | empty_set):
            cell = parents[e].as_py()
            if cell in messages:
                continue
            text = short_repr(arr[cell].as_py())
            if e in empty_set:
                messages[cell] = f"column {column!r}: empty element in list {text}"
            else:
                raw = elements[e].as_py()
                element = short_repr(raw, 30)
                messages[cell] = (
                    f"column {column!r}: element {element} of {text} {not_a_value(raw, dtype)}"
                )
    # Missing cells (and the empty ones nulled above) hold no elements: split_pattern gives
    # null lists empty spans, so the offsets index `typed` directly.
    missing = pc.is_null(arr) if arr.null_count else None
    if missing is not None and empty_cells.true_count:
        missing = pc.and_not(missing, empty_cells)
    typed_lists = pa.ListArray.from_arrays(lists.offsets, typed, mask=missing)
    return typed_lists, messages


def parse_text(text: str, dtype: str) -> int | float | bytes:
    """Convert one text value with the same rules as CSV cells (used for schema defaults).

    Raises:
        ValueError: the text is not a value of the dtype.
    """
    typed, bad = convert_values(pa.array([text.encode("utf-8")], pa.binary()), dtype)
    if bad:
        raise ValueError(f"{short_repr(text)} {not_a_value(text, dtype)}")
    return typed[0].as_py()
