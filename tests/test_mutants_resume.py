"""What `--resume` and the commit trust, as pure functions: part records and shard
fingerprints (transforms/core/files/parts.py), CSV receipts (transforms/core/tables/receipts.py)
and the directory exchange (transforms/core/files/swap.py).

Written for mutation testing (docs/testing.md, issue 18 item 3): these ran only inside
conversions (in Beam's workers, where mutmut's switch does not reach). Each test states a rule
the fault handling depends on: a fingerprint changes with everything that shapes a shard's
bytes and with nothing else; a part record reads back as written and refuses another version;
a CSV file counts only when one reader read every byte of it once.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os

import numpy as np
import pyarrow as pa
import pytest

from recordforge.transforms.core.files import swap
from recordforge.transforms.core.files.parts import (
    PART_FORMAT,
    PartRecord,
    shard_fingerprint,
    source_files,
)
from recordforge.transforms.core.records import REF_SCHEMA
from recordforge.transforms.core.tables.receipts import CsvLedger, CsvReceipt

# --- part records -------------------------------------------------------------------------

PART = PartRecord(
    file="ds-train.tfrecord-00001-of-00004",
    split="train",
    index=1,
    num_shards=4,
    num_records=12,
    num_bytes=3456,
    crc32c=0xDEADBEEF,
    fingerprint="0123abcd",
    staged="ds-train.tfrecord-00001-of-00004.a1b2",
    index_file="index/ds-train.tfrecord-00001-of-00004.idx",
    index_staged="ds-train.tfrecord-00001-of-00004.a1b2.idx",
    index_bytes=99,
    index_crc32c=7,
    label_counts=((0, 5), (2, 7)),
)


def test_a_part_record_reads_back_as_written():
    text = PART.to_json()
    assert text.endswith("}\n") and text.count("\n") == 1
    document = json.loads(text)
    assert document == {
        "format_version": PART_FORMAT,
        "file": "ds-train.tfrecord-00001-of-00004",
        "split": "train",
        "index": 1,
        "num_shards": 4,
        "num_records": 12,
        "num_bytes": 3456,
        "crc32c": 0xDEADBEEF,
        "fingerprint": "0123abcd",
        "staged": "ds-train.tfrecord-00001-of-00004.a1b2",
        "index_file": "index/ds-train.tfrecord-00001-of-00004.idx",
        "index_staged": "ds-train.tfrecord-00001-of-00004.a1b2.idx",
        "index_bytes": 99,
        "index_crc32c": 7,
        "label_counts": [[0, 5], [2, 7]],
    }
    assert list(document) == sorted(document)  # the same record, the same bytes
    assert PartRecord.from_json(text) == PART
    bare = PartRecord("f", "train", 0, 1, 0, 0, 0, "fp", "f.x")
    assert PartRecord.from_json(bare.to_json()) == bare


@pytest.mark.parametrize("version", [None, PART_FORMAT + 1, 0])
def test_a_part_record_of_another_version_is_refused(version):
    document = json.loads(PART.to_json())
    if version is None:
        del document["format_version"]
    else:
        document["format_version"] = version
    with pytest.raises(ValueError, match="^not a part record of this version$"):
        PartRecord.from_json(json.dumps(document))


# --- shard fingerprints -------------------------------------------------------------------


def refs(rows: list[dict]) -> pa.Table:
    """A RecordRefs table (REF_SCHEMA) from rows giving some of its columns."""
    defaults = {
        "split": "train",
        "order": b"",
        "size": 0,
        "example": None,
        "payload_path": None,
        "payload_size": None,
        "path": "a.csv",
        "row": None,
        "label": None,
        "payload_offset": None,
        "payload_version": None,
    }
    filled = [{**defaults, **row} for row in rows]
    return pa.Table.from_pylist(filled, schema=REF_SCHEMA)


TABLE_ROWS = [
    {"order": b"\x02k2", "size": 30, "example": b"ex-2", "row": 2},
    {"order": b"\x01k1", "size": 20, "example": b"ex-1", "row": 1},
    {"order": b"\x03k3", "size": 40, "example": b"ex-3", "row": 3},
]
IMAGE_ROWS = [
    {
        "order": b"\x05i",
        "size": 500,
        "example": b"skeleton-a",
        "payload_path": "img/a.png",
        "payload_size": 400,
        "payload_offset": 7,
        "path": "img/a.png",
    },
    {
        "order": b"\x04j",
        "size": 600,
        "example": b"skeleton-b",
        "payload_path": "img/b.png",
        "payload_size": 480,
        "payload_offset": 9,
        "path": "img/b.png",
    },
]
PLACE = {"run_key": "k1", "split": "train", "index": 0, "num_shards": 2}


def fingerprint(rows, order=None, sources=None, **place) -> str:
    table = refs(rows)
    if order is None:  # positions in order-key order, computed here independently
        order = sorted(range(len(rows)), key=lambda i: rows[i]["order"])
    if sources is None:
        sources = {path: (10, 1) for path in source_files(table)}
    return shard_fingerprint(
        table, np.array(order, dtype=np.int64), sources=sources, **{**PLACE, **place}
    )


@pytest.mark.parametrize("rows", [TABLE_ROWS, IMAGE_ROWS], ids=["table", "images"])
def test_a_fingerprint_does_not_depend_on_the_order_records_arrive_in(rows):
    assert fingerprint(rows) == fingerprint(rows[::-1]) == fingerprint(list(rows))
    assert len(fingerprint(rows)) == 32 and int(fingerprint(rows), 16) >= 0


@pytest.mark.parametrize(
    "place",
    [{"run_key": "k2"}, {"split": "validation"}, {"index": 1}, {"num_shards": 3}],
)
@pytest.mark.parametrize("rows", [TABLE_ROWS, IMAGE_ROWS], ids=["table", "images"])
def test_a_fingerprint_changes_with_the_shards_place_and_the_options(rows, place):
    assert fingerprint(rows, **place) != fingerprint(rows)


def changed(rows, position, **values):
    return [{**row, **values} if i == position else row for i, row in enumerate(rows)]


@pytest.mark.parametrize(
    "change",
    [
        {"order": b"\x01k1x"},
        {"size": 21},
        {"payload_path": "other.png"},
        {"payload_size": 1},
        {"payload_offset": 3},
    ],
)
def test_a_fingerprint_changes_with_what_shapes_a_table_shards_bytes(change):
    assert fingerprint(changed(TABLE_ROWS, 1, **change)) != fingerprint(TABLE_ROWS)


@pytest.mark.parametrize(
    "change",
    [
        {"order": b"\x05i!"},
        {"size": 501},
        {"example": b"skeleton-A"},
        {"example": b"skeleton-a" + b"\x00"},
        {"payload_path": "img/c.png"},
        {"payload_size": 401},
        {"payload_offset": 8},
    ],
)
def test_a_fingerprint_changes_with_what_shapes_an_image_shards_bytes(change):
    assert fingerprint(changed(IMAGE_ROWS, 0, **change)) != fingerprint(IMAGE_ROWS)


def test_a_fingerprint_tells_a_missing_value_from_an_empty_one():
    # Image records beside a record without an image (null), or with an empty path.
    rows = [*IMAGE_ROWS, {"order": b"\x07t", "size": 9, "example": b"e", "path": "t.csv"}]
    assert fingerprint(changed(rows, 2, payload_path="")) != fingerprint(rows)
    # The bytes of two values are told apart from their lengths: "ab" + "c" is not "a" + "bc".
    first = changed(changed(IMAGE_ROWS, 0, example=b"ab"), 1, example=b"c")
    second = changed(changed(IMAGE_ROWS, 0, example=b"a"), 1, example=b"bc")
    assert fingerprint(first) != fingerprint(second)


def test_a_table_shards_fingerprint_leaves_its_examples_to_the_csv_files_identity():
    """A table's rows are their CSV file's: its identity stands for them, not each Example."""
    assert fingerprint(changed(TABLE_ROWS, 0, example=b"other")) == fingerprint(TABLE_ROWS)
    assert fingerprint(TABLE_ROWS, sources={"a.csv": (10, 2)}) != fingerprint(
        TABLE_ROWS, sources={"a.csv": (10, 1)}
    )
    assert fingerprint(TABLE_ROWS, sources={"b.csv": (10, 1)}) != fingerprint(
        TABLE_ROWS, sources={"a.csv": (10, 1)}
    )
    # Columns that do not shape the bytes: where each row came from, its label.
    assert fingerprint(changed(TABLE_ROWS, 0, row=9, label=4)) == fingerprint(TABLE_ROWS)


def test_a_fingerprint_of_sources_does_not_depend_on_their_order():
    one = {"a.csv": (10, 1), "b.csv": (20, 2)}
    other = {"b.csv": (20, 2), "a.csv": (10, 1)}
    assert fingerprint(TABLE_ROWS, sources=one) == fingerprint(TABLE_ROWS, sources=other)
    assert fingerprint(TABLE_ROWS, sources=one) != fingerprint(
        TABLE_ROWS, sources={"a.csv": (20, 2), "b.csv": (10, 1)}
    )


def test_a_fingerprint_of_a_sliced_column():
    """Records taken from a larger batch (a slice: offsets not from 0) fingerprint as the same
    records built alone."""
    rows = IMAGE_ROWS + [{**IMAGE_ROWS[0], "order": b"\x09z", "example": b"tail"}]
    sliced = refs(rows).slice(1, 2)
    alone = refs(rows[1:])
    sources = {path: (1, 1) for path in source_files(alone)}
    order = np.array([0, 1], dtype=np.int64)
    assert shard_fingerprint(sliced, order, sources=sources, **PLACE) == shard_fingerprint(
        alone, order, sources=sources, **PLACE
    )


def test_an_empty_shards_fingerprint():
    empty = refs([])
    fp = shard_fingerprint(empty, np.zeros(0, np.int64), sources={}, **PLACE)
    assert fp != shard_fingerprint(empty, np.zeros(0, np.int64), sources={}, **PLACE | {"index": 1})


def test_source_files_are_the_inputs_and_the_images_they_name():
    table = refs(
        [
            {"path": "t.csv", "payload_path": "img/x.png"},
            {"path": "t.csv", "payload_path": None},
            {"path": "u.csv", "payload_path": "img/a.png"},
            {"path": "img/a.png", "payload_path": "img/a.png"},
        ]
    )
    assert source_files(table) == ["img/a.png", "img/x.png", "t.csv", "u.csv"]
    assert source_files(refs([{"path": "t.csv"}])) == ["t.csv"]


# --- CSV receipts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("receipt", "complete"),
    [
        (CsvReceipt("a.csv", rows=3, num_bytes=100, stored_bytes=100, stored_size=100), True),
        # Text read short of the stored bytes, or stored bytes short of the file.
        (CsvReceipt("a.csv", rows=3, num_bytes=99, stored_bytes=100, stored_size=100), False),
        (CsvReceipt("a.csv", rows=3, num_bytes=100, stored_bytes=99, stored_size=100), False),
        (CsvReceipt("a.csv", rows=3, num_bytes=101, stored_bytes=101, stored_size=100), False),
        (CsvReceipt("a.csv", rows=0, num_bytes=0, stored_bytes=0, stored_size=0), True),
        # Compressed: the text is longer than the stored bytes, which must all be consumed.
        (
            CsvReceipt(
                "a.csv.gz", rows=3, num_bytes=500, stored_bytes=80, stored_size=80, compressed=True
            ),
            True,
        ),
        (
            CsvReceipt(
                "a.csv.gz", rows=3, num_bytes=500, stored_bytes=79, stored_size=80, compressed=True
            ),
            False,
        ),
        # Never read (the defaults), read without a count of rows or of the file's size.
        (CsvReceipt("a.csv"), False),
        (CsvReceipt("a.csv", rows=-1, num_bytes=5, stored_bytes=5, stored_size=5), False),
        (CsvReceipt("a.csv", rows=1, num_bytes=-1, stored_bytes=-1, stored_size=-1), False),
        (CsvReceipt("a.csv", quarantined=True), True),
    ],
)
def test_a_csv_file_is_complete_when_every_byte_was_read(receipt, complete):
    assert receipt.complete is complete


def test_the_bytes_a_receipt_says_were_read():
    plain = CsvReceipt("a.csv", rows=1, num_bytes=40, stored_bytes=50, stored_size=50)
    assert plain.read_bytes == 40
    plain = CsvReceipt("a.csv", rows=1, num_bytes=60, stored_bytes=50, stored_size=50)
    assert plain.read_bytes == 50
    gz = CsvReceipt("a.gz", rows=1, num_bytes=60, stored_bytes=50, stored_size=50, compressed=True)
    assert gz.read_bytes == 50


def ledger(*items) -> CsvLedger:
    book = CsvLedger()
    for item in items:
        book.add(item)
    return book


def read(path, stored=10, size=10) -> tuple:
    return ("read", CsvReceipt(path, 1, stored, stored, size))


def test_a_ledger_of_every_file_read_once_to_its_end_has_no_problems():
    assert ledger(("listed", "a.csv"), read("a.csv")).problems() == []
    assert ledger().problems() == []
    quarantined = ("read", CsvReceipt("b.csv", quarantined=True))
    assert ledger(("listed", "b.csv"), quarantined).problems() == []


def test_a_ledger_names_every_file_that_does_not_add_up_in_name_order():
    book = ledger(
        ("listed", "e.csv"),
        ("listed", "a.csv"),
        ("listed", "a.csv"),
        read("a.csv"),
        read("b.csv"),
        ("listed", "c.csv"),
        ("listed", "d.csv"),
        read("d.csv"),
        read("d.csv"),
        ("listed", "f.csv"),
        read("f.csv", stored=1234, size=5678),
        read("e.csv"),
    )
    assert book.problems() == [
        "a.csv was listed 2 times",
        "b.csv was read but never listed",
        "c.csv was listed but no reader reported reading it",
        "d.csv was read 2 times",
        "f.csv was not read to its end (1,234 of its 5,678 bytes)",
    ]


def test_ledgers_merge_their_listings_and_receipts():
    first = ledger(("listed", "a.csv"), read("b.csv"))
    second = ledger(("listed", "b.csv"), read("a.csv"), ("listed", "c.csv"))
    merged = first.merge(second)
    assert merged is first
    assert merged.problems() == ["c.csv was listed but no reader reported reading it"]
    assert merged.merge(ledger(("listed", "a.csv"), read("c.csv"))).problems() == [
        "a.csv was listed 2 times"
    ]
    again = ledger(read("x.csv")).merge(ledger(read("x.csv"), ("listed", "x.csv")))
    assert again.problems() == ["x.csv was read 2 times"]


def piece(start, end, read=None, size=100, path="a.csv") -> tuple:
    """A receipt of the range [start, end) of a file of `size` bytes, `read` of its bytes read."""
    done = end - start if read is None else read
    return ("read", CsvReceipt(path, 1, done, done, size, start=start, end=end))


def range_problems(*pieces) -> list[str]:
    return ledger(("listed", "a.csv"), *pieces).problems()


def test_a_file_read_in_ranges_that_cover_it_exactly_has_no_problems():
    assert range_problems(piece(40, 100), piece(0, 40)) == []  # handed in any order
    assert range_problems(piece(0, 100)) == []
    # An empty file as two empty ranges: they overlap no byte (not "read 2 times").
    assert range_problems(piece(0, 0, size=0), piece(0, 0, size=0)) == []
    assert CsvReceipt("a.csv", start=0, end=0).is_range and not CsvReceipt("a.csv").is_range


@pytest.mark.parametrize(
    ("pieces", "sentence"),
    [
        ([piece(0, 40), piece(50, 100)], "bytes 40 to 50 were never read"),
        ([piece(10, 100)], "bytes 0 to 10 were never read"),
        ([piece(0, 60), piece(50, 100)], "bytes 50 to 60 were read twice"),
        ([piece(0, 100), piece(20, 30)], "bytes 20 to 30 were read twice"),
        ([piece(0, 40), piece(40, 60)], "bytes 60 to 100 were never read"),
        ([piece(0, 120)], "ranges reach byte 120, past its end (100 bytes)"),
        (
            [piece(0, 40, read=30), piece(40, 100)],
            "the range of bytes 0 to 40 was not read to its end (30 of its 40 bytes)",
        ),
        (
            [piece(0, 40), piece(40, 100, read=50)],
            "the range of bytes 40 to 100 was not read to its end (50 of its 60 bytes)",
        ),
        (
            [piece(0, 4_000, read=1_500, size=2_000_000), piece(5_000, 2_000_000, size=2_000_000)],
            "the range of bytes 0 to 4,000 was not read to its end (1,500 of its 4,000 bytes); "
            "bytes 4,000 to 5,000 were never read",
        ),
    ],
)
def test_what_does_not_add_up_in_the_ranges_of_a_file(pieces, sentence):
    assert range_problems(*pieces) == [f"a.csv: {sentence}"]


def test_a_file_read_both_whole_and_in_ranges_or_changing_size_is_named():
    assert range_problems(read("a.csv", stored=100, size=100), piece(0, 100)) == [
        "a.csv was read both whole and in ranges"
    ]
    assert range_problems(piece(0, 40, size=90), piece(40, 100)) == [
        "a.csv changed size while its ranges were read (90 and 100)"
    ]
    assert range_problems(piece(0, 40, size=1_000_000), piece(40, 100, size=2_000_000)) == [
        "a.csv changed size while its ranges were read (1,000,000 and 2,000,000)"
    ]


# --- the directory exchange ---------------------------------------------------------------


def test_renameat2_is_found_and_called_as_glibc_declares_it(tmp_path):
    """The lookup itself (it runs once, at import): the function it returns exchanges two
    folders, returns 0, and leaves errno readable when it fails."""
    function = swap._libc_renameat2()
    assert function is not None and swap.exchange_available()
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "one").write_text("1")
    (second / "two").write_text("2")
    result = function(-100, bytes(first), -100, bytes(second), 2)  # AT_FDCWD, RENAME_EXCHANGE
    assert result == 0
    assert [p.name for p in first.iterdir()] == ["two"]
    assert [p.name for p in second.iterdir()] == ["one"]
    ctypes.set_errno(0)
    assert function(-100, bytes(tmp_path / "missing"), -100, bytes(second), 2) == -1
    assert ctypes.get_errno() == errno.ENOENT


def test_exchange_swaps_two_folders_and_says_why_it_cannot(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "x").write_text("x")
    swap.exchange(str(first), str(second))
    assert not list(first.iterdir()) and [p.name for p in second.iterdir()] == ["x"]
    missing = tmp_path / "missing"
    with pytest.raises(OSError) as raised:
        swap.exchange(str(missing), str(second))
    assert raised.value.errno == errno.ENOENT
    assert raised.value.strerror == (
        f"cannot exchange {missing} and {second}: {os.strerror(errno.ENOENT)}"
    )


def test_exchange_without_renameat2_is_enosys(monkeypatch, tmp_path):
    monkeypatch.setattr(swap, "_RENAMEAT2", None)
    assert not swap.exchange_available()
    with pytest.raises(OSError) as raised:
        swap.exchange(str(tmp_path), str(tmp_path))
    assert raised.value.errno == errno.ENOSYS
    assert raised.value.strerror == "renameat2 is not available in this C library"
