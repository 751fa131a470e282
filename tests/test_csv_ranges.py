"""Splitting a CSV file into byte ranges (core.tables.ranges): each range read on its own gives
exactly the rows, row numbers, errors and messages of the whole file read at once."""

from __future__ import annotations

import gzip
import io
import itertools
import json

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from recordforge.schemas.csv.schema import ColumnSpec, CsvSchema
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.tables.ranges import WHOLE, CsvRange, split_csv
from recordforge.transforms.core.tables.rows import CsvEnd, ParsedRow, read_csv_rows
from recordforge.transforms.core.tables.stream import CsvReadFailure

SCHEMA = CsvSchema(
    (
        ColumnSpec("id", "id", "int64"),
        ColumnSpec("x", "x", "float"),
        ColumnSpec("name", "name", "bytes"),
    )
)
HEADER = b"id,x,name\n"


def _outcome(item) -> tuple:
    if isinstance(item, ParsedRow):
        return (item.row, item.values)
    return (item.row, item.error.kind, item.error.message)


def read_whole(data: bytes, block_size: int = 64):
    """The rows of `data` read at once, or how the reading failed."""
    try:
        *items, end = read_csv_rows(
            io.BytesIO(data), SCHEMA, source_name="f.csv", block_size=block_size
        )
    except (InputError, CsvReadFailure) as error:
        return type(error).__name__
    assert isinstance(end, CsvEnd) and end.num_bytes == len(data)
    return [_outcome(item) for item in items]


def split(data: bytes, range_bytes: int, count_multiple: int = 1) -> tuple[CsvRange, ...]:
    return split_csv(
        io.BytesIO(data),
        delimiter=",",
        header=SCHEMA.expected_header,
        range_bytes=range_bytes,
        stored_size=len(data),
        count_multiple=count_multiple,
    )


def read_ranges(data: bytes, ranges, block_size: int = 64):
    """The rows of `data` read range by range, each range on its own (as a worker reads it),
    or how a range's reading failed."""
    outcomes = []
    for part in ranges:
        piece = data if part.whole else data[part.start : part.end]
        try:
            *items, end = read_csv_rows(
                io.BytesIO(piece), SCHEMA, source_name="f.csv", block_size=block_size, part=part
            )
        except (InputError, CsvReadFailure) as error:
            return type(error).__name__
        assert isinstance(end, CsvEnd) and end.num_bytes == len(piece)
        if not part.whole:
            assert end.rows == part.rows
        outcomes += [_outcome(item) for item in items]
    return outcomes


def check_cover(data: bytes, ranges) -> None:
    """Ranges cover the file with no gap or overlap, each starts a record, rows are numbered on."""
    if ranges == (WHOLE,):
        return
    assert len(ranges) >= 2
    assert ranges[0].start == 0 and ranges[-1].end == len(data)
    for before, after in itertools.pairwise(ranges):
        assert before.end == after.start
        assert after.first_row == before.first_row + before.rows
        assert data[after.start - 1 : after.start] in (b"\n", b"\r")
        assert after.previous == data[after.start - 1]
    assert all(part.rows >= 1 for part in ranges)


def rows(count: int, quoted_every: int = 3) -> bytes:
    return b"".join(
        b'%d,%d.5,"name %d\nspans, lines"\n' % (i, i, i)
        if i % quoted_every == 0
        else b"%d,%d,n%d\n" % (i, i, i)
        for i in range(1, count + 1)
    )


# --- where ranges start -------------------------------------------------------------------------


@pytest.mark.parametrize("range_bytes", [1, 7, 20, 64, 300])
def test_ranges_cover_the_file_and_give_the_rows_of_a_whole_reading(range_bytes):
    data = HEADER + rows(60)
    ranges = split(data, range_bytes)
    assert len(ranges) > 1
    check_cover(data, ranges)
    assert read_ranges(data, ranges) == read_whole(data)
    assert sum(part.rows for part in ranges) == 60


@pytest.mark.parametrize(("multiple", "expected"), [(1, 5), (2, 6), (3, 6), (4, 8), (5, 5)])
def test_ranges_come_in_a_multiple_of_the_workers_each_given_an_even_share(multiple, expected):
    data = HEADER + rows(3_000)
    ranges = split(data, len(data) // 5, count_multiple=multiple)  # 5 ranges asked for
    assert len(ranges) == expected
    check_cover(data, ranges)
    assert read_ranges(data, ranges, block_size=1 << 16) == read_whole(data, block_size=1 << 16)
    # Even ranges (a cut lands within half a read of its mark), so that dealt out in turn (as
    # FnApiRunner deals a stage's tasks) each worker reads the same share of the file.
    sizes = [part.end - part.start for part in ranges]
    assert max(sizes) - min(sizes) < 0.02 * len(data) / expected, sizes
    shares = [sum(sizes[k::multiple]) for k in range(multiple)]
    assert max(shares) - min(shares) < 0.02 * len(data) / multiple, shares


def test_a_boundary_is_never_inside_quotes():
    # Every row's quoted cell holds line breaks; with one-byte ranges a cut is tried at every
    # line break, and only those outside quotes may start a range.
    data = HEADER + rows(30, quoted_every=1)
    ranges = split(data, 1)
    check_cover(data, ranges)
    assert [part.rows for part in ranges] == [1] * 30  # ranges of one row each
    for part in ranges[1:]:
        assert data[part.start : part.start + 2].isdigit() or data[part.start] in b"0123456789"
    assert read_ranges(data, ranges) == read_whole(data)


def test_ranges_of_one_row_and_more_ranges_asked_for_than_rows():
    data = HEADER + rows(5, quoted_every=2)
    ranges = split(data, 1)
    assert len(ranges) == 5 and all(part.rows == 1 for part in ranges)
    assert [part.first_row for part in ranges] == [1, 2, 3, 4, 5]
    assert read_ranges(data, ranges) == read_whole(data)
    # One row: nothing to split.
    assert split(HEADER + rows(1), 1) == (WHOLE,)


def test_a_file_no_larger_than_one_range_is_read_whole():
    data = HEADER + rows(10)
    assert split(data, len(data)) == (WHOLE,)
    assert len(split(data, len(data) - 1)) >= 1


def test_never_between_cr_and_lf_nor_before_a_byte_order_mark():
    body = b"".join(b"%d,1,a\r\n" % i for i in range(1, 20))
    data = HEADER.replace(b"\n", b"\r\n") + body
    ranges = split(data, 1)
    check_cover(data, ranges)
    assert all(data[part.start - 1 : part.start] == b"\n" for part in ranges[1:])
    assert read_ranges(data, ranges) == read_whole(data)
    # A row starting with a byte order mark: pyarrow would skip it at the start of a range.
    bom = b"\xef\xbb\xbf"
    data = bom + HEADER + b"1,1,a\n" + bom + b"2,1,b\n3,1,c\n4,1,d\n"
    ranges = split(data, 1)
    check_cover(data, ranges)
    assert all(not data[part.start :].startswith(bom) for part in ranges[1:])
    assert read_ranges(data, ranges) == read_whole(data)


def test_carriage_returns_alone_end_lines_too():
    data = HEADER.replace(b"\n", b"\r") + b"".join(b'%d,1,"a\rb"\r' % i for i in range(1, 12))
    ranges = split(data, 5)
    assert len(ranges) > 1
    check_cover(data, ranges)
    assert read_ranges(data, ranges) == read_whole(data)


def test_bad_rows_and_loose_quotes_keep_their_rows_and_messages():
    data = (
        HEADER
        + rows(10)
        + b"11,1\n"  # wrong field count
        + b'12,1,"opened\n13,1,b\n14,1,c" then text\n'  # a quote that swallowed two lines
        + b"15,zz,c\n"  # bad cell
        + b"16,1,\xff\xfe,extra\n"  # wrong field count, not UTF-8
        + rows(5)
    )
    whole = read_whole(data)
    kinds = {row[1] for row in whole if len(row) == 3}
    assert kinds == {"WrongFieldCount", "UnterminatedQuote", "BadCell"}
    for range_bytes in (1, 5, 17, 40, 100):
        ranges = split(data, range_bytes)
        check_cover(data, ranges)
        assert read_ranges(data, ranges) == whole, range_bytes


def test_the_lines_a_loose_quote_swallowed_do_not_depend_on_where_reads_are_cut():
    # A quote that swallows a \r in one read and a \n in the next: its message counts the
    # field's \n (or its \r when it has none) over the whole field, not read by read (found
    # by the property test below: a range's reads are cut elsewhere than the whole file's).
    data = HEADER + b"1,2,x\n" * 3 + b'" x5,1,b\r1,2,x\n4,5,"y\nz"\n' + b"1,2,x\n" * 3
    results = [read_whole(data, size) for size in (1, 7, 16, 30, 64, 1 << 20)]
    assert all(result == results[0] for result in results)
    assert "closed only 1 line(s) later" in str(results[0])
    for range_bytes in (1, 9, 30):
        assert read_ranges(data, split(data, range_bytes), 7) == results[0]


def test_a_quote_never_closed_is_read_whole_and_stops_it_as_before():
    data = HEADER + rows(10) + b'11,1,"never closed\n' + rows(10, quoted_every=100)
    assert split(data, 10) == (WHOLE,)
    assert read_whole(data) == "CsvReadFailure"


def test_a_header_that_is_not_the_schemas_is_read_whole():
    data = b"id,x,other\n" + rows(20)
    assert split(data, 10) == (WHOLE,)
    assert read_whole(data) == "InputError"
    assert split(b"\xff\xfe,x,name\n" + rows(20), 10) == (WHOLE,)


def test_a_row_larger_than_the_limit_is_read_whole():
    data = HEADER + rows(5) + b"6,1," + b"a" * 300 + b"\n" + rows(5)
    assert split_csv(
        io.BytesIO(data),
        delimiter=",",
        header=SCHEMA.expected_header,
        range_bytes=10,
        stored_size=len(data),
        max_record_bytes=200,
    ) == (WHOLE,)


def test_a_stream_that_fails_or_changes_size_is_read_whole():
    class Failing(io.BytesIO):
        def read1(self, size=-1):
            if self.tell() > 100:
                raise OSError(5, "Input/output error")
            return super().read1(min(size, 50))

    data = HEADER + rows(40)
    assert split_csv(
        Failing(data),
        delimiter=",",
        header=SCHEMA.expected_header,
        range_bytes=20,
        stored_size=len(data),
    ) == (WHOLE,)
    assert split_csv(
        io.BytesIO(data),
        delimiter=",",
        header=SCHEMA.expected_header,
        range_bytes=20,
        stored_size=len(data) + 1,
    ) == (WHOLE,)


def test_a_range_read_against_a_changed_file_does_not_add_up():
    data = HEADER + rows(30)
    ranges = split(data, 50)
    changed = data.replace(b"1,1,n1\n", b"1,1,1\n9,9,9\n")  # a row more in the first range
    part = ranges[0]
    # The first range's bytes in the changed file: its end moved by the bytes added.
    piece = changed[: part.end + len(changed) - len(data)]
    *_, end = read_csv_rows(io.BytesIO(piece), SCHEMA, source_name="f.csv", part=part)
    assert end.rows != part.rows  # the reader (transforms/table.py) stops the run on this


def test_gzip_is_read_whole_by_the_reader_not_split_here():
    # A gzip stream cannot be entered at a byte offset: transforms/table.py never splits one,
    # and its stored size is not its text's, so splitting the text alone would not add up.
    text = HEADER + rows(50)
    packed = gzip.compress(text)
    assert split_csv(
        gzip.GzipFile(fileobj=io.BytesIO(packed)),
        delimiter=",",
        header=SCHEMA.expected_header,
        range_bytes=20,
        stored_size=len(packed),
    ) == (WHOLE,)


# --- any CSV, any range size -------------------------------------------------------------------

_ROWS = [
    b"1,2,x\n",
    b'4,5,"y\nz"\n',
    b'6,7,"q""r"\n',
    b"8,9\n",
    b"\n\n",
    b"3,zz,a\r\n",
    b"5,1,b\r",
    b"\xef\xbb\xbf7,1,c\n",
    b"9,1,\xff\n",
    b"9,1,\xff,\xfe\n",
    b'2,3,"a\r\nb"\r\n',
    b"1,2,3,4\n",
]
_HOSTILE = [b'"', b",", b"\n", b"\r", b"\xff", b"\xef\xbb\xbf", b"a", b"12", b'""', b'" x']


@st.composite
def any_csv(draw) -> bytes:
    """Rows of many shapes (quoted line breaks, CRLF, bad rows), with a few stray bytes."""
    header = draw(
        st.sampled_from([HEADER, HEADER.replace(b"\n", b"\r\n"), b"\xef\xbb\xbf" + HEADER])
    )
    body = draw(st.lists(st.sampled_from(_ROWS), max_size=40))
    for _ in range(draw(st.integers(0, 3))):
        body.insert(draw(st.integers(0, len(body))), draw(st.sampled_from(_HOSTILE)))
    return header + b"".join(body)


def _any_split_reads_as_one_range(data, range_bytes, block_size, count_multiple=1):
    ranges = split(data, range_bytes, count_multiple)
    check_cover(data, ranges)
    whole = read_whole(data, block_size)
    ranged = read_ranges(data, ranges, block_size)
    if isinstance(whole, str):
        # A file whose reading fails is not split (so it fails as before), or a range fails.
        assert isinstance(ranged, str)
    else:
        assert ranged == whole


_CASES = (any_csv(), st.integers(1, 80), st.sampled_from([64, 1 << 20]), st.integers(1, 4))


@settings(
    max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)
@given(*_CASES)
def test_property_any_split_reads_as_one_range(data, range_bytes, block_size, count_multiple):
    _any_split_reads_as_one_range(data, range_bytes, block_size, count_multiple)


@pytest.mark.slow
@settings(
    max_examples=20_000,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate],
)
@given(*_CASES)
def test_property_any_split_reads_as_one_range_many_cases(
    data, range_bytes, block_size, count_multiple
):
    _any_split_reads_as_one_range(data, range_bytes, block_size, count_multiple)


# --- a conversion reading one file in ranges ---------------------------------------------------


def _hostile_table(rows_count: int = 400) -> bytes:
    """Text labels, quoted line breaks, rows with the wrong number of fields (some not UTF-8),
    quotes that swallow lines, empty lines: what a range must give back as a whole reading."""
    lines = [b"id,x,name,kind"]
    for i in range(1, rows_count + 1):
        if i % 97 == 0:
            lines.append(b"%d,1" % i)
        elif i % 89 == 0:
            lines.append(b"%d,1,\xff\xfe,a,b" % i)
        elif i % 83 == 0:
            lines.append(b'%d,1,"opened\n%d,1,x,a\n%d,1,y" then text,b' % (i, i, i))
        elif i % 79 == 0:
            lines.append(b"%d,zz,n,a\n" % i)  # and an empty line
        elif i % 5 == 0:
            lines.append(b'%d,%d.5,"line one\nline ""two""",%s' % (i, i, b"abc"[i % 3 : i % 3 + 1]))
        else:
            lines.append(b"%d,%d,n%d,%s" % (i, i, i, b"abc"[i % 3 : i % 3 + 1]))
    return b"\n".join(lines) + b"\n"


def _convert(monkeypatch, path, out, range_mb, *extra) -> int:
    from recordforge.pipelines import cli as cli_module

    if range_mb is None:
        monkeypatch.delenv("RECORDFORGE_CSV_RANGE_MB", raising=False)
    else:
        monkeypatch.setenv("RECORDFORGE_CSV_RANGE_MB", str(range_mb))
    argv = ["convert", str(path), "-o", str(out), "--name", "t", "--quiet", "--write-index"]
    return cli_module.main([*argv, "--label-column", "kind", "--num-shards", "3", *extra])


def _files(out) -> dict:
    found = {}
    for path in sorted(out.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "dataset_info.json":
                manifest = json.loads(data)
                manifest.pop("created")
                data = manifest
            found[path.relative_to(out).as_posix()] = data
    return found


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(lambda data: data, id="lf"),
        pytest.param(lambda data: b"\xef\xbb\xbf" + data.replace(b"\n", b"\r\n"), id="bom-crlf"),
    ],
)
def test_a_file_read_in_ranges_gives_the_bytes_of_a_whole_reading(tmp_path, monkeypatch, variant):
    path = tmp_path / "t.csv"
    path.write_bytes(variant(_hostile_table()))
    assert _convert(monkeypatch, path, tmp_path / "whole", None) == 0
    # About 1 KiB ranges: dozens of them, ending inside and around the hostile rows.
    assert _convert(monkeypatch, path, tmp_path / "ranges", 0.001) == 0
    whole = _files(tmp_path / "whole")
    assert _files(tmp_path / "ranges") == whole
    assert [name for name in whole if name.startswith("errors/")] == ["errors/read.jsonl"]
    kinds = {json.loads(line)["error"] for line in whole["errors/read.jsonl"].splitlines()}
    assert kinds == {"WrongFieldCount", "UnterminatedQuote"}


def test_a_gzip_file_is_read_whole_with_ranges_asked_for(tmp_path, monkeypatch):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(_hostile_table(), mtime=0))
    assert _convert(monkeypatch, path, tmp_path / "whole", None) == 0
    assert _convert(monkeypatch, path, tmp_path / "ranges", 0.001) == 0
    assert _files(tmp_path / "ranges") == _files(tmp_path / "whole")


def test_a_quote_never_closed_fails_as_it_does_read_whole(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    # The schema comes from a.csv: b.csv's reading is the conversion's, not the sample's.
    (folder / "a.csv").write_bytes(_hostile_table(20))
    (folder / "b.csv").write_bytes(_hostile_table(300) + b'301,1,"never closed\n302,1,x,a\n')
    messages = []
    for name, range_mb in (("whole", None), ("ranges", 0.001)):
        assert _convert(monkeypatch, f"{folder}/*.csv", tmp_path / name, range_mb) == 1
        messages.append(capsys.readouterr().err.replace(str(tmp_path / name), "OUT"))
    assert messages[0] == messages[1]
    assert (
        "b.csv cannot be read to its end: a quote opened in row 301 is never closed"
        in (messages[0])
    )


def test_a_file_changed_after_its_split_fails_the_run_by_name(tmp_path, monkeypatch, capsys):
    from recordforge.transforms import table as table_module

    path = tmp_path / "t.csv"
    data = _hostile_table()
    path.write_bytes(data)
    split_ranges = table_module._SplitCsvFn._ranges

    def split_then_change(self, name):
        ranges = split_ranges(self, name)
        path.write_bytes(data.replace(b"\n2,2,n2,", b"\n2,2,n2,c\n2,2,n2,", 1))
        return ranges

    monkeypatch.setattr(table_module._SplitCsvFn, "_ranges", split_then_change)
    assert _convert(monkeypatch, path, tmp_path / "out", 0.001) == 1
    err = capsys.readouterr().err
    assert f"recordforge: failed: {path} changed during the conversion" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "dataset_info.json").exists()


def test_the_commit_wants_ranges_that_cover_the_file():
    from recordforge.transforms.core.tables.receipts import CsvLedger, CsvReceipt

    def ledger(*spans, size=100):
        found = CsvLedger()
        found.add(("listed", "a.csv"))
        for start, end in spans:
            found.add(
                (
                    "read",
                    CsvReceipt("a.csv", 1, end - start, end - start, size, start=start, end=end),
                )
            )
        return found.problems()

    assert ledger((0, 40), (40, 100)) == []
    assert ledger((40, 100), (0, 40)) == []  # in any order
    assert ledger((0, 40), (50, 100)) == ["a.csv: bytes 40 to 50 were never read"]
    assert ledger((0, 40)) == ["a.csv: bytes 40 to 100 were never read"]
    assert ledger((0, 60), (40, 100)) == ["a.csv: bytes 40 to 60 were read twice"]
    assert ledger((0, 40), (0, 40), (40, 100)) == ["a.csv: bytes 0 to 40 were read twice"]
    short = CsvLedger()
    short.add(("listed", "a.csv"))
    short.add(("read", CsvReceipt("a.csv", 1, 30, 30, 100, start=0, end=40)))
    short.add(("read", CsvReceipt("a.csv", 1, 60, 60, 100, start=40, end=100)))
    assert short.problems() == [
        "a.csv: the range of bytes 0 to 40 was not read to its end (30 of its 40 bytes)"
    ]


@pytest.mark.parametrize("value", ["abc", "-1", "inf", "nan"])
def test_a_range_size_that_is_not_a_size_is_a_usage_error(tmp_path, monkeypatch, capsys, value):
    path = tmp_path / "t.csv"
    path.write_bytes(_hostile_table(20))
    assert _convert(monkeypatch, path, tmp_path / "out", value) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"recordforge: error: RECORDFORGE_CSV_RANGE_MB={value!r}: expected a number of MB, "
        "0 or more"
    ], err
