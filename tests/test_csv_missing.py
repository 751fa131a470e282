"""pandas-style CSVs (issue 16, item 5): pandas' missing-value texts by default (checked against
the installed pandas), --null-values, a written DataFrame index, another delimiter."""

from __future__ import annotations

import io
import json
import math

import pytest
from conftest import make_image, read_dataset, read_errors

from recordforge.schemas.csv.document import PANDAS_NULL_VALUES

pd = pytest.importorskip("pandas")

# Texts near the missing ones that pandas reads as values: the list must not grow past pandas'.
NOT_MISSING = ("NAN", "Nan", "none", "NONE", "na", "Null", "nil", "-", "#N/A N/A ", "inf", "0")


def _pandas_missing(texts) -> list[bool]:
    """Which texts pandas' read_csv (its defaults) reads as missing, in a text column."""
    csv = "c\n" + "".join(f"{text}\n" if text else '""\n' for text in texts)
    column = pd.read_csv(io.StringIO(csv), dtype=str, skip_blank_lines=False)["c"]
    return column.isna().tolist()


def test_default_null_values_are_pandas_defaults():
    texts = [*PANDAS_NULL_VALUES, *NOT_MISSING]
    expected = [True] * len(PANDAS_NULL_VALUES) + [False] * len(NOT_MISSING)
    assert _pandas_missing(texts) == expected


def _tokens_csv(path):
    """A float, an int64 and a text column with every pandas missing-value text in turn."""
    tokens = [t for t in PANDAS_NULL_VALUES if t]
    lines = ["id,f,i,t"] + [f"{n},1.5,7,x{n}" for n in range(3)]
    lines += [f"{n + 3},{tok},{tok},{tok}" for n, tok in enumerate(tokens)]
    lines += ["99,,,", "100,inf,8,y"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_missing_texts_leave_the_feature_out_as_pandas_reads_them(tmp_path, cli, tf):
    csv = _tokens_csv(tmp_path / "t.csv")
    out = tmp_path / "out"
    result = cli("convert", csv, "-o", out)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    # The missing texts no longer turn numeric columns into text.
    assert {k: v["dtype"] for k, v in info["features"].items()} == {
        "id": "int64",
        "f": "float",
        "i": "int64",
        "t": "bytes",
    }
    assert info["source"]["csv_schema"]["null_values"] == list(PANDAS_NULL_VALUES)
    frame = pd.read_csv(csv)
    by_id = {int(r["id"]): r for r in splits["train"]}
    assert len(by_id) == len(frame)
    for _, row in frame.iterrows():
        record = by_id[int(row["id"])]
        for column in ("f", "i", "t"):
            # A missing cell of any dtype: the feature is absent from that Example (an empty
            # VarLen value), exactly where pandas has NaN.
            assert (len(record[column]) == 0) == bool(pd.isna(row[column])), (row, column)
    assert math.isinf(by_id[100]["f"][0])  # inf is a value, in pandas too
    assert by_id[0]["f"] == [1.5] and by_id[0]["t"] == [b"x0"]


def test_null_values_option(tmp_path, cli, tf):
    csv = tmp_path / "t.csv"
    csv.write_text("id,f,t\n0,1.5,a\n1,nan,NA\n2,,missing\n")
    out = tmp_path / "only-empty"
    result = cli("convert", csv, "-o", out, "--null-values", "")
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    records = {int(r["id"]): r for r in splits["train"]}
    # Only the empty cell is missing: nan is IEEE NaN, NA is text.
    assert info["features"]["f"]["dtype"] == "float"
    assert math.isnan(records[1]["f"][0]) and records[2]["f"] == []
    assert records[1]["t"] == b"NA"  # never missing: a scalar feature
    assert info["options"]["null_values"] == [""]
    out = tmp_path / "custom"
    result = cli("convert", csv, "-o", out, "--null-values", "missing, NA")
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    records = {int(r["id"]): r for r in splits["train"]}
    assert info["source"]["csv_schema"]["null_values"] == ["", "missing", "NA"]
    assert records[1]["t"] == [] and records[2]["t"] == [] and records[0]["t"] == [b"a"]
    assert math.isnan(records[1]["f"][0])  # nan is not among them: a value


def test_a_written_dataframe_index_is_named_and_dropped_on_request(tmp_path, cli, tf):
    frame = pd.DataFrame({"x": [3, 1, 4, 1, 5], "name": list("abcde")})
    csv = tmp_path / "frame.csv"
    frame.to_csv(csv)  # index=True: an unnamed first column 0..4
    result = cli("plan", csv)
    assert result.returncode == 2
    assert "DataFrame index" in result.stderr and "index=False" in result.stderr
    assert "--drop-index" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    out = tmp_path / "out"
    result = cli("convert", csv, "-o", out, "--drop-index")
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert set(info["features"]) == {"x", "name"}
    assert sorted(int(r["x"]) for r in splits["train"]) == [1, 1, 3, 4, 5]
    assert info["options"]["drop_index"] is True
    # The same frame written with index=False (under the same name: it is part of the record
    # keys) gives the same shards.
    plain = tmp_path / "plain" / "frame.csv"
    plain.parent.mkdir()
    frame.to_csv(plain, index=False)
    again = tmp_path / "again"
    assert cli("convert", plain, "-o", again, "--name", "out").returncode == 0
    for shard in out.glob("*.tfrecord-*"):
        assert (again / shard.name).read_bytes() == shard.read_bytes()


def test_index_mistakes_are_usage_errors(tmp_path, cli):
    named = tmp_path / "named.csv"
    named.write_text("a,b\n0,1\n1,2\n")
    result = cli("plan", named, "--drop-index")
    assert result.returncode == 2 and "is named 'a', not an unnamed index" in result.stderr
    unnamed = tmp_path / "unnamed.csv"
    unnamed.write_text(",b\n5,1\n9,2\n")  # no name, but not 0..n-1
    result = cli("plan", unnamed)
    assert result.returncode == 2 and "has no name" in result.stderr
    assert "DataFrame index" not in result.stderr and "--drop-index" in result.stderr
    make_image(tmp_path / "img" / "a.png", "PNG")
    for option in (["--null-values", "NA"], ["--drop-index"]):
        result = cli("plan", tmp_path / "img", *option)
        assert result.returncode == 2 and "applies to CSV inputs" in result.stderr


def test_a_rewritten_index_column_is_warned_about(tmp_path, cli):
    csv = tmp_path / "twice.csv"
    pd.read_csv(io.StringIO(",x\n0,5\n1,6\n")).to_csv(csv, index=False)  # "Unnamed: 0"
    result = cli("plan", csv, "--json")
    assert result.returncode == 0, result.stderr
    assert "'Unnamed: 0', holds 0, 1, 2" in result.stderr and "index=False" in result.stderr


@pytest.mark.parametrize(
    ("header", "warned"),
    [
        ("a;b;c", "a single column named 'a;b;c': is it separated by ';'"),
        ("a;b;c,d", "a header of 2 columns holding 2 ';': is it separated by ';'"),
        ("a|b|c|d,e", "is it separated by '|'"),
        ("a\tb\tc", "is it separated by '\\\\t'"),
        ("a,b;c", None),  # one semicolon in two columns: a name that holds one
    ],
)
def test_another_delimiter_in_the_header_is_warned_about(tmp_path, cli, header, warned):
    csv = tmp_path / "t.csv"
    fields = len(header.split(","))
    csv.write_text(header + "\n" + ",".join(["1"] * fields) + "\n")
    result = cli("plan", csv, "--json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)
    if warned:
        assert warned in result.stderr
    else:
        assert "separated by" not in result.stderr


@pytest.mark.parametrize("with_images", [False, True], ids=["table", "images"])
def test_a_missing_label_says_the_value_is_missing_not_that_the_cell_is_empty(
    tmp_path, cli, with_images
):
    # `NA` is not an empty cell: the reader takes it as missing, and the message says so.
    if with_images:
        make_image(tmp_path / "a.jpg", "JPEG")
        head, cells = "image,label", ["a.jpg,cat", "a.jpg,NA", "a.jpg,"]
    else:
        head, cells = "x,label", ["1,cat", "2,NA", "3,"]
    (tmp_path / "t.csv").write_text("\n".join([head, *cells]) + "\n")
    out = tmp_path / "out"
    result = cli("convert", tmp_path / "t.csv", "-o", out, "--label-column", "label")
    assert result.returncode == 0, result.stderr
    errors = read_errors(out)
    assert [(e["error"], e["source"]["row"], e["message"]) for e in errors] == [
        (
            "MissingLabel",
            row,
            "label column 'label' has a missing value: its cell is empty or a text read as "
            "missing, such as NA (--null-values sets those texts)",
        )
        for row in (2, 3)
    ]
