"""Tests for schemas.csv.schema: schema documents, inference, resolution and sampling."""

from __future__ import annotations

import io
import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.schemas.csv.document import PANDAS_NULL_VALUES
from recordforge.schemas.csv.schema import (
    DTYPES,
    ColumnSpec,
    CsvSchema,
    SchemaError,
    parse_schema_document,
    resolve_schema,
)
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.tables.stream import read_sample

BRIEF_DOCUMENT = """\
delimiter: ","
null_values: ["", "NA"]
columns:
  age: int64
  height:
    dtype: float
    missing: {default: 0.0}
  tags:
    dtype: bytes
    list: true
    separator: "|"
    missing: {default: []}
  comment:
    feature: notes/comment
    dtype: bytes
    missing: error
  internal_id:
    drop: true
"""


def sample_of(header: list[str], rows: list[list[str]]):
    data = "\n".join(",".join(r) for r in [header, *rows]).encode() + b"\n"
    return read_sample(io.BytesIO(data))


def resolve_text(text: str, header, rows=None, **kwargs) -> CsvSchema:
    """Parse a document and resolve it against a header (and a sample, if rows are given)."""
    document = parse_schema_document(text, source_name="schema.yaml")
    sample = sample_of(list(header), rows)[1] if rows is not None else None
    return resolve_schema(
        header, document=document, sample=sample, source_name="schema.yaml", **kwargs
    )


# --- documents -----------------------------------------------------------------------------------


def test_brief_document():
    header = ["internal_id", "age", "height", "tags", "comment", "score"]
    rows = [["x1", "30", "1.8", "a|b", "hi", "0.5"], ["x2", "NA", "", "", "yo", "2"]]
    schema = resolve_text(BRIEF_DOCUMENT, header, rows)
    assert schema.columns == (
        ColumnSpec("age", "age", "int64"),
        ColumnSpec("height", "height", "float", missing="default", default=(0.0,)),
        ColumnSpec("tags", "tags", "bytes", True, "|", "default", ()),
        ColumnSpec("comment", "notes/comment", "bytes", missing="error"),
        ColumnSpec("score", "score", "float"),  # not in the document: inferred
    )
    assert schema.null_values == ("", "NA")
    assert schema.delimiter == ","
    assert schema.header == tuple(header)
    assert schema.dropped == ("internal_id",)
    assert schema.origin == "schema.yaml; other columns inferred from the first 2 rows"
    assert schema.column("comment").feature == "notes/comment"
    with pytest.raises(KeyError):
        schema.column("internal_id")


def test_json_document():
    text = json.dumps(
        {
            "null_values": ["-"],
            "columns": {
                "b": {"dtype": "int64", "list": True, "missing": {"default": [1, "2"]}},
                "a": "float",
            },
        }
    )
    schema = resolve_text(text, ["a", "b"])
    assert schema.columns == (
        ColumnSpec("a", "a", "float"),
        ColumnSpec("b", "b", "int64", True, ";", "default", (1, 2)),
    )
    assert schema.origin == "schema.yaml"
    assert schema.header == ()  # nothing dropped


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        ("{dtype: int64, missing: {default: 42}}", (42,)),
        ("{dtype: int64, missing: {default: ' -42 '}}", (-42,)),
        ("{dtype: int64, missing: {default: -9223372036854775808}}", (-(2**63),)),
        ("{dtype: float, missing: {default: 0}}", (0.0,)),
        ("{dtype: float, missing: {default: 2.5}}", (2.5,)),
        ("{dtype: float, missing: {default: '1e3'}}", (1000.0,)),
        ("{dtype: float, missing: {default: .inf}}", (math.inf,)),
        ("{dtype: float, missing: {default: '-inf'}}", (-math.inf,)),
        ("{dtype: bytes, missing: {default: NA}}", (b"NA",)),
        ("{dtype: bytes, missing: {default: ''}}", (b"",)),
        ("{dtype: bytes, missing: {default: 'é'}}", ("é".encode(),)),
        ("{dtype: bytes, list: true, missing: {default: [x, y]}}", (b"x", b"y")),
        ("{dtype: float, list: true, missing: {default: [1, 2.5]}}", (1.0, 2.5)),
        ("{dtype: int64, missing: omit}", ()),
        ("{dtype: int64, missing: error}", ()),
    ],
)
def test_defaults(column, expected):
    schema = resolve_text(f"columns:\n  a: {column}\n", ["a"])
    default = schema.column("a").default
    assert default == expected
    assert all(type(v) is type(e) for v, e in zip(default, expected, strict=True))


def test_float_nan_default():
    schema = resolve_text("columns:\n  a: {dtype: float, missing: {default: nan}}\n", ["a"])
    assert math.isnan(schema.column("a").default[0])


def test_integer_yaml_key_names_a_column():
    document = parse_schema_document("columns:\n  2024: int64\n", source_name="s.yaml")
    assert document == {"columns": {"2024": "int64"}}
    assert resolve_text("columns:\n  2024: int64\n", ["2024"]).columns == (
        ColumnSpec("2024", "2024", "int64"),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the schema file is empty"),
        ("- a\n- b\n", "the schema must be a mapping with a 'columns' key, not list"),
        ("42\n", "the schema must be a mapping with a 'columns' key, not int"),
        ("colums: {}\n", "unknown key 'colums' (allowed: delimiter, null_values, columns)"),
        (
            "columns: [age]\n",
            "columns must be a mapping from column name to dtype or settings, not list",
        ),
        (
            "columns:\n  age: str\n",
            "column 'age': unknown dtype 'str' (allowed: int64, float, bytes)",
        ),
        (
            "columns:\n  age: {dtype: float32}\n",
            "column 'age': unknown dtype 'float32' (allowed: int64, float, bytes)",
        ),
        (
            "columns:\n  age: {dtype: int64, nullable: true}\n",
            "column 'age': unknown key 'nullable' "
            "(allowed: dtype, feature, list, separator, missing, drop)",
        ),
        ("columns:\n  age:\n", "column 'age': expected a dtype (int64, float, bytes) or a mapping"),
        (
            "columns:\n  age: [int64]\n",
            "column 'age': expected a dtype (int64, float, bytes) or a mapping",
        ),
        ("columns:\n  yes: int64\n", "column name True must be a string (quote it)"),
        (
            "columns:\n  age: {dtype: int64, missing: {default: abc}}\n",
            "column 'age': default 'abc' is not an int64",
        ),
        (
            "columns:\n  age: {dtype: int64, missing: {default: 1.5}}\n",
            "column 'age': default 1.5 is not an int64",
        ),
        (
            "columns:\n  age: {dtype: int64, missing: {default: '0x10'}}\n",
            "column 'age': default '0x10' is not an int64",
        ),
        (
            "columns:\n  age: {dtype: int64, missing: {default: 9223372036854775808}}\n",
            "column 'age': default 9223372036854775808 is not an int64",
        ),
        (
            "columns:\n  age: {dtype: int64, missing: {default: true}}\n",
            "column 'age': default True is not an int64",
        ),
        (
            "columns:\n  age: {dtype: int64, missing: {default: null}}\n",
            "column 'age': default None is not an int64",
        ),
        (
            "columns:\n  h: {dtype: float, missing: {default: tall}}\n",
            "column 'h': default 'tall' is not a float",
        ),
        (
            "columns:\n  c: {dtype: bytes, missing: {default: 0}}\n",
            "column 'c': default 0 for a bytes column must be a string (quote it)",
        ),
        (
            "columns:\n  t: {dtype: int64, list: true, missing: {default: 1}}\n",
            "column 't': the default of a list column must be a list, not 1",
        ),
        (
            "columns:\n  t: {dtype: int64, list: true, missing: {default: [1, x]}}\n",
            "column 't': default 'x' is not an int64",
        ),
        (
            "columns:\n  t: {dtype: int64, missing: {default: [1]}}\n",
            "column 't': the default of a scalar column must be one value",
        ),
        (
            "columns:\n  t: {dtype: int64, missing: default}\n",
            "column 't': missing must be omit, error or {default: value}, not 'default'",
        ),
        (
            "columns:\n  t: {dtype: int64, missing: {default: 1, also: 2}}\n",
            "column 't': missing must be omit, error or {default: value}, "
            "not {'default': 1, 'also': 2}",
        ),
        (
            "columns:\n  t: {dtype: bytes, separator: '|'}\n",
            "column 't': separator is only allowed with list: true",
        ),
        (
            "columns:\n  t: {dtype: bytes, list: true, separator: ''}\n",
            "column 't': separator must be a non-empty string, not ''",
        ),
        (
            "columns:\n  t: {dtype: bytes, list: 'yes please'}\n",
            "column 't': list must be true or false, not 'yes please'",
        ),
        (
            "columns:\n  t: {drop: true, dtype: bytes}\n",
            "column 't': a dropped column takes no other keys",
        ),
        ("columns:\n  t: {drop: 1}\n", "column 't': drop must be true or false, not 1"),
        (
            "columns:\n  t: {feature: ''}\n",
            "column 't': feature must be a non-empty string, not ''",
        ),
        (
            "null_values: [NA, null]\n",
            "null_values must be a list of strings (quote values such as 'null'), not ['NA', None]",
        ),
        (
            "null_values: NA\n",
            "null_values must be a list of strings (quote values such as 'null'), not 'NA'",
        ),
        (
            "delimiter: ',,'\n",
            "delimiter must be one ASCII character other than a quote or a line end, not ',,'",
        ),
        (
            "delimiter: '\"'\n",
            "delimiter must be one ASCII character other than a quote or a line end, not '\"'",
        ),
        (
            "columns:\n  a: int64\n  a: float\n",
            "not valid YAML or JSON (line 3, column 3): duplicate key 'a'",
        ),
        (
            '{"columns": {"a": "int64", "a": "float"}}',
            "not valid YAML or JSON (line 1, column 28): duplicate key 'a'",
        ),
        (
            "columns: [a, b\n",
            "not valid YAML or JSON (line 2, column 1): "
            "expected ',' or ']', but got '<stream end>'",
        ),
        (
            "columns:\n  a: int64\n b: float\n",
            "not valid YAML or JSON (line 3, column 2): "
            "expected <block end>, but found '<block mapping start>'",
        ),
    ],
)
def test_document_errors(text, message):
    with pytest.raises(SchemaError) as info:
        parse_schema_document(text, source_name="schema.yaml")
    assert str(info.value) == "schema.yaml: " + message


@pytest.mark.parametrize(
    ("text", "header", "message"),
    [
        (
            "columns:\n  heigth: float\n",
            ["age", "height", "tags"],
            "schema.yaml: column 'heigth' is not in the CSV header (columns: age, height, tags)",
        ),
        (
            "columns:\n  a: {dtype: int64, feature: x}\n  b: {dtype: int64, feature: x}\n",
            ["a", "b"],
            "schema.yaml: columns 'a' and 'b' both write feature 'x'",
        ),
        (
            "columns:\n  a: {dtype: int64, feature: b}\n  b: int64\n",
            ["a", "b"],
            "schema.yaml: columns 'a' and 'b' both write feature 'b'",
        ),
        (
            "columns:\n  a: int64\n",
            ["a", "b", "a"],
            "schema.yaml: the CSV header has column 'a' more than once",
        ),
        (
            "columns:\n  a: int64\n",
            ["a", "b"],
            "schema.yaml: column 'b' has no dtype and there is no sample to infer it from",
        ),
        (
            "columns:\n  a: {feature: x}\n",
            ["a"],
            "schema.yaml: column 'a' has no dtype and there is no sample to infer it from",
        ),
        (
            "columns:\n  a: int64\n  '': bytes\n",
            ["a", ""],
            "schema.yaml: the CSV column at position 2 has no name; "
            "give it a feature key or drop it",
        ),
        (
            "delimiter: ';'\n",
            ["a"],
            "schema.yaml: the schema's delimiter ';' differs from the delimiter ',' "
            "the CSV was read with",
        ),
    ],
)
def test_resolve_errors(text, header, message):
    with pytest.raises(SchemaError) as info:
        resolve_text(text, header)
    assert str(info.value) == message


def test_long_header_is_shortened_in_the_message():
    header = [f"column_{i}" for i in range(100)]
    with pytest.raises(SchemaError) as info:
        resolve_text("columns:\n  nope: int64\n", header)
    message = str(info.value)
    assert message.startswith("schema.yaml: column 'nope' is not in the CSV header (columns: ")
    assert message.endswith(", ...)") and len(message) < 200


def test_schema_error_is_one_line_even_for_names_with_newlines():
    with pytest.raises(SchemaError) as info:
        resolve_text("columns:\n  a: int64\n", ["a", "b\nc"], rows=None)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_empty_column_name_can_be_dropped_or_named():
    schema = resolve_text("columns:\n  '': {drop: true}\n  a: int64\n", ["a", ""])
    assert [c.column for c in schema.columns] == ["a"] and schema.header == ("a", "")
    schema = resolve_text("columns:\n  '': {dtype: bytes, feature: unnamed}\n", [""])
    assert schema.columns == (ColumnSpec("", "unnamed", "bytes"),)


def test_delimiter_from_the_document_must_match_the_read():
    schema = resolve_text("delimiter: ';'\ncolumns: {a: int64}\n", ["a"], delimiter=";")
    assert schema.delimiter == ";"


# --- inference -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "null_values", "dtype"),
    [
        (["1", "2", "-3"], None, "int64"),
        (["1", "", "3"], None, "int64"),  # empty cells are missing, not text
        (["007", "10"], None, "int64"),
        ([" 5 ", "6"], None, "int64"),
        (["1", "2.5"], None, "float"),
        (["1", "1.0"], None, "float"),
        (["1e3", "-2E-2"], None, "float"),
        (["nan", "1"], None, "int64"),  # pandas' null values by default: nan is missing
        (["nan", "1"], [""], "float"),
        (["inf", "-inf"], None, "float"),
        # Integers beyond int64 are integers still (pyarrow reads them as doubles): the column
        # is int64 and those cells BadCells when read (README, "Bad input").
        (["9223372036854775808"], None, "int64"),
        (["1", "16777217", "9007199254740993", "18446744073709551616"], None, "int64"),
        (["-9223372036854775809", "5", "NA"], None, "int64"),
        ([" 18446744073709551616 ", "007"], None, "int64"),
        (["18446744073709551616", "2.5"], None, "float"),  # a decimal: float, as before
        # pyarrow reads "+5" as a double; pandas, and recordforge, as an integer (a float
        # column made 123456789 123456792 and renumbered integer labels: a tester's finding).
        (["+5", "2"], None, "int64"),
        (["+5", "-2", "123456789", "NA"], None, "int64"),
        (["+18446744073709551616", "2"], None, "int64"),  # too large: a BadCell, as unsigned
        (["+5", "2.5"], None, "float"),
        (["18446744073709551616", "x"], None, "bytes"),
        (["18446744073709551616", "0x1F"], None, "bytes"),
        # A finite number beyond float32 is a float still: a BadCell when read, not text.
        (["1.5", "2.25", "1e39"], None, "float"),
        (["1.5", "-1e400", "3.4028234e38"], None, "float"),
        (["1", "1E39"], None, "float"),
        (["1e39"], None, "float"),
        (["1.5", "1e39", "abc"], None, "bytes"),
        (["1", "NA"], ["", "NA"], "int64"),
        (["1", "NA"], None, "int64"),  # NA is missing, as pandas reads it
        (["1", "NA"], [""], "bytes"),
        (["a", "1"], None, "bytes"),
        (["2024-01-02", "2024-02-03"], None, "bytes"),  # dates
        (["2024-01-02 10:00:00", "2024-01-02T11:30:00"], None, "bytes"),  # timestamps
        (["10:00:00"], None, "bytes"),  # times
        (["true", "false"], None, "bytes"),  # booleans keep their text
        (["", ""], None, "bytes"),  # empty in the whole sample
        (["0x1F", "0x2"], None, "bytes"),  # pyarrow says int64; the reader does not take hex
    ],
)
def test_inference(values, null_values, dtype):
    header, sample = sample_of(["x", "pad"], [[v, "p"] for v in values])
    document = {"null_values": null_values} if null_values is not None else None
    schema = resolve_schema(header, document=document, sample=sample, source_name="a.csv")
    assert schema.column("x") == ColumnSpec("x", "x", dtype)  # scalar, missing="omit"


def _inferred(cells: list[str]) -> str:
    header, sample = sample_of(["x", "pad"], [[c, "p"] for c in cells])
    return (
        resolve_schema(header, document=None, sample=sample, source_name="a.csv").columns[0].dtype
    )


_INT64_TEXT = st.integers(-(2**63), 2**63 - 1).map(str)
_BEYOND_INT64 = st.one_of(st.integers(2**63, 10**40), st.integers(-(10**40), -(2**63) - 1)).map(str)
_FLOAT_TEXT = st.floats(-3e38, 3e38, allow_nan=False).map(lambda f: f"{f:.6e}")
_BEYOND_FLOAT32 = st.tuples(st.sampled_from(["", "-"]), st.integers(39, 300)).map(
    lambda t: f"{t[0]}1.5e{t[1]}"
)


@settings(max_examples=60, deadline=None)
@given(
    cells=st.lists(st.one_of(_INT64_TEXT, st.just("NA")), min_size=1, max_size=20),
    beyond=st.lists(_BEYOND_INT64, min_size=1, max_size=3),
    data=st.data(),
)
def test_integers_beyond_int64_do_not_change_an_int64_column(cells, beyond, data):
    if all(c == "NA" for c in cells):
        cells.append("1")
    assert _inferred(cells) == "int64"
    for text in beyond:
        cells.insert(data.draw(st.integers(0, len(cells))), text)
    assert _inferred(cells) == "int64"


@settings(max_examples=60, deadline=None)
@given(
    cells=st.lists(_FLOAT_TEXT, min_size=1, max_size=20),
    beyond=st.lists(_BEYOND_FLOAT32, min_size=1, max_size=3),
    data=st.data(),
)
def test_numbers_beyond_float32_do_not_change_a_float_column(cells, beyond, data):
    assert _inferred(cells) == "float"
    for text in beyond:
        cells.insert(data.draw(st.integers(0, len(cells))), text)
    assert _inferred(cells) == "float"


def test_inference_of_invalid_utf8_and_of_a_header_only_file():
    header, sample = read_sample(io.BytesIO(b"x,y\n\xff,1\n"))
    schema = resolve_schema(header, document=None, sample=sample, source_name="a.csv")
    assert [c.dtype for c in schema.columns] == ["bytes", "int64"]
    header, sample = read_sample(io.BytesIO(b"x,y\n"))
    schema = resolve_schema(header, document=None, sample=sample, source_name="a.csv")
    assert [c.dtype for c in schema.columns] == ["bytes", "bytes"]
    assert schema.origin == "inferred from the first 0 rows of a.csv"


def test_all_inferred_schema():
    header, sample = sample_of(["a", "b", "c"], [["1", "x", "1.5"], ["2", "y", "2"]])
    schema = resolve_schema(header, document=None, sample=sample, source_name="a.csv")
    assert schema == CsvSchema(
        columns=(
            ColumnSpec("a", "a", "int64"),
            ColumnSpec("b", "b", "bytes"),
            ColumnSpec("c", "c", "float"),
        ),
        null_values=PANDAS_NULL_VALUES,  # pandas' read_csv defaults
        origin="inferred from the first 2 rows of a.csv",
    )
    assert DTYPES == ("int64", "float", "bytes")


# --- to_dict / from_dict -------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip():
    header = ["internal_id", "age", "height", "tags", "comment", "score"]
    schema = resolve_text(BRIEF_DOCUMENT, header, [["1", "2", "3", "4", "5", "6"]])
    data = schema.to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert CsvSchema.from_dict(data) == schema
    assert data["header"] == header
    assert data["columns"][1] == {
        "column": "height",
        "feature": "height",
        "dtype": "float",
        "list": False,
        "separator": ";",
        "missing": "default",
        "default": [0.0],
    }


def test_to_dict_of_special_defaults():
    schema = CsvSchema(
        columns=(
            ColumnSpec("f", "f", "float", True, ";", "default", (math.nan, math.inf, -1.5)),
            ColumnSpec("b", "b", "bytes", missing="default", default=("é".encode(),)),
            ColumnSpec("i", "i", "int64", missing="default", default=(2**63 - 1,)),
        ),
        null_values=("", "NA"),
        delimiter="\t",
        origin="x.json",
    )
    data = schema.to_dict()
    text = json.dumps(data, allow_nan=False)
    assert data["columns"][0]["default"] == ["nan", "inf", -1.5]
    back = CsvSchema.from_dict(json.loads(text))
    assert back.to_dict() == data
    assert math.isnan(back.columns[0].default[0]) and back.columns[0].default[1:] == (
        math.inf,
        -1.5,
    )
    assert back.columns[1:] == schema.columns[1:]
    assert back.header == () and back.null_values == ("", "NA") and back.delimiter == "\t"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dtype": "string"},
        {"dtype": "int64", "missing": "sometimes"},
        {"dtype": "int64", "default": (1,)},  # a default needs missing="default"
        {"dtype": "int64", "missing": "default", "default": ()},
        {"dtype": "int64", "missing": "default", "default": (1.0,)},
    ],
)
def test_column_spec_rejects_inconsistent_values(kwargs):
    with pytest.raises(ValueError):
        ColumnSpec("a", "a", **kwargs)


# --- read_sample ---------------------------------------------------------------------------------


def test_read_sample_reads_text_and_skips_rows_with_wrong_field_counts():
    data = b'\xef\xbb\xbfa,b\r\n1,"x,\r\ny"\r\n2\r\n3,z,extra\r\n4,w'
    header, sample = read_sample(io.BytesIO(data))
    assert header == ["a", "b"]
    assert sample.to_pydict() == {"a": [b"1", b"4"], "b": [b"x,\r\ny", b"w"]}


def test_read_sample_limits_rows_and_is_deterministic():
    data = b"n\n" + b"".join(b"%d\n" % i for i in range(1000))
    header, sample = read_sample(io.BytesIO(data), max_rows=10)
    assert sample.column(0).to_pylist() == [b"%d" % i for i in range(10)]
    assert read_sample(io.BytesIO(data), max_rows=10)[1].equals(sample)


class EndlessCsv:
    """A non-seekable stream of an endless CSV, to show sampling stops after max_rows."""

    def __init__(self) -> None:
        self.rows = itertools.count()
        self.bytes_read = 0
        self.buffer = b"a;b\n"

    def read(self, size: int = -1) -> bytes:
        assert size is not None and size >= 0, "the whole stream must not be requested"
        if len(self.buffer) < size:
            rows = itertools.islice(self.rows, size // 4 + 1)  # rows are at least 4 bytes
            self.buffer += b"".join(b"%d;x\n" % i for i in rows)
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        self.bytes_read += len(data)
        return data


@pytest.mark.parametrize("max_rows", [500, 300_000])
def test_read_sample_reads_a_bounded_prefix_of_a_non_seekable_stream(max_rows):
    stream = EndlessCsv()
    header, sample = read_sample(stream, delimiter=";", max_rows=max_rows)
    assert header == ["a", "b"]
    assert sample.column(0).to_pylist() == [b"%d" % i for i in range(max_rows)]
    assert sample.column(1).to_pylist() == [b"x"] * max_rows
    needed = sum(len(b"%d;x\n" % i) for i in range(max_rows))
    assert stream.bytes_read <= max(2 * needed, 1 << 20) + (1 << 16)


def test_read_sample_of_header_without_newline():
    header, sample = read_sample(io.BytesIO(b"a,b"))
    assert header == ["a", "b"] and sample.num_rows == 0


def test_read_sample_of_an_empty_file():
    with pytest.raises(InputError) as info:
        read_sample(io.BytesIO(b""))
    assert info.value.kind == "UnreadableCsv"
    assert info.value.message == "not a readable CSV file: Empty CSV file"
