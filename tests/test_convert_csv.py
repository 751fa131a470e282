"""End to end: CSV files (tabular, and naming images) through the CLI, read back with TensorFlow."""

from __future__ import annotations

import csv
import gzip
import io
import json

import pytest
from conftest import make_image, read_dataset, read_errors

TRICKY = (
    "id,name,score,note\n"
    "1,plain,0.5,simple\n"
    '2,"with, comma",1.25,"quoted ""inner"" quotes"\n'
    '3,"multi\nline",-2,"naïve café ☕"\n'
    "4,empty score,,\n"
    "5,too,many,fields,here\n"
    "6,last,3e2,no newline at end"
)


@pytest.fixture
def tricky_csv(tmp_path):
    path = tmp_path / "table.csv"
    path.write_bytes(TRICKY.encode("utf-8"))
    return path


def _python_rows(path):
    """An independent reading of the good rows, with Python's csv module."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    return {
        row[0]: dict(zip(header, row, strict=True)) for row in rows[1:] if len(row) == len(header)
    }


def test_tabular_csv_round_trip(tricky_csv, tmp_path, cli):
    out = tmp_path / "out"
    result = cli("convert", tricky_csv, "-o", out)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert info["features"]["id"]["dtype"] == "int64"
    assert info["features"]["score"] == {
        "dtype": "float",
        "shape": [-1],
        "optional": True,
        "description": "CSV column 'score'",
    }
    assert info["features"]["name"]["shape"] == []
    records = {int(r["id"]): r for r in splits["train"]}
    assert sorted(records) == [1, 2, 3, 4, 6]
    expected = _python_rows(tricky_csv)
    for row_id, record in records.items():
        source = expected[str(row_id)]
        assert record["name"].decode("utf-8") == source["name"]
        if source["score"]:
            assert record["score"] == pytest.approx([float(source["score"])])
        else:
            assert record["score"] == []  # missing: the feature is left out
        if source["note"]:
            assert record["note"] == [source["note"].encode("utf-8")]
    (error,) = read_errors(out)
    assert error["error"] == "WrongFieldCount" and error["source"]["row"] == 5
    assert error["source"]["path"] == str(tricky_csv) and error["stage"] == "read"
    assert info["num_inputs"] == 6 == info["num_records"] + info["errors"]["count"]


def test_integers_written_with_a_plus_sign_stay_integers(tmp_path, cli):
    # One "+3" made the column float32 (123456789 stored as 123456792) and integer labels
    # text classes, renumbered (a tester's finding).
    table = tmp_path / "plus.csv"
    table.write_text("user_id,delta,label\n1,+3,3\n2,-2,+1\n3,123456789,0\n")
    out = tmp_path / "out"
    result = cli("convert", table, "-o", out, "--label-column", "label")
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert info["features"]["delta"]["dtype"] == "int64"
    rows = sorted((r["user_id"], r["delta"], r["label"]) for r in splits["train"])
    assert rows == [(1, 3, 3), (2, -2, 1), (3, 123456789, 0)]


def test_an_empty_csv_file_is_quarantined_wherever_it_comes_in_the_order(tmp_path, cli):
    # First in the order it refused the whole run (exit 2); later, one UnreadableCsv record
    # (a tester's finding).
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a_empty.csv").write_bytes(b"")
    (folder / "b.csv").write_text("a,b\n1,x\n")
    orders = [
        [folder / "a_empty.csv", folder / "b.csv"],
        [f"{folder}/*.csv"],
        [folder / "b.csv", folder / "a_empty.csv"],
    ]
    for index, sources in enumerate(orders):
        out = tmp_path / f"out{index}"
        result = cli("convert", *sources, "-o", out)
        assert result.returncode == 0, (sources, result.stderr)
        assert [e["error"] for e in read_errors(out)] == ["UnreadableCsv"]
        assert read_dataset(out)[0]["num_records"] == 1


def test_a_first_csv_that_fails_at_its_first_byte_is_not_called_empty(tmp_path, cli):
    # Plain text named .csv.gz, or an I/O error on the first read: "Empty CSV file", exit 2.
    import shutil
    import subprocess

    from conftest import RECORDFORGE

    fake = tmp_path / "t.csv.gz"
    fake.write_text("a,b\n1,x\n2,y\n")
    result = cli("convert", fake, "-o", tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert "the compressed data is damaged" in result.stderr and "Empty" not in result.stderr
    strace = shutil.which("strace")
    if strace is None:
        pytest.fail("strace is not installed (apt-get install strace)")
    table = tmp_path / "table.csv"
    table.write_text("a,b\n" + "".join(f"{i},x\n" for i in range(2000)))
    failed = subprocess.run(
        [strace, "-f", "-qq", "-o", "/dev/null", "-e", "signal=none", "-P", str(table)]
        + ["-e", "trace=read", "-e", "inject=read:error=EIO:when=1"]
        + [RECORDFORGE, "convert", str(table), "-o", str(tmp_path / "out2")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 1, failed.stderr
    assert failed.stderr.strip().splitlines() == [
        f"recordforge: failed: {table} cannot be read: the file could not be read further: "
        "Input/output error, at byte 0; repair or replace the file and convert again; nothing "
        "was written"
    ]


def test_a_utf16_file_without_its_byte_order_mark_is_refused_not_read_as_garbage(tmp_path, cli):
    # Its NULs are valid UTF-8: columns 'i\x00d\x00' and garbage records, no warning (a
    # tester's finding).
    good = tmp_path / "good.csv"
    good.write_text("id,name\n1,a\n")
    utf16 = tmp_path / "utf16.csv"
    utf16.write_bytes("id,name\n1,a\n2,b\n".encode("utf-16-le"))
    out = tmp_path / "out"
    result = cli("convert", good, utf16, "-o", out)
    assert result.returncode == 0, result.stderr
    (error,) = read_errors(out)
    assert error["error"] == "UnreadableCsv" and "holds NUL bytes; is it UTF-16" in error["message"]
    assert read_dataset(out)[0]["num_records"] == 1
    alone = cli("convert", utf16, "-o", tmp_path / "out2")
    assert alone.returncode == 2 and "is it UTF-16" in alone.stderr, alone.stderr


def test_a_schema_renaming_the_label_column_is_refused(tmp_path, cli):
    # `kind: {feature: foo}` with --label-column kind: the rename was dropped without a word.
    table = tmp_path / "k.csv"
    table.write_text("x,kind\n1,a\n2,b\n")
    schema = tmp_path / "k.yaml"
    schema.write_text("columns:\n  kind: {feature: foo}\n")
    out = tmp_path / "out"
    result = cli("convert", table, "--label-column", "kind", "--schema", schema, "-o", out)
    assert result.returncode == 2, result.stderr
    assert "drop its `feature: foo` from the schema" in result.stderr
    assert not out.exists()


def test_csv_naming_images_with_labels_and_split_column(tmp_path, cli):
    images = tmp_path / "data" / "imgs"
    files = {}
    for i in range(6):
        files[f"imgs/{i}.png"] = make_image(images / f"{i}.png", "PNG", size=(20 + i, 30), seed=i)
    absolute = make_image(tmp_path / "elsewhere" / "abs.jpg", "JPEG", seed=9)
    table = tmp_path / "data" / "labels.csv"
    lines = ["path,label,split,weight"]
    for i in range(6):
        lines.append(f"imgs/{i}.png,{'cat' if i % 2 else 'dog'},{'train' if i < 4 else 'test'},{i}")
    lines.append(f"{tmp_path / 'elsewhere' / 'abs.jpg'},cat,train,9")
    lines.append("imgs/missing.png,dog,train,1")
    table.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    result = cli(
        "convert",
        table,
        "-o",
        out,
        "--image-column",
        "path",
        "--label-column",
        "label",
        "--split-column",
        "split",
    )
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert info["labels"] == ["cat", "dog"]
    assert sorted(info["splits"]) == ["test", "train"]
    assert len(splits["train"]) == 5 and len(splits["test"]) == 2
    for record in splits["train"] + splits["test"]:
        name = record["image/filename"].decode()
        data = absolute if name.endswith("abs.jpg") else files[name]
        assert record["image/encoded"] == data
        assert record["image/class/label"] == info["labels"].index(
            record["image/class/text"].decode()
        )
        assert "weight" in record and "path" not in record and "split" not in record
    (error,) = read_errors(out)
    assert error["error"] == "MissingFile" and error["source"]["row"] == 8
    assert "imgs/missing.png" in error["message"]


def test_schema_file_types_lists_defaults_and_errors(tmp_path, cli):
    table = tmp_path / "t.csv"
    table.write_text(
        "age,height,tags,comment,secret\n"
        "31,1.8,a|b|c,hello,x\n"
        "40,,d,hi,y\n"
        "22,1.6,,,z\n"  # comment is required: this row goes to the quarantine
        "NA,1.7,e|f,ok,w\n"
        "50,tall,g,bad,v\n"  # height is declared float: 'tall' does not parse
    )
    schema = tmp_path / "schema.yaml"
    schema.write_text(
        "null_values: ['', 'NA']\n"
        "columns:\n"
        "  age: {dtype: int64, missing: {default: -1}}\n"
        "  height: {dtype: float, missing: {default: 0.0}}\n"
        "  tags: {dtype: bytes, list: true, separator: '|'}\n"
        "  comment: {feature: notes/comment, dtype: bytes, missing: error}\n"
        "  secret: {drop: true}\n"
    )
    out = tmp_path / "out"
    result = cli("convert", table, "-o", out, "--schema", schema)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert set(info["features"]) == {"age", "height", "tags", "notes/comment"}
    assert info["features"]["age"]["shape"] == [] and info["features"]["height"]["shape"] == []
    records = sorted(splits["train"], key=lambda r: r["notes/comment"])
    assert [r["age"] for r in records] == [31, 40, -1]
    assert [r["height"] for r in records] == pytest.approx([1.8, 0.0, 1.7])
    assert [r["tags"] for r in records] == [[b"a", b"b", b"c"], [b"d"], [b"e", b"f"]]
    errors = {e["source"]["row"]: e for e in read_errors(out)}
    assert errors[3]["error"] == "MissingValue" and "comment" in errors[3]["message"]
    assert errors[5]["error"] == "BadCell" and "height" in errors[5]["message"]
    assert len(errors) == 2
    assert json.loads((out / "dataset_info.json").read_text())["source"]["csv_schema"]


@pytest.mark.parametrize(
    ("schema_text", "phrase"),
    [
        ("columns: [", "schema.yaml"),
        ("columns:\n  age: integer\n", "integer"),
        ("columns:\n  agee: int64\n", "agee"),
    ],
)
def test_bad_schema_file_is_a_usage_error(tmp_path, cli, schema_text, phrase):
    table = tmp_path / "t.csv"
    table.write_text("age\n1\n")
    schema = tmp_path / "schema.yaml"
    schema.write_text(schema_text)
    out = tmp_path / "out"
    result = cli("convert", table, "-o", out, "--schema", schema)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and phrase in result.stderr
    assert not out.exists()


def test_header_only_csv_is_a_usage_error(tmp_path, cli):
    table = tmp_path / "t.csv"
    table.write_text("a,b\n")
    result = cli("convert", table, "-o", tmp_path / "out")
    assert result.returncode == 2 and "no data rows" in result.stderr


def test_a_header_only_first_file_takes_its_schema_from_the_next_in_either_order(tmp_path, cli):
    """The schema was sampled from the first file only: a header-only file first was refused
    ('has no data rows') where the same files in the other order converted."""
    (tmp_path / "a.csv").write_text("x,y\n")
    (tmp_path / "b.csv").write_text("x,y\n1,one\n2,two\n")
    outputs = []
    for order in (("a.csv", "b.csv"), ("b.csv", "a.csv")):
        out = tmp_path / f"out-{order[0]}"
        result = cli("convert", *(tmp_path / name for name in order), "-o", out)
        assert result.returncode == 0, result.stderr
        manifest = json.loads((out / "dataset_info.json").read_text())
        assert manifest["num_records"] == 2
        outputs.append({k: v["dtype"] for k, v in manifest["features"].items()})
    assert outputs[0] == outputs[1] == {"x": "int64", "y": "bytes"}
    only_headers = tmp_path / "headers"
    for name in ("a.csv", "c.csv"):
        (only_headers / name).parent.mkdir(exist_ok=True)
        (only_headers / name).write_text("x,y\n")
    result = cli("convert", only_headers / "*.csv", "-o", tmp_path / "none")
    assert result.returncode == 2
    assert "none of the CSV files" in result.stderr and "has data rows" in result.stderr


def test_several_csv_files_and_a_foreign_header(tmp_path, cli):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.csv").write_text("x,y\n1,a\n2,b\n")
    (tmp_path / "parts" / "b.csv").write_text("x,y\n3,c\n")
    (tmp_path / "parts" / "c.csv").write_text("other,columns\n9,z\n")
    out = tmp_path / "out"
    result = cli("convert", f"{tmp_path / 'parts'}/*.csv", "-o", out)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert sorted(int(r["x"]) for r in splits["train"]) == [1, 2, 3]
    (error,) = read_errors(out)
    assert error["error"] == "CsvHeaderMismatch" and error["source"]["path"].endswith("c.csv")
    assert info["num_inputs"] == 4


def test_a_csv_whose_header_is_not_utf8_is_an_error_record_or_a_usage_error(tmp_path, cli):
    # pyarrow keeps cells as bytes but decodes the header's names: a compressed file named
    # .csv, or a Latin-1 header, used to end the run with a UnicodeDecodeError traceback.
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.csv").write_text("x,y\n1,a\n2,b\n")
    (tmp_path / "parts" / "b.csv").write_bytes(gzip.compress(b"x,y\n3,c\n"))
    (tmp_path / "parts" / "c.csv").write_bytes(b"x,y\xe9\n4,d\n")
    out = tmp_path / "out"
    result = cli("convert", f"{tmp_path / 'parts'}/*.csv", "-o", out)
    assert result.returncode == 0, result.stderr
    info, splits = read_dataset(out)
    assert sorted(int(r["x"]) for r in splits["train"]) == [1, 2]
    errors = sorted(read_errors(out), key=lambda e: e["source"]["path"])
    assert [e["source"]["path"][-5:] for e in errors] == ["b.csv", "c.csv"]
    for error in errors:
        assert error["error"] == "UnreadableCsv"
        assert "header row is not UTF-8 text" in error["message"]
    assert info["num_inputs"] == 4
    # The first file defines the columns: a usage error naming it, without a traceback.
    result = cli("convert", tmp_path / "parts" / "c.csv", "-o", tmp_path / "out2")
    assert result.returncode == 2
    assert "c.csv" in result.stderr and "header row is not UTF-8 text" in result.stderr
    assert "Traceback" not in result.stderr


def test_csv_determinism_across_worker_modes(tmp_path, cli):
    rows = "\n".join(f"{i},{i * 0.5},text {i}" for i in range(500))
    table = tmp_path / "t.csv"
    table.write_text("a,b,c\n" + rows + "\n")
    outputs = []
    for label, extra in (
        ("one", ()),
        ("two", ("--direct_num_workers=2", "--direct_running_mode=multi_processing")),
    ):
        out = tmp_path / label
        args = ("convert", table, "-o", out, "--name", "t", "--splits", "train=0.7,test=0.3")
        assert cli(*args, "--num-shards", "3", *extra).returncode == 0
        outputs.append({p.name: p.read_bytes() for p in out.iterdir() if ".tfrecord-" in p.name})
    assert outputs[0] == outputs[1] and len(outputs[0]) == 6
    buffer = io.StringIO(rows)
    assert sum(1 for _ in buffer) == 500


def test_delimiter_from_schema_file_or_option(tmp_path, cli):
    table = tmp_path / "t.csv"
    table.write_text("a;b\n1;x,y\n2;z\n")
    schema = tmp_path / "s.yaml"
    schema.write_text("delimiter: ';'\ncolumns:\n  a: int64\n")
    for index, extra in enumerate((("--schema", schema), ("--delimiter", ";"))):
        out = tmp_path / f"out{index}"
        result = cli("convert", table, "-o", out, *extra)
        assert result.returncode == 0, result.stderr
        _, splits = read_dataset(out)
        assert sorted((int(r["a"]), r["b"]) for r in splits["train"]) == [(1, b"x,y"), (2, b"z")]


def test_a_column_may_not_become_a_feature_recordforge_writes(tmp_path, cli):
    table = tmp_path / "t.csv"
    table.write_text("label,class,path\n1,cat,a.png\n")
    result = cli("convert", table, "-o", tmp_path / "out", "--label-column", "class")
    assert result.returncode == 2
    assert "column 'label' would become feature 'label'" in result.stderr
    schema = tmp_path / "schema.yaml"
    schema.write_text("columns:\n  label: {feature: image/height, dtype: int64}\n")
    result = cli("convert", table, "-o", tmp_path / "out2", "--image-column", "path",
                 "--schema", schema)  # fmt: skip
    assert result.returncode == 2 and "feature 'image/height'" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def _convert_both_ways(tmp_path, monkeypatch, table, argv):
    """Convert with the column-wise table path and with the row-by-row path: (fast, general)."""
    from recordforge.pipelines import cli as cli_module
    from recordforge.transforms import convert

    fast, general = tmp_path / "fast", tmp_path / "general"
    assert cli_module.main(["convert", str(table), "-o", str(fast), *argv]) == 0
    with monkeypatch.context() as patched:
        patched.setattr(convert, "_is_plain_table", lambda config: False)
        assert cli_module.main(["convert", str(table), "-o", str(general), *argv]) == 0
    return fast, general


def test_the_table_fast_path_writes_what_the_general_path_writes(tmp_path, monkeypatch):
    """Plain tables are read and built column-wise; the bytes must not depend on that."""
    table = tmp_path / "t.csv"
    lines = ["id,label,score,tags,note"]
    for row in range(1, 400):
        score = "" if row % 7 == 0 else f"{row / 3:.3f}"
        lines.append(f"{row},{row % 3},{score},{'a b' if row % 2 else ''},note {row}")
    lines.insert(50, "oops,1,2")  # a bad row goes to the quarantine on both paths
    table.write_text("\n".join(lines) + "\n")
    argv = ["--label-column", "label", "--splits", "train=0.7,test=0.3", "--num-shards", "3"]
    argv += ["--name", "t"]
    fast, general = _convert_both_ways(tmp_path, monkeypatch, table, argv)
    fast_files = sorted(p.relative_to(fast).as_posix() for p in fast.rglob("*") if p.is_file())
    assert fast_files == sorted(
        p.relative_to(general).as_posix() for p in general.rglob("*") if p.is_file()
    )
    assert len([name for name in fast_files if ".tfrecord-" in name]) == 6
    for name in fast_files:
        if name != "dataset_info.json":  # shards and the errors file
            assert (fast / name).read_bytes() == (general / name).read_bytes(), name
    manifests = [json.loads((out / "dataset_info.json").read_text()) for out in (fast, general)]
    for manifest in manifests:
        manifest.pop("created")
    assert manifests[0] == manifests[1]
    assert manifests[0]["errors"]["count"] == 1 and manifests[0]["num_records"] == 399


def test_text_labels_split_column_and_schema_rules_take_the_table_path_unchanged(
    tmp_path, monkeypatch
):
    """Text labels (numbered after a first pass), a split column, defaults, lists and every
    kind of bad row: the column-wise path writes the row-by-row path's bytes and errors."""
    rows = [b"id,label,part,score,tags,note,big"]
    labels = ["cat", "dog", "\u00e9mu", "ant"]
    for row in range(1, 300):
        label = labels[row % 4].encode("utf-8")
        part = [b"train", b"test", b"train", b"valid"][row % 4]
        score = b"" if row % 5 == 0 else f"{(row - 150) * 1.37e3:.6g}".encode()
        tags = [b"1|-2|3", b"", b"9223372036854775807", b"-9223372036854775808|0"][row % 4]
        note = b"NA" if row % 11 == 0 else f"n\u00f6te {row}".encode()
        # Near float32's largest, and infinities spelled out (a larger number is a bad cell).
        big = b"-inf" if row % 13 == 0 else f"{row * 1.1e36:.4g}".encode()
        rows.append(b",".join([str(row).encode(), label, part, score, tags, note, big]))
    rows[20] = b"20,ghost,train,not-a-number,1,x,1"  # bad cell: "ghost" must not become a class
    rows[30] = b"30,,train,1,1,x,1"  # missing label
    rows[40] = b"40,\xff\xfe,train,1,1,x,1"  # label not UTF-8
    rows[50] = b"50,cat,no.dots,1,1,x,1"  # invalid split name
    rows[60] = b"60,cat,,1,1,x,1"  # missing split
    rows[70] = b"70,cat,train,1,1||2,x,1"  # empty list element
    rows[80] = b"80,cat,train"  # wrong field count
    table = tmp_path / "t.csv"
    table.write_bytes(b"\n".join(rows) + b"\n")
    schema = tmp_path / "schema.yaml"
    schema.write_text(
        "null_values: ['', 'NA']\n"
        "columns:\n"
        "  label: bytes\n"
        "  part: bytes\n"
        "  score: {dtype: float, missing: {default: -0.5}}\n"
        "  tags: {dtype: int64, list: true, separator: '|'}\n"
        "  note: {feature: meta/note, dtype: bytes, missing: {default: n/a}}\n"
        "  big: float\n"
    )
    argv = ["--schema", str(schema), "--label-column", "label", "--split-column", "part"]
    argv += ["--num-shards", "2", "--name", "t"]
    fast, general = _convert_both_ways(tmp_path, monkeypatch, table, argv)
    names = sorted(p.relative_to(fast).as_posix() for p in fast.rglob("*") if p.is_file())
    assert names == sorted(
        p.relative_to(general).as_posix() for p in general.rglob("*") if p.is_file()
    )
    assert len([name for name in names if ".tfrecord-" in name]) == 6  # 3 splits x 2
    for name in names:
        if name != "dataset_info.json":
            assert (fast / name).read_bytes() == (general / name).read_bytes(), name
    manifests = [json.loads((out / "dataset_info.json").read_text()) for out in (fast, general)]
    for manifest in manifests:
        manifest.pop("created")
    assert manifests[0] == manifests[1]
    assert manifests[0]["labels"] == ["ant", "cat", "dog", "\u00e9mu"]
    errors = {e["source"]["row"]: e["error"] for e in read_errors(fast)}
    assert errors == {
        20: "BadCell",
        30: "MissingLabel",
        40: "BadCell",
        50: "BadSplit",
        60: "MissingSplit",
        70: "BadCell",
        80: "WrongFieldCount",
    }
    # The rule the refused name breaks ("letters, digits, '_' and '-'" was met by "-rf").
    (bad_split,) = [e["message"] for e in read_errors(fast) if e["error"] == "BadSplit"]
    assert "ASCII letters, digits, '_' and '-', starting with a letter or digit" in bad_split


_ROWS = "id,kind,score,note\n" + "".join(
    f"{i},{'ab'[i % 2]},{i / 4},note {i}\n" for i in range(1, 200)
)


def _change_before_second_read(monkeypatch, csv_path, new_text, seen):
    """Text labels make a table's files read twice (class names, then records): rewrite
    `csv_path` with `new_text` once the first read is over, just before the second."""
    from recordforge.transforms import table as table_module

    second_read = table_module._ReadTableFn.process

    def change_then_read(self, file, *args):
        if len(file) == 4:  # (Source, path, CsvRange, FileFingerprint of the first read)
            seen.append(file[3])
            csv_path.write_text(new_text)
        yield from second_read(self, file, *args)

    monkeypatch.setattr(table_module._ReadTableFn, "process", change_then_read)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda text: text + "200,zebra,1.5,appended\n", id="row-appended"),
        pytest.param(lambda text: text.replace("7,b,1.75,note 7\n", ""), id="row-removed"),
        # Same length, same number of rows: only the bytes tell.
        pytest.param(lambda text: text.replace("note 17\n", "note 71\n"), id="cell-edited"),
    ],
)
def test_a_csv_changed_between_the_two_reads_is_refused_by_name(
    tmp_path, monkeypatch, capsys, change
):
    """A file edited between its two reads must fail the run with a message naming it, no
    traceback, and nothing published."""
    from recordforge.pipelines import cli as cli_module

    csv_path = tmp_path / "data" / "t.csv"
    csv_path.parent.mkdir()
    csv_path.write_text(_ROWS)
    seen = []
    _change_before_second_read(monkeypatch, csv_path, change(_ROWS), seen)
    out = tmp_path / "out"
    argv = ["convert", str(csv_path), "-o", str(out), "--name", "t", "--label-column", "kind"]
    assert cli_module.main(argv) == 1
    assert len(seen) == 1
    stderr = capsys.readouterr().err
    assert f"recordforge: failed: {csv_path} changed during the conversion" in stderr, stderr
    assert "Traceback" not in stderr and "counts do not add up" not in stderr
    if change(_ROWS).count("\n") == _ROWS.count("\n") and len(change(_ROWS)) == len(_ROWS):
        # It quoted the same figures twice, "read first as 4,215 bytes, ..., then as 4,215
        # bytes, ..." (a tester's finding).
        assert "with other bytes the second time" in stderr, stderr
    published = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert published == [], published  # no manifest, no shard, no temporary folder left


def test_a_csv_read_twice_unchanged_converts(tmp_path, monkeypatch):
    """The same hook, rewriting the same bytes: the reads match and the run succeeds (so the
    test above fails for the change, not for the hook)."""
    from recordforge.pipelines import cli as cli_module

    csv_path = tmp_path / "t.csv"
    csv_path.write_text(_ROWS)
    seen = []
    _change_before_second_read(monkeypatch, csv_path, _ROWS, seen)
    out = tmp_path / "out"
    argv = ["convert", str(csv_path), "-o", str(out), "--name", "t", "--label-column", "kind"]
    assert cli_module.main(argv) == 0
    assert [(f.rows, f.num_bytes) for f in seen] == [(199, len(_ROWS))]
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert manifest["num_records"] == 199 and manifest["labels"] == ["a", "b"]
