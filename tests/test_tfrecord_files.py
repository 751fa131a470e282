"""Reading others' TFRecord files: plain and gzip, every problem named by kind and offset."""

from __future__ import annotations

import gzip
import io

import pytest

from recordforge.transforms.core.tfrecord.files import (
    BAD_LENGTH_CRC,
    BAD_RECORD_CRC,
    CORRUPT_GZIP,
    NOT_TFRECORD,
    TRUNCATED_GZIP,
    TRUNCATED_RECORD,
    Problem,
    compression_of,
    read_file_records,
)
from recordforge.transforms.core.tfrecord.framing import frame_record
from recordforge.transforms.core.tfrecord.inputs import is_metadata, split_of

RECORDS = [b"first", b"", b"x" * 300, b"last one"]
PLAIN = b"".join(frame_record(r) for r in RECORDS)
OFFSETS = [0, 21, 37, 353]  # each frame: 16 bytes of framing + its record


def read(data: bytes) -> list:
    return list(read_file_records(io.BytesIO(data)))


def test_plain_and_gzip_files_give_each_record_with_its_offset():
    expected = list(zip(OFFSETS, RECORDS, strict=True))
    assert read(PLAIN) == expected
    assert read(gzip.compress(PLAIN)) == expected
    assert read(b"") == []
    assert compression_of(PLAIN[:12]) == "none" and compression_of(gzip.compress(b"")) == "gzip"


def test_files_written_by_tensorflow_are_read(tmp_path):
    tf = pytest.importorskip("tensorflow")
    for compression in ("", "GZIP"):
        path = str(tmp_path / f"records{compression}")
        with tf.io.TFRecordWriter(path, options=compression or None) as writer:
            for record in RECORDS:
                writer.write(record)
        with open(path, "rb") as f:
            assert [data for _, data in read_file_records(f)] == RECORDS


def test_a_bad_data_crc_quarantines_that_record_and_reading_goes_on():
    data = bytearray(PLAIN)
    data[OFFSETS[2] + 12 + 5] ^= 0x01  # one bit of the third record's payload
    items = read(bytes(data))
    assert items[:2] == [(0, b"first"), (21, b"")]
    problem = items[2]
    assert isinstance(problem, Problem)
    assert (problem.offset, problem.kind) == (37, BAD_RECORD_CRC)
    assert problem.message.startswith("data CRC mismatch (stored 0x")
    assert items[3] == (353, b"last one")


def test_a_file_cut_short_keeps_the_records_before_and_names_the_offset():
    items = read(PLAIN[:-3])
    assert items[:3] == list(zip(OFFSETS[:3], RECORDS[:3], strict=True))
    assert items[3] == Problem(
        353,
        TRUNCATED_RECORD,
        "truncated record (9 of 12 bytes after the header): the rest of the file cannot be read "
        "as records",
    )


def test_a_bad_length_crc_ends_the_file():
    data = bytearray(PLAIN)
    data[OFFSETS[1] + 9] ^= 0xFF
    items = read(bytes(data))
    assert items[0] == (0, b"first")
    assert (items[1].offset, items[1].kind) == (21, BAD_LENGTH_CRC) and len(items) == 2


def test_gzip_cut_short_or_corrupt_keeps_what_was_read():
    compressed = gzip.compress(PLAIN * 50, mtime=0)
    items = read(compressed[: len(compressed) // 2])
    problem = items[-1]
    assert problem.kind == TRUNCATED_GZIP and problem.compressed
    good = [item for item in items if not isinstance(item, Problem)]
    assert good and problem.offset == good[-1][0] + 16 + len(good[-1][1])
    assert all(data == RECORDS[i % 4] for i, (_, data) in enumerate(good))
    # A wrong CRC in the gzip trailer: every record was read, then the stream is refused.
    corrupt = bytearray(compressed)
    corrupt[-8] ^= 0xFF
    items = read(bytes(corrupt))
    assert len(items) == 201 and items[-1].kind == CORRUPT_GZIP
    assert items[-1].offset == len(PLAIN) * 50
    assert "CRC check failed" in items[-1].message


def test_a_file_that_is_not_tfrecord_is_one_problem():
    (problem,) = read(b"this is a text file, not records\n")
    assert (problem.offset, problem.kind) == (0, NOT_TFRECORD)
    # Shorter than a header: a TFRecord file cut short.
    (short,) = read(PLAIN[:5])
    assert short.kind == TRUNCATED_RECORD


@pytest.mark.parametrize(
    "path, split",
    [
        (
            "gs://b/pipeline/CsvExampleGen/examples/7/Split-train/data_tfrecord-00000-of-00001.gz",
            "train",
        ),
        ("/x/Split-eval/sub/part-0", "eval"),
        ("/data/out/mnist-test.tfrecord-00003-of-00010", "test"),
        ("/data/out/ds-validation.tfrecord-00000-of-00001.gz", "validation"),
        ("/data/records.tfrecord", None),
        ("/data/Splits-train/x.gz", None),
    ],
)
def test_the_split_a_path_names(path, split):
    assert split_of(path) == split


@pytest.mark.parametrize(
    "relative, metadata",
    [
        ("dataset_info.json", True),
        ("sub/recordforge.json", True),
        ("features.json", True),
        ("errors/read.jsonl", True),
        ("index/ds-train.tfrecord-00000-of-00001.idx", True),
        ("ds-train.tfrecord-00000-of-00001", False),
        ("Split-train/data_tfrecord-00000-of-00001.gz", False),
        ("notes.json", False),
    ],
)
def test_metadata_files_of_datasets_are_known(relative, metadata):
    assert is_metadata(relative) is metadata
