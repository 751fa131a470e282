"""CSV cell parsing (schemas/csv/cells.py) of one text, as schema defaults use it.

Written for mutation testing (docs/testing.md): `parse_text` had no test of its own.
"""

from __future__ import annotations

import math

import pytest

from recordforge.schemas.csv.cells import parse_text


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
