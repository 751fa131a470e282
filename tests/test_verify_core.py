"""The pure checks of `verify` (pipelines/inspection/checks.py) and the TFRecord scanner."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys

import pytest
from conftest import make_image

from recordforge.pipelines.inspection.checks import (
    CHECKS,
    WARNING,
    ExampleChecker,
    Finding,
    Findings,
    ShardVerifier,
    check_error_lines,
    check_file,
    check_totals,
    check_unlisted,
)
from recordforge.schemas import codec
from recordforge.schemas.features import FeatureSpec
from recordforge.schemas.manifest import ErrorSummary, Manifest, ShardInfo, SplitInfo
from recordforge.transforms.core.tfrecord.framing import (
    DATA_CRC,
    LENGTH_CRC,
    TRUNCATED,
    FramingProblem,
    frame_record,
    scan_records,
)

SPEC = {
    "id": FeatureSpec("int64", (), False),
    "name": FeatureSpec("bytes", (), False),
    "pair": FeatureSpec("float", (2,), False),
    "tags": FeatureSpec("bytes", (-1,), True),
}
SHARD = "ds-train.tfrecord-00000-of-00001"


def example(**features) -> bytes:
    values = {
        "id": ("int64", [1]),
        "name": ("bytes", [b"a"]),
        "pair": ("float", [0.5, 1.5]),
        "tags": ("bytes", [b"x", b"y"]),
    }
    for key, value in features.items():
        key = key.replace("__", "/")
        if value is None:
            values.pop(key)
        else:
            values[key] = value
    return codec.serialize(codec.build_example(values))


def frames(records: list[bytes]) -> tuple[bytes, list[int]]:
    """The framed stream and each record's offset (computed here from the TFRecord layout)."""
    offsets, position = [], 0
    for record in records:
        offsets.append(position)
        position += 8 + 4 + len(record) + 4
    return b"".join(frame_record(r) for r in records), offsets


def verify(records_or_stream, *, listed=None, checker=None, index=None, **options):
    if isinstance(records_or_stream, list):
        data, _ = frames(records_or_stream)
        stream = io.BytesIO(data)
        count = len(records_or_stream)
    else:
        stream, count = records_or_stream, 0
    shard = ShardInfo(SHARD, count if listed is None else listed, 0)
    verifier = ShardVerifier(shard, checker or ExampleChecker(SPEC), **options)
    found = list(verifier.findings(stream, index, SHARD + ".idx" if index is not None else None))
    return verifier, found


def brief(findings: list[Finding]) -> list[tuple]:
    return [(f.check, f.file, f.record, f.offset) for f in findings]


# The scanner.


def test_scan_reports_a_bad_payload_and_goes_on():
    data, offsets = frames([b"one", b"two", b"three"])
    corrupt = bytearray(data)
    corrupt[offsets[1] + 12] ^= 0x20  # 't' of "two"
    scanned = list(scan_records(io.BytesIO(bytes(corrupt))))
    assert [(offset, payload) for offset, payload, _ in scanned] == [
        (0, b"one"),
        (offsets[1], b"Two"),
        (offsets[2], b"three"),
    ]
    assert [p.kind if p else None for _, _, p in scanned] == [None, DATA_CRC, None]
    assert scanned[1][2].message.startswith("data CRC mismatch (stored 0x")


def test_scan_stops_at_a_bad_length():
    data, offsets = frames([b"one", b"two", b"three"])
    corrupt = bytearray(data)
    corrupt[offsets[1]] ^= 0x01
    scanned = list(scan_records(io.BytesIO(bytes(corrupt))))
    assert scanned == [
        (0, b"one", None),
        (offsets[1], b"", FramingProblem(LENGTH_CRC, "length CRC mismatch")),
    ]


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (5, "truncated header (5 of 12 bytes)"),
        (12 + 2, "truncated record (2 of 7 bytes after the header)"),
        (12 + 3 + 2, "truncated record (5 of 7 bytes after the header)"),
    ],
)
def test_scan_stops_at_a_truncation(cut, message):
    data, offsets = frames([b"one", b"two"])
    scanned = list(scan_records(io.BytesIO(data[: offsets[1] + cut])))
    assert scanned == [(0, b"one", None), (offsets[1], b"", FramingProblem(TRUNCATED, message))]


def test_scan_of_an_empty_stream_and_of_short_reads():
    assert list(scan_records(io.BytesIO(b""))) == []

    class Dribble(io.RawIOBase):  # returns at most 3 bytes per read, like a slow socket
        def __init__(self, data):
            self._data = io.BytesIO(data)

        def readable(self):
            return True

        def read(self, n=-1):
            return self._data.read(min(n, 3) if n >= 0 else 3)

    data, _ = frames([b"a" * 50, b"", b"b" * 7])
    scanned = list(scan_records(Dribble(data)))
    assert [(payload, problem) for _, payload, problem in scanned] == [
        (b"a" * 50, None),
        (b"", None),
        (b"b" * 7, None),
    ]


# Examples against the spec.


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        ({}, []),
        ({"tags": None}, []),  # optional
        ({"tags": ("bytes", [])}, []),  # variable length: none is fine
        (
            {"id": ("bytes", [b"1"])},
            [("wrong_dtype", "feature 'id' holds bytes values; the manifest says int64")],
        ),
        (
            {"tags": ("int64", [])},
            [("wrong_dtype", "feature 'tags' holds int64 values; the manifest says bytes")],
        ),
        (
            {"id": ("int64", [1, 2])},
            [("wrong_length", "feature 'id' has 2 values; its shape [] needs exactly 1")],
        ),
        (
            {"pair": ("float", [1.0])},
            [("wrong_length", "feature 'pair' has 1 value; its shape [2] needs exactly 2")],
        ),
        (
            {"id": ("int64", [])},
            [("wrong_length", "feature 'id' has 0 values; its shape [] needs exactly 1")],
        ),
        ({"name": None}, [("missing_feature", "required feature 'name' is missing")]),
        (
            {"extra": ("int64", [3])},
            [("unknown_feature", "feature 'extra' is not in the manifest")],
        ),
        (
            {"a__b": ("int64", [3]), "id": ("float", [1.0]), "pair": None},
            [
                ("unknown_feature", "feature 'a/b' is not in the manifest"),
                ("wrong_dtype", "feature 'id' holds float values; the manifest says int64"),
                ("missing_feature", "required feature 'pair' is missing"),
            ],
        ),
    ],
)
def test_example_checks(features, expected):
    checker = ExampleChecker(SPEC)
    assert checker.problems(codec.parse(example(**features))) == expected


def test_a_feature_with_no_list_set_is_an_empty_list():
    parsed = codec.parse(example())
    parsed.features.feature["tags"].Clear()
    parsed.features.feature["id"].Clear()
    assert ExampleChecker(SPEC).problems(parsed) == [
        ("wrong_length", "feature 'id' has 0 values; its shape [] needs exactly 1")
    ]


# One shard.


def test_a_sound_shard_has_no_findings():
    verifier, found = verify([example(), example(id=("int64", [2]))])
    assert found == []
    assert (verifier.records, verifier.complete) == (2, True)


def test_a_shard_reports_every_record_with_its_index_and_offset():
    records = [example(), b"\x0a\x05ab", example(id=("bytes", [b"x"])), example(), example()]
    data, offsets = frames(records)
    corrupt = bytearray(data)
    corrupt[offsets[3] + 14] ^= 0xFF  # a payload byte of record 3
    verifier, found = verify(io.BytesIO(bytes(corrupt)), listed=5)
    assert brief(found) == [
        ("not_example", SHARD, 1, offsets[1]),
        ("wrong_dtype", SHARD, 2, offsets[2]),
        ("data_crc", SHARD, 3, offsets[3]),
    ]
    assert found[0].message.startswith("the payload does not parse as a tf.train.Example")
    assert (verifier.records, verifier.complete) == (5, True)


def test_a_bad_length_ends_the_shard_and_says_what_was_not_checked():
    data, offsets = frames([example()] * 4)
    corrupt = bytearray(data)
    corrupt[offsets[1] + 3] ^= 0x01
    verifier, found = verify(io.BytesIO(bytes(corrupt)), listed=4)
    assert brief(found) == [("length_crc", SHARD, 1, offsets[1])]
    assert found[0].message == "length CRC mismatch; 3 of the 4 listed records not checked"
    assert (verifier.records, verifier.complete) == (1, False)


def test_record_count_is_checked_when_the_shard_was_read_to_its_end():
    _, found = verify([example()] * 3, listed=4)
    assert brief(found) == [("record_count", SHARD, None, None)]
    assert found[0].message == "the shard holds 3 records; the manifest lists 4"


def test_a_truncated_gzip_stream_is_a_finding():
    records = [example(name=("bytes", [bytes([i]) * 300])) for i in range(20)]
    data, offsets = frames(records)
    compressed = gzip.compress(data, mtime=0)
    stream = gzip.GzipFile(fileobj=io.BytesIO(compressed[:-8]), mode="rb")  # no trailer
    verifier, found = verify(stream, listed=20, compressed=True)
    # Every record decompresses; the missing end marker is found after the last one.
    assert brief(found) == [("gzip", SHARD, 20, len(data))]
    assert found[0].message == (
        "the gzip stream ends before its end marker; 20 records were checked before it "
        "(the manifest lists 20)"
    )

    corrupt = bytearray(compressed)
    corrupt[10] |= 0b110  # the first deflate block's type: 11, which is invalid
    stream = gzip.GzipFile(fileobj=io.BytesIO(bytes(corrupt)), mode="rb")
    _, found = verify(stream, listed=20, compressed=True)
    assert brief(found) == [("gzip", SHARD, 0, 0)]
    assert "invalid block type" in found[0].message
    assert found[0].message.endswith("20 of the 20 listed records not checked")


def test_a_failing_read_is_a_read_error():
    class Failing(io.RawIOBase):
        def readable(self):
            return True

        def read(self, n=-1):
            raise OSError("network down")

    _, found = verify(Failing(), listed=2)
    assert brief(found) == [("read_error", SHARD, 0, 0)]
    assert "OSError: network down" in found[0].message


def test_index_lines_are_compared_with_the_records():
    records = [example(), example(name=("bytes", [b"longer name"])), example()]
    data, offsets = frames(records)
    lengths = [16 + len(r) for r in records]
    good = [f"{o} {n}\n".encode() for o, n in zip(offsets, lengths, strict=True)]
    assert verify(records, index=good)[1] == []

    wrong = [good[0], f"{offsets[1]} {lengths[1] - 16}\n".encode(), b"garbage\n"]
    _, found = verify(records, index=wrong)
    assert brief(found) == [
        ("index", SHARD + ".idx", 1, offsets[1]),
        ("index", SHARD + ".idx", 2, offsets[2]),
    ]
    assert found[0].message == (
        f"line 2 says offset {offsets[1]} length {lengths[1] - 16}; "
        f"the record is at {offsets[1]} and {lengths[1]} bytes long"
    )
    assert found[1].message == "line 3 is not 'offset length': 'garbage'"

    _, found = verify(records, index=good[:1])
    assert brief(found) == [("index", SHARD + ".idx", 1, offsets[1])]
    assert found[0].message == "the index ends after 1 lines; the shard has more records"

    _, found = verify(records, index=[*good, b"999 16\n", b"\n"])
    assert brief(found) == [("index", SHARD + ".idx", 3, len(data))]
    assert found[0].message == "the index has 1 more line than the shard's 3 records"


def test_deep_decodes_images_and_compares_their_facts(tmp_path):
    spec = {
        "image/encoded": FeatureSpec("bytes", (), False),
        "image/width": FeatureSpec("int64", (), False),
        "image/height": FeatureSpec("int64", (), False),
        "image/format": FeatureSpec("bytes", (), False),
        "image/channels": FeatureSpec("int64", (), False),
    }
    png = make_image(tmp_path / "a.png", "PNG", size=(30, 20))

    def image_record(data: bytes, width=30) -> bytes:
        return codec.serialize(
            codec.build_example(
                {
                    "image/encoded": ("bytes", [data]),
                    "image/width": ("int64", [width]),
                    "image/height": ("int64", [20]),
                    "image/format": ("bytes", [b"png"]),
                    "image/channels": ("int64", [3]),
                }
            )
        )

    broken = png[:-40]  # the pixel data ends early
    records = [image_record(png), image_record(broken), image_record(png, width=31)]
    _, offsets = frames(records)
    checker = ExampleChecker(spec)
    assert verify(records, checker=checker)[1] == []
    _, found = verify(records, checker=checker, deep=True)
    assert brief(found) == [
        ("image_decode", SHARD, 1, offsets[1]),
        ("image_facts", SHARD, 2, offsets[2]),
    ]
    assert found[0].message.startswith("image/encoded does not decode: TruncatedImage:")
    assert found[1].message == "image/width is 31 but the image decodes as 30"


def test_deep_keeps_the_decompression_bomb_guard(tmp_path):
    from conftest import png_bomb

    png_bomb(tmp_path / "bomb.png", 20_000, 20_000)
    spec = {"image/encoded": FeatureSpec("bytes", (), False)}
    record = codec.serialize(
        codec.build_example({"image/encoded": ("bytes", [(tmp_path / "bomb.png").read_bytes()])})
    )
    _, found = verify([record], checker=ExampleChecker(spec), deep=True, max_pixels=1_000_000)
    assert brief(found) == [("image_decode", SHARD, 0, 0)]
    assert "DecompressionBomb" in found[0].message


# Findings and the checks of whole files.


def test_findings_are_all_counted_but_only_some_listed():
    findings = Findings(max_per_file=2)
    for record in range(5):
        findings.add(Finding("data_crc", "a", record, record * 10, "bad"))
    findings.add(Finding("missing_file", "b", None, None, "gone"))
    findings.add(Finding("temp_folder", ".recordforge-tmp-x", None, None, "left", WARNING))
    assert [f.record for f in findings.listed if f.file == "a"] == [0, 1]
    assert findings.omitted == {"a": 3}
    assert findings.by_check == {"data_crc": 5, "missing_file": 1, "temp_folder": 1}
    assert (findings.errors, findings.warnings, findings.ok) == (6, 1, False)
    warnings_only = Findings()
    warnings_only.add(Finding("temp_folder", ".recordforge-tmp-x", None, None, "left", WARNING))
    assert warnings_only.ok
    assert set(CHECKS) >= set(findings.by_check)


def test_listed_files_must_exist_with_their_size():
    assert check_file("s", 10, 10) == []
    assert check_file("e.jsonl", None, 3) == []
    assert brief(check_file("s", 10, None)) == [("missing_file", "s", None, None)]
    (mismatch,) = check_file("s", 10, 7)
    assert (mismatch.check, mismatch.message) == (
        "size_mismatch",
        "the file has 7 bytes; the manifest lists 10",
    )


def _manifest(name="ds", shards=None, errors=0, num_inputs=None) -> Manifest:
    shards = shards or (ShardInfo(f"{name}-train.tfrecord-00000-of-00001", 3, 100),)
    records = sum(s.num_records for s in shards)
    return Manifest(
        name=name,
        tool_version="0",
        created="",
        num_inputs=records + errors if num_inputs is None else num_inputs,
        splits={"train": SplitInfo(tuple(shards))},
        features=SPEC,
        labels=None,
        plan={},
        errors=ErrorSummary(count=errors, files=("errors/probe.jsonl",) if errors else ()),
        compression="none",
        options={},
    )


def test_manifest_totals():
    manifest = _manifest()
    raw = manifest.to_dict()
    assert check_totals(raw, manifest, "dataset_info.json") == []
    raw["splits"]["train"]["num_records"] = 4
    raw["splits"]["train"]["num_shards"] = 2
    raw["num_records"] = 5
    found = check_totals(raw, manifest, "dataset_info.json")
    assert [(f.check, f.file, f.message) for f in found] == [
        (
            "split_totals",
            "dataset_info.json",
            "split 'train': num_records is 4; its shards add up to 3",
        ),
        (
            "split_totals",
            "dataset_info.json",
            "split 'train': num_shards is 2; its shards add up to 1",
        ),
        ("dataset_totals", "dataset_info.json", "num_records is 5; the splits add up to 3"),
    ]
    short = _manifest(num_inputs=2)
    (found,) = check_totals(short.to_dict(), short, "dataset_info.json")
    assert found.message == "num_inputs is 2, not num_records + errors.count = 3 + 0"
    errors = _manifest(errors=2)
    assert check_error_lines(errors, "dataset_info.json", 2) == []
    (found,) = check_error_lines(errors, "dataset_info.json", 1)
    assert found.message == "errors.count is 2; the errors files hold 1 lines"


def test_stray_files_and_temporary_folders():
    manifest = _manifest(
        shards=(
            ShardInfo(
                "ds-train.tfrecord-00000-of-00002",
                1,
                10,
                "index/ds-train.tfrecord-00000-of-00002.idx",
            ),
            ShardInfo("ds-train.tfrecord-00001-of-00002", 1, 10),
        ),
        errors=1,
    )
    files = {
        "dataset_info.json": 1,
        "ds-train.tfrecord-00000-of-00002": 10,
        "index/ds-train.tfrecord-00000-of-00002.idx": 5,
        "ds-train.tfrecord-00001-of-00002": 10,
        "errors/probe.jsonl": 5,
        "ds-train.tfrecord-00000-of-00001": 30,  # an older conversion's shard
        "index/ds-train.tfrecord-00001-of-00002.idx": 4,  # an index the manifest does not list
        "ds-train.tfrecord-00000-of-00002.idx": 4,  # an index where they were once written
        "index/notes.txt": 3,  # not named like an index
        "ds-test.tfrecord-00000-of-00001.gz": 9,
        "other-train.tfrecord-00000-of-00001": 10,  # another dataset's name: not ours
        "notes.txt": 3,
        "sub/ds-train.tfrecord-00000-of-00001": 3,  # not at the top
        ".recordforge-tmp-abc/x.tmp": 7,
        ".recordforge-tmp-abc/y.tmp": 8,
    }
    found = check_unlisted(files, manifest)
    assert [(f.check, f.file, f.severity) for f in found] == [
        ("stray_file", "ds-test.tfrecord-00000-of-00001.gz", "error"),
        ("stray_file", "ds-train.tfrecord-00000-of-00001", "error"),
        ("stray_file", "ds-train.tfrecord-00000-of-00002.idx", "error"),
        ("stray_file", "index/ds-train.tfrecord-00001-of-00002.idx", "error"),
        ("temp_folder", ".recordforge-tmp-abc", "warning"),
    ]
    assert found[3].message == (
        "named like an index of dataset 'ds' but not in the manifest (4 bytes)"
    )
    assert found[4].message == (
        "a conversion's temporary folder was left behind (2 files, 15 bytes); "
        "the dataset does not need it"
    )


def test_the_checks_need_neither_beam_nor_tensorflow():
    code = (
        "import sys; sys.modules['apache_beam'] = None; sys.modules['tensorflow'] = None; "
        "import recordforge.pipelines.inspection.checks"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
