"""CSV cell parsing (schemas/csv/cells.py): one text, as schema defaults use it, and list cells.

Written for mutation testing (docs/testing.md): `parse_text` had no test of its own, and
`convert_list_column` was tested only through whole tables, which had no column mixing empty,
missing and filled list cells, nor two bad elements in one cell.
"""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from recordforge.schemas.csv.cells import (
    convert_list_column,
    convert_values,
    parse_text,
    short_repr,
)


@pytest.mark.parametrize(
    ("text", "dtype", "value"),
    [
        ("5", "int64", 5),
        (" -3\t", "int64", -3),
        ("+7", "int64", 7),
        ("9223372036854775807", "int64", 9223372036854775807),
        ("1.5", "float", 1.5),
        ("-inf", "float", -math.inf),
        ("2", "float", 2.0),
        ("héllo wörld", "bytes", "héllo wörld".encode()),
        ("", "bytes", b""),
    ],
)
def test_a_text_parses_as_its_dtype(text, dtype, value):
    parsed = parse_text(text, dtype)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    ("text", "dtype", "message"),
    [
        ("x", "int64", "'x' is not an int64"),
        ("1.5", "int64", "'1.5' is not an int64"),
        ("9223372036854775808", "int64", "'9223372036854775808' is outside the int64 range"),
        ("٣", "int64", "'٣' is not an int64"),
        ("abc", "float", "'abc' is not a float"),
        ("", "float", "'' is not a float"),
    ],
)
def test_a_text_that_is_not_of_its_dtype_is_refused_in_words(text, dtype, message):
    with pytest.raises(ValueError) as raised:
        parse_text(text, dtype)
    assert str(raised.value) == message


def test_an_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="unknown dtype 'int32'"):
        parse_text("1", "int32")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # An integer-looking text with a non-ASCII space is no int64 (only ASCII whitespace
        # surrounds a value), not an integer out of range.
        ("\u00a05", "'\\xa05' is not an int64"),
        ("\x1f99999999999999999999", "'\\x1f99999999999999999999' is not an int64"),
        # A float's shape beyond float32 in an int64 column is no int64, not "too large for a
        # float".
        ("1e400", "'1e400' is not an int64"),
        ("1e39", "'1e39' is not an int64"),
    ],
)
def test_an_int64_column_names_what_is_wrong(text, message):
    with pytest.raises(ValueError) as raised:
        parse_text(text, "int64")
    assert str(raised.value) == message


def test_a_list_column_keeps_empty_missing_and_filled_cells_apart():
    """A non-missing empty cell is the empty list, a missing cell is null, and the other cells
    keep their values (the empty ones are nulled on the way, and only they)."""
    cells = pa.array([b"1;2", b"", None, b"3", b"", b"-4;5"], pa.binary())
    typed, messages = convert_list_column(cells, "int64", ";", "c")
    assert typed.to_pylist() == [[1, 2], [], None, [3], [], [-4, 5]]
    assert messages == {}
    # Without missing cells.
    typed, messages = convert_list_column(pa.array([b"", b"7"], pa.binary()), "int64", ";", "c")
    assert typed.to_pylist() == [[], [7]] and messages == {}


def test_every_bad_list_cell_gets_its_message():
    """A cell with two bad elements is reported once, and the cells after it still are."""
    long_element = "x" * 40
    cells = pa.array([b"a;b", b"1", f"2;{long_element}".encode(), b"3;;4"], pa.binary())
    typed, messages = convert_list_column(cells, "int64", ";", "c")
    assert typed[1].as_py() == [1]
    assert messages == {
        0: "column 'c': element 'a' of 'a;b' is not an int64",
        # The element is cut to 30 characters (27 and "..."), the cell to 60.
        2: f"column 'c': element '{'x' * 27}...' of '2;{long_element}' is not an int64",
        3: "column 'c': empty element in list '3;;4'",
    }


def test_cell_text_in_messages_is_cut_past_sixty_characters():
    assert short_repr("a" * 60) == "'" + "a" * 60 + "'"
    assert short_repr("a" * 61) == "'" + "a" * 57 + "...'"
    assert short_repr("b" * 31, 30) == "'" + "b" * 27 + "...'"
    assert short_repr("b" * 30, 30) == "'" + "b" * 30 + "'"
    assert short_repr(b"ab\xff") == "'ab\\xff'"  # undecodable bytes shown as an escape
    assert short_repr(b"a\\xff") == "'a\\\\xff'"  # a backslash typed: doubled, as repr does


@pytest.mark.parametrize("bad_at", [[0], [8], [0, 1], [3, 4, 7], [1, 2, 5, 6, 8], list(range(9))])
def test_texts_the_cast_refuses_are_located_exactly(bad_at):
    """Texts of an integer's shape beyond int64 pass the first check and fail pyarrow's cast:
    the column is bisected to find them. Each is null, the others keep their values."""
    texts = ["99999999999999999999" if i in bad_at else str(i * 11 - 40) for i in range(9)]
    typed, bad = convert_values(pa.array([t.encode() for t in texts], pa.binary()), "int64")
    assert bad == bad_at
    assert typed.type == pa.int64()
    assert typed.to_pylist() == [None if i in bad_at else int(t) for i, t in enumerate(texts)]
