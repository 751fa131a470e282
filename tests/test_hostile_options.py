"""Numbers and options (issue 15): every option value checked before anything runs (exit 2,
one line, nothing written); numbers that do not fit their feature type are bad cells."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import RECORDFORGE, make_image, read_errors


@pytest.fixture
def inputs(tmp_path):
    make_image(tmp_path / "photos" / "a" / "1.jpg", "JPEG")
    (tmp_path / "t.csv").write_text("id,x\n1,2\n")
    os.mkfifo(tmp_path / "fifo.yaml")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--max-shard-mb", "inf"], "--max-shard-mb must be a number of MiB above 0"),
        (["--max-shard-mb", "nan"], "--max-shard-mb must be a number of MiB above 0"),
        (["--min-shard-mb", "1e400"], "--min-shard-mb must be a number of MiB above 0"),
        (["--max-shard-mb", "-1"], "--max-shard-mb must be a number of MiB above 0"),
        (["--num-hosts", "1000000000"], "--num-hosts must be between 1 and 1,000,000"),
        (["--num-shards", "0"], "--num-shards must be between 1 and 1,000,000"),
        (["--max-error-rate", "nan"], "--max-error-rate must be between 0 and 1"),
        (["--max-image-pixels", "0"], "--max-image-pixels must be between 1 and"),
        (["--num-hosts", "abc"], "argument --num-hosts: invalid int value: 'abc'"),
        (["--labels", "bogus"], "argument --labels: invalid choice: 'bogus'"),
        (["--stray-files", "keep"], "argument --stray-files: invalid choice: 'keep'"),
        (["--allowed-root", "{tmp}/nowhere"], "is not a folder"),
        (["--split-salt", b"\xff".decode("utf-8", "surrogateescape")], "is not valid UTF-8"),
    ],
)
def test_bad_option_values_exit_2_with_one_line(inputs, args, phrase):
    args = [a.replace("{tmp}", str(inputs)) for a in args]
    _assert_usage(["convert", str(inputs / "photos"), "-o", str(inputs / "out"), *args], phrase)
    assert not (inputs / "out").exists()


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--delimiter", ""], "--delimiter must be one ASCII character"),
        (["--delimiter", ";;"], "--delimiter must be one ASCII character"),
        (["--delimiter", '"'], "--delimiter must be one ASCII character"),
        (["--schema", "{tmp}/fifo.yaml"], "is not a regular file"),
    ],
)
def test_bad_csv_option_values_exit_2_with_one_line(inputs, args, phrase):
    args = [a.replace("{tmp}", str(inputs)) for a in args]
    _assert_usage(["convert", str(inputs / "t.csv"), "-o", str(inputs / "out"), *args], phrase)


def test_a_delimiter_given_for_inputs_that_are_not_csv_is_a_usage_error(inputs):
    # A tab-separated file named .tsv is not a CSV input (only .csv and .csv.gz are): with
    # --delimiter '\t' it was probed as an image and failed as NotAnImage ("all 1 inputs
    # failed", exit 1), and --delimiter beside an image folder was ignored without a word.
    (inputs / "tables").mkdir()
    (inputs / "tables" / "t.tsv").write_text("id\tx\n1\t2\n")
    phrases = {
        "tables/t.tsv": "CSV files only (files named .csv or .csv.gz): name it .csv (with "
        "--delimiter for another separator)",
        "photos": "--delimiter applies to CSV inputs (files named .csv or .csv.gz)",
    }
    for source, phrase in phrases.items():
        out = inputs / "out"
        argv = ["convert", str(inputs / source), "-o", str(out), "--delimiter", "\\t"]
        _assert_usage(argv, phrase)
        assert not out.exists()


def _assert_usage(argv, phrase):
    result = subprocess.run(
        [RECORDFORGE, *argv], capture_output=True, text=True, timeout=300, errors="replace"
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("recordforge: error: ") and phrase in lines[0], lines[0]


def test_a_tab_delimiter_may_be_written_as_backslash_t(tmp_path, cli):
    table = tmp_path / "t.tsv.csv"
    table.write_text("id\tname\n1\tone\n2\ttwo\n")
    out = tmp_path / "out"
    result = cli("convert", table, "-o", out, "--delimiter", "\\t")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert [c["column"] for c in manifest["source"]["csv_schema"]["columns"]] == ["id", "name"]


def test_a_semicolon_separated_file_read_with_commas_is_warned_about(tmp_path, cli):
    table = tmp_path / "semi.csv"
    table.write_text("id;x;s;label\n1;2;a;cat\n")
    result = cli("convert", table, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "has a single column named 'id;x;s;label': is it separated by ';'?" in result.stderr


def test_numbers_that_do_not_fit_their_feature_are_bad_cells(tmp_path, cli):
    # 1e39 in a float column silently became inf: float32 holds at most ~3.4e38.
    table = tmp_path / "n.csv"
    table.write_text(
        "id,f,i\n"
        "1,1.5,7\n"
        "2,1e39,8\n"
        "3,-inf,9\n"  # an infinity spelled out is one
        "4,nan,10\n"
        "5,2.5,9223372036854775808\n"  # beyond int64
        "6,3.4e38,11\n"
    )
    schema = tmp_path / "s.yaml"
    schema.write_text("columns: {f: float, i: int64}\n")
    out = tmp_path / "out"
    result = cli("convert", table, "-o", out, "--schema", schema)
    assert result.returncode == 0, result.stderr
    errors = {e["source"]["row"]: e["message"] for e in read_errors(out)}
    assert errors == {
        2: "column 'f': '1e39' is too large for a float feature (float32, at most ±3.4028235e38)",
        5: "column 'i': '9223372036854775808' is outside the int64 range",
    }
    assert json.loads((out / "dataset_info.json").read_text())["num_records"] == 4


def test_a_float_default_too_large_for_float32_is_a_schema_error(tmp_path, cli):
    table = tmp_path / "n.csv"
    table.write_text("id,f\n1,\n")
    schema = tmp_path / "s.yaml"
    schema.write_text("columns: {f: {dtype: float, missing: {default: 1e39}}}\n")
    result = cli("convert", table, "-o", tmp_path / "out", "--schema", schema)
    assert result.returncode == 2
    assert "default '1e39' is too large for a float feature" in result.stderr
