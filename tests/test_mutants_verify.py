"""verify's checks (pipelines/inspection/checks.py) where a broken check went unnoticed.

Written for mutation testing (docs/testing.md): each test fails if the check it names is
weakened (a comparison turned one-sided, a condition dropped).
"""

from __future__ import annotations

import io
import zlib
from unittest import mock

import pytest
from conftest import make_image

from recordforge.pipelines.inspection.checks import (
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
from recordforge.transforms.core.tfrecord.framing import frame_record

SPEC = {
    "id": FeatureSpec("int64", (), False),
    "name": FeatureSpec("bytes", (), False),
    "tags": FeatureSpec("bytes", (-1,), True),
}
SHARD = "ds-train.tfrecord-00000-of-00001"
INDEX = SHARD + ".idx"


def record(**features) -> bytes:
    values = {"id": ("int64", [1]), "name": ("bytes", [b"a"]), "tags": ("bytes", [b"x"])}
    for key, value in features.items():
        key = key.replace("__", "/")
        if value is None:
            values.pop(key)
        else:
            values[key] = value
    return codec.serialize(codec.build_example(values))


def verify(records, *, listed, spec=SPEC, index=None, deep=False):
    """(check, record, offset, message) of each finding for `records` framed as one shard."""
    stream = io.BytesIO(b"".join(frame_record(r) for r in records))
    verifier = ShardVerifier(ShardInfo(SHARD, listed, 0), ExampleChecker(spec), deep=deep)
    findings = verifier.findings(stream, index, INDEX if index is not None else None)
    return [(f.check, f.record, f.offset, f.message) for f in findings]


def test_a_shard_with_more_records_than_listed():
    assert verify([record()] * 3, listed=2) == [
        ("record_count", None, None, "the shard holds 3 records; the manifest lists 2")
    ]
    assert verify([record()] * 3, listed=3) == []


def test_a_missing_optional_feature_is_no_problem_beside_another():
    """A record that fails the quick test is examined feature by feature: an optional feature
    it lacks is still not reported."""
    assert verify([record(tags=None, id=("bytes", [b"1"]))], listed=1) == [
        (
            "wrong_dtype",
            0,
            0,
            "feature 'id' holds bytes values; the manifest says int64",
        )
    ]
    assert verify([record(tags=None, extra=("int64", [1]))], listed=1) == [
        ("unknown_feature", 0, 0, "feature 'extra' is not in the manifest")
    ]


def test_an_index_line_must_have_exactly_two_numbers():
    records = [record(), record(name=("bytes", [b"longer"]))]
    first, second = (16 + len(r) for r in records)
    good = [f"0 {first}\n".encode(), f"{first} {second}\n".encode()]
    assert verify(records, listed=2, index=good) == []
    for line in (f"{first} {second} 7\n", f"{first}\n", f"{first} -{second}\n", "\n"):
        found = verify(records, listed=2, index=[good[0], line.encode()])
        text = line.rstrip("\n")
        assert found == [("index", 1, first, f"line 2 is not 'offset length': {text!r}")]


IMAGE_SPEC = {
    "image/encoded": FeatureSpec("bytes", (), False),
    "image/width": FeatureSpec("int64", (), True),
    "image/height": FeatureSpec("int64", (), True),
    "image/format": FeatureSpec("bytes", (), True),
    "image/channels": FeatureSpec("int64", (), True),
}


def image_record(png: bytes, **facts) -> bytes:
    values = {
        "image/encoded": ("bytes", [png]),
        "image/width": ("int64", [30]),
        "image/height": ("int64", [20]),
        "image/format": ("bytes", [b"png"]),
        "image/channels": ("int64", [3]),
    }
    for key, value in facts.items():
        key = "image/" + key
        if value is None:
            values.pop(key)
        else:
            values[key] = value
    return codec.serialize(codec.build_example(values))


def test_deep_compares_only_the_facts_a_record_has(tmp_path):
    png = make_image(tmp_path / "a.png", "PNG", size=(30, 20))
    records = [
        image_record(png, channels=None),  # lacks a fact: nothing to compare
        image_record(png, width=None, height=None, format=None, channels=None),
        image_record(png, channels=None, height=("int64", [21])),
        image_record(png, channels=("int64", [])),  # facts that are not one value: the
        image_record(png, channels=("int64", [1, 1])),  # spec check reports them, not deep
    ]
    found = verify(records, listed=5, spec=IMAGE_SPEC, deep=True)
    offsets = [sum(16 + len(r) for r in records[:i]) for i in range(len(records))]
    assert found == [
        ("image_facts", 2, offsets[2], "image/height is 21 but the image decodes as 20"),
        (
            "wrong_length",
            3,
            offsets[3],
            "feature 'image/channels' has 0 values; its shape [] needs exactly 1",
        ),
        (
            "wrong_length",
            4,
            offsets[4],
            "feature 'image/channels' has 2 values; its shape [] needs exactly 1",
        ),
    ]


# --- Findings ---------------------------------------------------------------------------------


def test_findings_keep_twenty_per_file_by_default_and_count_by_severity():
    findings = Findings()
    findings.extend(Finding("data_crc", "a", i, i, "bad") for i in range(25))
    findings.add(Finding("temp_folder", "t", None, None, "left", WARNING))
    findings.add(Finding("temp_folder", "u", None, None, "left", WARNING))
    assert len([f for f in findings.listed if f.file == "a"]) == 20
    assert findings.omitted == {"a": 5}
    assert findings.failing_checks == {"data_crc": 25}
    assert findings.by_check == {"data_crc": 25, "temp_folder": 2}
    assert (findings.errors, findings.warnings) == (25, 2)
    unlimited = Findings(max_per_file=None)
    unlimited.extend(Finding("data_crc", "a", i, i, "bad") for i in range(25))
    assert len(unlimited.listed) == 25 and unlimited.omitted == {}


def test_a_finding_as_a_dict():
    finding = Finding("index", "s.idx", 2, 40, "wrong", WARNING)
    assert finding.to_dict() == {
        "check": "index",
        "file": "s.idx",
        "record": 2,
        "offset": 40,
        "message": "wrong",
        "severity": "warning",
    }


# --- The Example checks -----------------------------------------------------------------------


def test_a_record_that_fits_never_needs_the_slow_diagnosis():
    """The quick test alone passes a fitting record (the slow path is for records that fail):
    present, absent optional, empty variable-length, several values."""
    spec = {**SPEC, "pair": FeatureSpec("float", (2,), False), "z": FeatureSpec("int64", (), True)}
    checker = ExampleChecker(spec)
    fitting = [
        {"id": ("int64", [1]), "name": ("bytes", [b"a"]), "pair": ("float", [1.0, 2.0])},
        {
            "id": ("int64", [1]),
            "name": ("bytes", [b"a"]),
            "pair": ("float", [1.0, 2.0]),
            "tags": ("bytes", []),
            "z": ("int64", [5]),
        },
        {
            "id": ("int64", [1]),
            "name": ("bytes", [b"a"]),
            "pair": ("float", [1.0, 2.0]),
            "tags": ("bytes", [b"x", b"y", b"z"]),
        },
    ]
    with mock.patch.object(ExampleChecker, "_diagnose", side_effect=AssertionError("slow path")):
        for features in fitting:
            assert checker.problems(codec.build_example(features)) == []


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        # Only fixed-length features: a wrong count is found without any other feature's help.
        (
            {"id": ("int64", [1, 2])},
            [("wrong_length", "feature 'id' has 2 values; its shape [] needs exactly 1")],
        ),
        (
            {"id": ("int64", [])},
            [("wrong_length", "feature 'id' has 0 values; its shape [] needs exactly 1")],
        ),
    ],
)
def test_a_wrong_count_is_found_in_a_spec_of_fixed_lengths(features, expected):
    checker = ExampleChecker({"id": FeatureSpec("int64", (), False)})
    assert checker.problems(codec.build_example(features)) == expected


def test_an_absent_optional_feature_does_not_stop_the_checks_of_the_keys_after_it():
    checker = ExampleChecker(
        {"a": FeatureSpec("int64", (), True), "b": FeatureSpec("int64", (), False)}
    )
    assert checker.problems(codec.build_example({})) == [
        ("missing_feature", "required feature 'b' is missing")
    ]


def test_every_feature_is_diagnosed_after_a_wrong_type():
    checker = ExampleChecker(
        {"a": FeatureSpec("int64", (), False), "b": FeatureSpec("int64", (2,), False)}
    )
    found = checker.problems(codec.build_example({"a": ("bytes", [b"1"]), "b": ("int64", [1])}))
    assert found == [
        ("wrong_dtype", "feature 'a' holds bytes values; the manifest says int64"),
        ("wrong_length", "feature 'b' has 1 value; its shape [2] needs exactly 2"),
    ]


def test_a_shape_with_a_zero_dimension_needs_no_values():
    checker = ExampleChecker({"empty": FeatureSpec("int64", (0,), False)})
    assert checker.problems(codec.build_example({"empty": ("int64", [])})) == []
    assert checker.problems(codec.build_example({"empty": ("int64", [7])})) == [
        ("wrong_length", "feature 'empty' has 1 value; its shape [0] needs exactly 0")
    ]


# --- One shard --------------------------------------------------------------------------------


def test_findings_in_a_shard_carry_their_messages():
    records = [record(id=("bytes", [b"1"])), record()]
    data = bytearray(b"".join(frame_record(r) for r in records))
    data[16 + len(records[0]) + 12] ^= 0xFF  # a payload byte of record 1
    verifier = ShardVerifier(ShardInfo(SHARD, 2, 0), ExampleChecker(SPEC))
    found = [(f.check, f.record, f.message) for f in verifier.findings(io.BytesIO(bytes(data)))]
    assert found[0] == (
        "wrong_dtype",
        0,
        "feature 'id' holds bytes values; the manifest says int64",
    )
    assert found[1][:2] == ("data_crc", 1)
    assert found[1][2].startswith("data CRC mismatch (stored 0x")


class _Failing(io.RawIOBase):
    def __init__(self, error: BaseException) -> None:
        self._error = error

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        raise self._error


def test_an_uncompressed_shard_never_has_gzip_findings():
    """EOFError and zlib.error from a plain stream are read errors: only a gzip shard's are
    findings of its compression."""
    for error in (EOFError("ended"), zlib.error("bad"), OSError()):
        verifier = ShardVerifier(ShardInfo(SHARD, 1, 0), ExampleChecker(SPEC))
        (found,) = verifier.findings(_Failing(error))
        name = type(error).__name__
        detail = str(error) or name
        assert (found.check, found.message) == (
            "read_error",
            f"reading failed ({name}: {detail}); 1 of the 1 listed records not checked",
        )


def test_index_findings_without_an_index_name_name_no_file():
    records = [record()]
    verifier = ShardVerifier(ShardInfo(SHARD, 1, 0), ExampleChecker(SPEC))
    stream = io.BytesIO(frame_record(records[0]))
    (found,) = verifier.findings(stream, [b"0 1\n"])
    assert (found.check, found.file) == ("index", "")


def test_index_lines_are_quoted_as_written():
    records = [record()] * 3
    size = 16 + len(records[0])
    long_line = "9" * 30 + " " + "x" * 70
    lines = [b"0 \xff1\n", b"garbage  \n", (long_line + "\n").encode()]
    found = verify(records, listed=3, index=lines)
    assert [message for *_, message in found] == [
        "line 1 is not 'offset length': '0 \ufffd1'",
        "line 2 is not 'offset length': 'garbage  '",
        f"line 3 is not 'offset length': {long_line[:60]!r}",
    ]
    found = verify(records, listed=3, index=[b"0 1 XX\n", f"{size} {size}\n".encode()] * 2)
    assert [message for *_, message in found] == [
        "line 1 is not 'offset length': '0 1 XX'",
        "line 3 is not 'offset length': '0 1 XX'",
        "the index has 1 more line than the shard's 3 records",
    ]
    good = [f"{i * size} {size}\n".encode() for i in range(3)]
    found = verify(records, listed=3, index=[*good, b"1 2\n", b"3 4\n"])
    assert [message for *_, message in found] == [
        "the index has 2 more lines than the shard's 3 records"
    ]


def test_deep_applies_the_pixel_limit_and_names_every_wrong_fact(tmp_path):
    png = make_image(tmp_path / "a.png", "PNG", size=(30, 20))
    spec = IMAGE_SPEC
    stream = io.BytesIO(frame_record(image_record(png)))
    verifier = ShardVerifier(
        ShardInfo(SHARD, 1, 0), ExampleChecker(spec), deep=True, max_pixels=599
    )
    (found,) = verifier.findings(stream)
    assert found.check == "image_decode"
    assert found.message.startswith("image/encoded does not decode: DecompressionBomb:")
    wrong = image_record(png, width=("int64", [31]), format=("bytes", [b"\xffjpeg"]))
    found = verify([wrong], listed=1, spec=spec, deep=True)
    assert found == [
        (
            "image_facts",
            0,
            0,
            "image/width is 31 but the image decodes as 30; "
            "image/format is \ufffdjpeg but the image decodes as png",
        )
    ]


# --- Whole files and the manifest -------------------------------------------------------------


def manifest(shards, *, errors=0, num_inputs=None) -> Manifest:
    records = sum(s.num_records for s in shards)
    return Manifest(
        name="ds",
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


def test_file_findings_in_full():
    assert check_file("s", 10, None) == [
        Finding("missing_file", "s", None, None, "listed in the manifest, not found")
    ]
    assert check_file("s", 10, 7) == [
        Finding("size_mismatch", "s", None, None, "the file has 7 bytes; the manifest lists 10")
    ]


def test_dataset_total_findings_in_full():
    short = manifest([ShardInfo("ds-train.tfrecord-00000-of-00001", 3, 100)], num_inputs=2)
    assert check_totals(short.to_dict(), short, "dataset_info.json") == [
        Finding(
            "dataset_totals",
            "dataset_info.json",
            None,
            None,
            "num_inputs is 2, not num_records + errors.count = 3 + 0",
        )
    ]
    errors = manifest([ShardInfo("ds-train.tfrecord-00000-of-00001", 3, 100)], errors=2)
    assert check_error_lines(errors, "dataset_info.json", 1) == [
        Finding(
            "dataset_totals",
            "dataset_info.json",
            None,
            None,
            "errors.count is 2; the errors files hold 1 lines",
        )
    ]


def test_a_stray_shard_is_called_a_shard():
    listed = manifest([ShardInfo("ds-train.tfrecord-00000-of-00002", 1, 10)])
    found = check_unlisted(
        {"ds-train.tfrecord-00000-of-00002": 10, "ds-train.tfrecord-00001-of-00002": 12}, listed
    )
    assert found == [
        Finding(
            "stray_file",
            "ds-train.tfrecord-00001-of-00002",
            None,
            None,
            "named like a shard of dataset 'ds' but not in the manifest (12 bytes)",
        )
    ]


def test_files_in_other_folders_do_not_end_the_search_for_strays():
    """A file in a subfolder that is not an index is left alone, and the files listed after it
    (in name order) are still looked at."""
    listed = manifest([ShardInfo("ds-train.tfrecord-00000-of-00002", 1, 10)])
    files = {
        "ds-train.tfrecord-00000-of-00002": 10,
        "ds-train.tfrecord-00001-of-00002.d/notes.txt": 3,  # in a folder: not a stray
        "ds-train.tfrecord-00001-of-00002.gz": 12,
        "errors/notes.txt": 5,
        "index/ds-train.tfrecord-00001-of-00002.idx": 7,
    }
    assert [(f.check, f.file) for f in check_unlisted(files, listed)] == [
        ("stray_file", "ds-train.tfrecord-00001-of-00002.gz"),
        ("stray_file", "index/ds-train.tfrecord-00001-of-00002.idx"),
    ]
