"""`recordforge verify` end to end: real conversions, corrupted copies, the exact findings.

Offsets and record counts the tests expect are computed from the files with TensorFlow's reader
(tf.data), never with the code under test.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import zlib

import pytest
from apache_beam.io.filesystem import BeamIOError, FileMetadata, FileSystem
from conftest import make_image, run_cli

from recordforge.pipelines.inspection.checks import CHECKS

NAME = "pets"


def _images(root: pathlib.Path) -> pathlib.Path:
    for index in range(8):
        fmt = "PNG" if index % 3 == 0 else "JPEG"
        suffix = "png" if fmt == "PNG" else "jpg"
        make_image(
            root / f"class{index % 2}" / f"{index}.{suffix}", fmt, size=(40 + index, 30), seed=index
        )
    (root / "class0" / "broken.jpg").write_bytes(b"not a picture at all")
    return root


def _convert(base: pathlib.Path, *options: str) -> pathlib.Path:
    out = base / "out"
    result = run_cli("convert", _images(base / "photos"), "-o", out, "--name", NAME, *options)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> pathlib.Path:
    """A real dataset: 8 records in 2 shards of split train, 1 input in errors/probe.jsonl."""
    return _convert(tmp_path_factory.mktemp("verify"), "--num-shards", "2")


@pytest.fixture(scope="module")
def converted_gzip(tmp_path_factory) -> pathlib.Path:
    return _convert(tmp_path_factory.mktemp("verify-gz"), "--compression", "gzip")


@pytest.fixture
def dataset(converted, tmp_path) -> pathlib.Path:
    """A fresh copy of the converted dataset, to corrupt."""
    return pathlib.Path(shutil.copytree(converted, tmp_path / "copy"))


@pytest.fixture
def gz_dataset(converted_gzip, tmp_path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(converted_gzip, tmp_path / "copy"))


def manifest(out: pathlib.Path) -> dict:
    return json.loads((out / "dataset_info.json").read_text())


def shards(out: pathlib.Path) -> list[dict]:
    return manifest(out)["splits"]["train"]["shards"]


def records(path: pathlib.Path, compression: str | None = None) -> list[bytes]:
    """The shard's payloads, read by TensorFlow."""
    import tensorflow as tf

    return [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=compression)]


def offsets(path: pathlib.Path, compression: str | None = None) -> list[int]:
    """Each record's byte offset (in the uncompressed stream), from TensorFlow's record lengths,
    plus the end of the stream."""
    positions = [0]
    for payload in records(path, compression):
        positions.append(positions[-1] + 8 + 4 + len(payload) + 4)
    return positions


def write_shard(path: pathlib.Path, payloads: list[bytes], compression: str | None = None) -> None:
    """A validly framed shard, written by TensorFlow."""
    import tensorflow as tf

    options = tf.io.TFRecordOptions(compression_type=compression or "")
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for payload in payloads:
            writer.write(payload)


def fix_sizes(out: pathlib.Path) -> None:
    """Make the manifest's sizes the files' real sizes again (after rewriting a shard)."""
    info = manifest(out)
    for split in info["splits"].values():
        for shard in split["shards"]:
            shard["num_bytes"] = (out / shard["file"]).stat().st_size
        split["num_bytes"] = sum(shard["num_bytes"] for shard in split["shards"])
    (out / "dataset_info.json").write_text(json.dumps(info, indent=2))


def verify(out: pathlib.Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `recordforge verify --json`; returns the process and the parsed report."""
    result = run_cli("verify", out, "--json", *args)
    assert result.returncode in (0, 1), result.stderr
    return result, json.loads(result.stdout)


def brief(report: dict) -> list[tuple]:
    return [(f["check"], f["file"], f["record"], f["offset"]) for f in report["findings"]]


def flip(path: pathlib.Path, position: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def test_a_good_dataset_passes(converted, cli):
    result = cli("verify", converted)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    (line,) = result.stdout.splitlines()
    assert line.startswith("OK: checked 2 shards, 8 records, ")
    assert line.endswith("; no problems")

    result, report = verify(converted)
    assert result.returncode == 0
    sizes = [shard["num_bytes"] for shard in shards(converted)]
    assert report["ok"] is True
    assert report["findings"] == [] and report["omitted"] == {}
    assert report["counts"] == {"errors": 0, "warnings": 0, "by_check": {}}
    assert report["checked"] == {
        "shards": 2,
        "records": 8,
        "bytes": sum(sizes),
        "other_files": 1,  # errors/probe.jsonl
    }
    assert report["format_version"] == 1
    assert (report["manifest"], report["compression"], report["offsets"]) == (
        "dataset_info.json",
        "none",
        "file",
    )
    assert report["folder"] == str(converted)

    # -v: one progress line per shard, on stderr.
    result = cli("verify", converted, "-v")
    assert result.returncode == 0
    progress = [line for line in result.stderr.splitlines() if "checked " in line]
    assert len(progress) == 2
    for shard in shards(converted):
        assert any(
            f"checked {shard['file']}: {shard['num_records']} records" in p for p in progress
        )


def test_deep_says_what_it_decoded(converted, tmp_path, cli):
    # On a table, --deep said "with images decoded": it had none to decode.
    assert "with images decoded in " in cli("verify", converted, "--deep").stdout
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,x\n2,y\n")
    out = tmp_path / "table"
    assert cli("convert", table, "-o", out).returncode == 0
    (line,) = cli("verify", out, "--deep").stdout.splitlines()
    assert line.startswith("OK: checked 1 shard, 2 records, ")
    assert "images decoded" not in line and "(--deep: no images to decode)" in line


def test_a_flipped_payload_byte_is_a_data_crc_finding_and_later_records_are_checked(dataset, cli):
    first = shards(dataset)[0]
    path = dataset / first["file"]
    where = offsets(path)
    flip(path, where[1] + 12 + 20)  # inside record 1's payload
    flip(path, where[2] + 12 + 20)  # and record 2's
    result, report = verify(dataset)
    assert result.returncode == 1
    assert brief(report) == [
        ("data_crc", first["file"], 1, where[1]),
        ("data_crc", first["file"], 2, where[2]),
    ]
    assert report["checked"]["records"] == 8  # every record was still read
    assert report["ok"] is False
    assert report["counts"] == {"errors": 2, "warnings": 0, "by_check": {"data_crc": 2}}

    human = cli("verify", dataset)
    assert human.returncode == 1
    lines = human.stdout.splitlines()
    assert lines[0].startswith(f"{first['file']}: record 1 at byte {where[1]}: data_crc: ")
    assert lines[-1].startswith("FAILED: 2 problems (data_crc 2); checked 2 shards, 8 records")


def test_a_flipped_length_byte_stops_the_shard(dataset):
    first, second = shards(dataset)
    path = dataset / first["file"]
    where = offsets(path)
    flip(path, where[1] + 2)  # record 1's length field
    result, report = verify(dataset)
    assert result.returncode == 1
    assert brief(report) == [("length_crc", first["file"], 1, where[1])]
    unchecked = first["num_records"] - 1
    assert report["findings"][0]["message"] == (
        f"length CRC mismatch; {unchecked} of the {first['num_records']} listed records not checked"
    )
    assert report["checked"]["records"] == 1 + second["num_records"]


def test_a_truncated_shard(dataset):
    first = shards(dataset)[0]
    path = dataset / first["file"]
    where = offsets(path)
    path.write_bytes(path.read_bytes()[: where[1] + 12 + 5])  # 5 bytes into record 1's payload
    _, report = verify(dataset)
    assert brief(report) == [
        ("size_mismatch", first["file"], None, None),
        ("truncated", first["file"], 1, where[1]),
    ]
    assert report["findings"][0]["message"] == (
        f"the file has {where[1] + 17:,} bytes; the manifest lists {first['num_bytes']:,}"
    )
    length = where[2] - where[1] - 16
    assert report["findings"][1]["message"] == (
        f"truncated record (5 of {length + 4} bytes after the header); "
        f"{first['num_records'] - 1} of the {first['num_records']} listed records not checked"
    )


def test_a_shard_cut_between_records(dataset):
    first = shards(dataset)[0]
    path = dataset / first["file"]
    where = offsets(path)
    path.write_bytes(path.read_bytes()[: where[-2]])  # without its last record
    _, report = verify(dataset)
    assert brief(report) == [
        ("size_mismatch", first["file"], None, None),
        ("record_count", first["file"], None, None),
    ]
    assert report["findings"][1]["message"] == (
        f"the shard holds {first['num_records'] - 1} records; "
        f"the manifest lists {first['num_records']}"
    )


def test_a_deleted_shard(dataset):
    second = shards(dataset)[1]
    (dataset / second["file"]).unlink()
    result, report = verify(dataset)
    assert result.returncode == 1
    assert brief(report) == [("missing_file", second["file"], None, None)]
    assert report["checked"]["shards"] == 1


def test_a_deleted_errors_file(dataset):
    (dataset / "errors" / "probe.jsonl").unlink()
    _, report = verify(dataset)
    assert brief(report) == [("missing_file", "errors/probe.jsonl", None, None)]


def test_stray_files_named_like_the_datasets_shards(dataset):
    first = shards(dataset)[0]
    shutil.copy(dataset / first["file"], dataset / f"{NAME}-train.tfrecord-00000-of-00003")
    (dataset / f"{NAME}-test.tfrecord-00000-of-00001.gz").write_bytes(b"")
    (dataset / "index").mkdir()
    (dataset / f"index/{first['file']}.idx").write_text("0 16\n")  # an index not listed
    (dataset / f"{first['file']}.idx").write_text("0 16\n")  # where indexes were written once
    # Not this dataset's business: other names, other folders.
    (dataset / "notes.txt").write_text("mine\n")
    (dataset / "index" / "notes.txt").write_text("mine\n")
    (dataset / "other-train.tfrecord-00000-of-00001").write_bytes(b"x")
    result, report = verify(dataset)
    assert result.returncode == 1
    assert brief(report) == [  # in name order
        ("stray_file", f"index/{first['file']}.idx", None, None),
        ("stray_file", f"{NAME}-test.tfrecord-00000-of-00001.gz", None, None),
        ("stray_file", f"{first['file']}.idx", None, None),
        ("stray_file", f"{NAME}-train.tfrecord-00000-of-00003", None, None),
    ]


def test_a_leftover_temporary_folder_is_a_warning(dataset, cli):
    temp = dataset / ".recordforge-tmp-0123abcd"
    temp.mkdir()
    (temp / "x.tmp").write_bytes(b"12345")
    result, report = verify(dataset)
    assert result.returncode == 0
    assert report["ok"] is True
    assert brief(report) == [("temp_folder", ".recordforge-tmp-0123abcd", None, None)]
    assert report["findings"][0]["severity"] == "warning"
    assert report["counts"] == {"errors": 0, "warnings": 1, "by_check": {"temp_folder": 1}}
    human = cli("verify", dataset)
    assert human.returncode == 0
    assert human.stdout.splitlines()[0].startswith(
        "warning: .recordforge-tmp-0123abcd: temp_folder: "
    )
    assert human.stdout.splitlines()[-1].endswith("no problems; 1 warning")


@pytest.mark.parametrize(
    ("edit", "expected", "message"),
    [
        # The manifest claims one record more than shard 0 holds, its totals consistently so.
        (
            lambda info: [
                info["splits"]["train"]["shards"][0].update(
                    num_records=info["splits"]["train"]["shards"][0]["num_records"] + 1
                ),
                info["splits"]["train"].update(num_records=9),
                info.update(num_records=9, num_inputs=10),
            ],
            ("record_count", "{shard0}", None, None),
            "the shard holds {count0} records; the manifest lists {count0_plus_1}",
        ),
        (
            lambda info: info["splits"]["train"].update(num_records=7),
            ("split_totals", "dataset_info.json", None, None),
            "split 'train': num_records is 7; its shards add up to 8",
        ),
        (
            lambda info: info.update(num_inputs=10),
            ("dataset_totals", "dataset_info.json", None, None),
            "num_inputs is 10, not num_records + errors.count = 8 + 1",
        ),
        (
            lambda info: [info["errors"].update(count=2), info.update(num_inputs=10)],
            ("dataset_totals", "dataset_info.json", None, None),
            "errors.count is 2; the errors files hold 1 lines",
        ),
    ],
)
def test_manifest_counts(dataset, edit, expected, message):
    info = manifest(dataset)
    first = info["splits"]["train"]["shards"][0]
    names = {
        "shard0": first["file"],
        "count0": first["num_records"],
        "count0_plus_1": first["num_records"] + 1,
    }
    edit(info)
    (dataset / "dataset_info.json").write_text(json.dumps(info, indent=2))
    result, report = verify(dataset)
    assert result.returncode == 1
    assert brief(report) == [
        tuple(v.format(**names) if isinstance(v, str) else v for v in expected)
    ]
    assert report["findings"][0]["message"] == message.format(**names)


@pytest.mark.parametrize(
    "edit",
    [
        lambda info: info["splits"]["train"]["label_counts"].update(class0=99),
        lambda info: info["splits"]["train"]["label_counts"].pop("class1"),
        lambda info: info["labels"].__setitem__(0, "renamed"),
    ],
    ids=["count", "class removed", "class renamed"],
)
def test_label_counts_that_differ_from_the_records(dataset, edit):
    """The manifest's label_counts (what inspect shows, and counts read without scanning) were
    not checked: any edit of them passed."""
    info = manifest(dataset)
    assert info["splits"]["train"]["label_counts"] and len(set(info["labels"])) > 1
    edit(info)
    (dataset / "dataset_info.json").write_text(json.dumps(info, indent=2))
    result, report = verify(dataset)
    assert result.returncode == 1, result.stdout
    assert brief(report) == [("label_counts", "dataset_info.json", None, None)]
    assert report["findings"][0]["message"].startswith("split 'train': label_counts say ")


def _example(**features):
    import tensorflow as tf

    def feature(value):
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=value))
        if isinstance(value, list) and value and isinstance(value[0], float):
            return tf.train.Feature(float_list=tf.train.FloatList(value=value))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=value))

    return tf.train.Example(
        features=tf.train.Features(feature={k: feature(v) for k, v in features.items()})
    )


def test_records_that_break_the_feature_spec(dataset):
    import tensorflow as tf

    first = shards(dataset)[0]
    path = dataset / first["file"]
    payloads = records(path)
    parsed = [tf.train.Example.FromString(p) for p in payloads]

    wrong_dtype = tf.train.Example()
    wrong_dtype.CopyFrom(parsed[1])
    wrong_dtype.features.feature["image/height"].CopyFrom(_example(x=[b"30"]).features.feature["x"])
    missing = tf.train.Example()
    missing.CopyFrom(parsed[2])
    del missing.features.feature["image/format"]
    too_long = tf.train.Example()
    too_long.CopyFrom(parsed[3])
    too_long.features.feature["image/width"].int64_list.value.append(7)
    too_long.features.feature["extra"].CopyFrom(_example(x=[1]).features.feature["x"])
    payloads[0] = b"\x0a\x05ab"  # framed fine, but not an Example: a field runs past the end
    payloads[1:4] = [e.SerializeToString() for e in (wrong_dtype, missing, too_long)]
    write_shard(path, payloads)
    fix_sizes(dataset)

    where = offsets(path)
    _, report = verify(dataset)
    file = first["file"]
    assert brief(report) == [
        ("not_example", file, 0, 0),
        ("wrong_dtype", file, 1, where[1]),
        ("missing_feature", file, 2, where[2]),
        ("unknown_feature", file, 3, where[3]),
        ("wrong_length", file, 3, where[3]),
    ]
    messages = [f["message"] for f in report["findings"]]
    assert messages[1:] == [
        "feature 'image/height' holds bytes values; the manifest says int64",
        "required feature 'image/format' is missing",
        "feature 'extra' is not in the manifest",
        "feature 'image/width' has 2 values; its shape [] needs exactly 1",
    ]


def test_deep_decodes_every_image(dataset, tmp_path):
    import tensorflow as tf

    first = shards(dataset)[0]
    path = dataset / first["file"]
    payloads = records(path)
    broken = tf.train.Example.FromString(payloads[1])
    image = broken.features.feature["image/encoded"].bytes_list.value[0]
    broken.features.feature["image/encoded"].bytes_list.value[0] = image[: len(image) // 2]
    wrong_size = tf.train.Example.FromString(payloads[2])
    width = wrong_size.features.feature["image/width"].int64_list.value[0]
    wrong_size.features.feature["image/width"].int64_list.value[0] = width + 1
    payloads[1:3] = [broken.SerializeToString(), wrong_size.SerializeToString()]
    write_shard(path, payloads)
    fix_sizes(dataset)
    where = offsets(path)

    result, report = verify(dataset)
    assert result.returncode == 0, "without --deep the image bytes are not decoded"
    assert report["deep"] is False

    result, report = verify(dataset, "--deep")
    assert result.returncode == 1
    assert report["deep"] is True
    assert brief(report) == [
        ("image_decode", first["file"], 1, where[1]),
        ("image_facts", first["file"], 2, where[2]),
    ]
    assert report["findings"][0]["message"].startswith("image/encoded does not decode: ")
    assert report["findings"][1]["message"] == (
        f"image/width is {width + 1} but the image decodes as {width}"
    )


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    chunks, offset = [], 8
    while offset < len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        chunks.append((kind, data[offset + 8 : offset + 8 + length]))
        offset += 12 + length
    return chunks


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _tf_decodes(data: bytes) -> bool:
    import tensorflow as tf

    try:
        tf.io.decode_image(data, expand_animations=False)
    except tf.errors.InvalidArgumentError:
        return False
    return True


def test_deep_refuses_images_tensorflow_refuses_though_pillow_decodes_them(dataset):
    """--deep judges a stored image as the converter does (its structure checks, then every
    pixel), so it agrees with TensorFlow, not merely with Pillow."""
    import tensorflow as tf
    from PIL import Image

    first = shards(dataset)[0]
    path = dataset / first["file"]
    payloads = records(path)
    parsed = [tf.train.Example.FromString(p) for p in payloads]
    pngs = [
        i
        for i, e in enumerate(parsed)
        if e.features.feature["image/format"].bytes_list.value[0] == b"png"
    ]
    assert pngs, "the fixture's first shard holds a PNG"
    index = pngs[0]
    good = parsed[index].features.feature["image/encoded"].bytes_list.value[0]
    chunks = _png_chunks(good)
    assert chunks[-1][0] == b"IEND"
    # An unknown critical chunk after the image data: libpng stops at it; Pillow ignores it.
    unknown_critical = b"\x89PNG\r\n\x1a\n" + b"".join(
        _png_chunk(kind, body) for kind, body in [*chunks[:-1], (b"ABCD", b"x"), chunks[-1]]
    )
    # The image data's CRC damaged, the data itself intact: libpng checks it, Pillow does not.
    bad_crc = bytearray(good)
    idat = good.index(b"IDAT")
    bad_crc[idat + 4 + struct.unpack_from(">I", good, idat - 4)[0]] ^= 0x01
    hostile = {1: unknown_critical, 2: bytes(bad_crc)}
    for position, data in hostile.items():
        Image.open(io.BytesIO(data)).load()  # Pillow decodes it
        assert not _tf_decodes(data), "TensorFlow refuses it"
        example = tf.train.Example()
        example.CopyFrom(parsed[index])
        example.features.feature["image/encoded"].bytes_list.value[0] = data
        for key in ("image/class/label", "image/class/text"):  # label_counts stay true
            example.features.feature[key].CopyFrom(parsed[position].features.feature[key])
        payloads[position] = example.SerializeToString()
    write_shard(path, payloads)
    fix_sizes(dataset)
    where = offsets(path)

    result, report = verify(dataset)
    assert result.returncode == 0, "the records are otherwise sound"

    result, report = verify(dataset, "--deep")
    assert result.returncode == 1
    assert brief(report) == [
        ("image_decode", first["file"], 1, where[1]),
        ("image_decode", first["file"], 2, where[2]),
    ]
    messages = [f["message"] for f in report["findings"]]
    assert messages == [
        "image/encoded does not decode: CorruptImage: the PNG file is corrupt: it has a critical "
        f"chunk of an unknown type, ABCD (at byte {len(good) - 12:,})",
        "image/encoded does not decode: CorruptImage: the PNG file is corrupt: the CRC of its "
        f"IDAT chunk at byte {idat - 4:,} does not match its data",
    ]
    lines = run_cli("verify", dataset, "--deep").stdout.splitlines()
    assert lines[0].startswith(f"{first['file']}: record 1 at byte {where[1]}: image_decode: ")


def test_deep_passes_bmps_tensorflow_decodes_though_pillow_refuses_them(tmp_path):
    """An 8-bit palette BMP, and one whose compression field says RLE8 over plain pixels:
    TensorFlow reads neither palette nor compression, and decodes both (one channel);
    convert writes them, with --check-pixels too, and verify --deep passes them."""
    from PIL import Image

    folder = tmp_path / "bmps"
    folder.mkdir()
    palette = Image.new("P", (6, 4))
    palette.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0])
    palette.putdata([i % 3 for i in range(24)])
    palette.save(folder / "palette.bmp", "BMP")
    rle8 = bytearray((folder / "palette.bmp").read_bytes())
    rle8[30:34] = struct.pack("<I", 1)  # BI_RLE8, over uncompressed pixels
    (folder / "rle8_flag.bmp").write_bytes(bytes(rle8))
    import tensorflow as tf

    for name in ("palette.bmp", "rle8_flag.bmp"):
        data = (folder / name).read_bytes()
        assert tuple(tf.io.decode_image(data, expand_animations=False).shape) == (4, 6, 1)
    for option in ((), ("--check-pixels",)):
        out = tmp_path / f"out{len(option)}"
        result = run_cli("convert", folder, "-o", out, *option)
        assert result.returncode == 0, result.stderr
        assert manifest(out)["num_records"] == 2, option
        result, report = verify(out, "--deep")
        assert result.returncode == 0, report["findings"]
        assert report["checked"]["records"] == 2


def test_findings_beyond_the_limit_are_counted_not_listed(dataset, cli):
    first = shards(dataset)[0]
    path = dataset / first["file"]
    where = offsets(path)
    for start in where[:-1]:
        flip(path, start + 12 + 20)
    count = first["num_records"]
    _, report = verify(dataset, "--max-findings", "2")
    assert brief(report) == [("data_crc", first["file"], i, where[i]) for i in range(2)]
    assert report["omitted"] == {first["file"]: count - 2}
    assert report["counts"]["by_check"] == {"data_crc": count}
    assert report["counts"]["errors"] == count

    human = cli("verify", dataset, "--max-findings", "2")
    assert f"{first['file']}: {count - 2} more findings not listed" in human.stdout
    _, report = verify(dataset, "--max-findings", "0")
    assert len(report["findings"]) == count


def test_an_index_file_is_checked(dataset):
    first, second = shards(dataset)
    path = dataset / first["file"]
    where = offsets(path)
    lines = [f"{start} {end - start}\n" for start, end in zip(where, where[1:], strict=False)]
    info = manifest(dataset)
    first_index, second_index = (f"index/{shard['file']}.idx" for shard in (first, second))
    info["splits"]["train"]["shards"][0]["index"] = first_index
    info["splits"]["train"]["shards"][1]["index"] = second_index
    (dataset / "dataset_info.json").write_text(json.dumps(info, indent=2))
    (dataset / "index").mkdir()
    (dataset / first_index).write_text("".join(lines))
    _, report = verify(dataset)
    assert brief(report) == [("missing_file", second_index, None, None)]
    assert report["checked"]["other_files"] == 2  # the index and errors/probe.jsonl

    lines[1] = f"{where[1] + 1} {where[2] - where[1]}\n"
    (dataset / first_index).write_text("".join(lines))
    _, report = verify(dataset)
    assert brief(report)[0] == ("index", first_index, 1, where[1])


def test_gzip_dataset_passes_and_reports_offsets_in_the_uncompressed_stream(gz_dataset, cli):
    (shard,) = shards(gz_dataset)
    assert shard["file"].endswith(".gz")
    result, report = verify(gz_dataset)
    assert result.returncode == 0, report
    assert (report["compression"], report["offsets"]) == ("gzip", "uncompressed")
    assert report["checked"]["records"] == 8

    # A payload byte flipped inside the compressed stream (recompressed, so gzip is sound).
    path = gz_dataset / shard["file"]
    where = offsets(path, "GZIP")
    data = bytearray(gzip.decompress(path.read_bytes()))
    data[where[3] + 12 + 20] ^= 0x01
    path.write_bytes(gzip.compress(bytes(data)))
    fix_sizes(gz_dataset)
    _, report = verify(gz_dataset)
    assert brief(report) == [("data_crc", shard["file"], 3, where[3])]
    human = cli("verify", gz_dataset)
    assert human.stdout.startswith(
        f"{shard['file']}: record 3 at uncompressed byte {where[3]}: data_crc: "
    )


def _deflate_prefix_length(compressed: bytes) -> int:
    """How many uncompressed bytes a truncated gzip stream still yields (by zlib alone)."""
    return len(zlib.decompressobj(wbits=31).decompress(compressed))


@pytest.mark.parametrize("damage", ["invalid block", "trailer crc", "truncated", "not gzip"])
def test_a_corrupt_gzip_stream_is_a_finding(gz_dataset, damage):
    (shard,) = shards(gz_dataset)
    path = gz_dataset / shard["file"]
    where = offsets(path, "GZIP")
    compressed = path.read_bytes()
    expected = []
    if damage == "invalid block":
        data = bytearray(compressed)
        data[10] |= 0b110  # the first deflate block's type becomes 11, which is invalid
        path.write_bytes(bytes(data))
        record = 0
        message = (
            "the gzip stream is corrupt (Error -3 while decompressing data: invalid block type)"
        )
    elif damage == "trailer crc":
        flip(path, len(compressed) - 8)  # the CRC32 of the uncompressed data
        record, message = 8, "the gzip stream is corrupt (CRC check failed"
    elif damage == "truncated":
        cut = compressed[: len(compressed) // 2]
        path.write_bytes(cut)
        available = _deflate_prefix_length(cut)
        record = max(i for i, start in enumerate(where) if start <= available)
        message = "the gzip stream ends before its end marker"
        expected.append(("size_mismatch", shard["file"], None, None))
    else:
        flip(path, 0)  # the gzip magic number
        record, message = 0, "the gzip stream is corrupt (Not a gzipped file"
    result, report = verify(gz_dataset)
    assert result.returncode == 1
    expected.append(("gzip", shard["file"], record, where[record]))
    assert brief(report) == expected
    assert report["findings"][-1]["message"].startswith(message)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("bit", [5, 6, 7])
def test_reserved_gzip_header_flags_are_a_finding(gz_dataset, bit):
    """A bit flipped in the gzip header's reserved flags: Python's gzip reads the shard, zlib
    (TensorFlow's reader) refuses it, and verify said OK."""
    import tensorflow as tf

    (shard,) = shards(gz_dataset)
    path = gz_dataset / shard["file"]
    flip(path, 3, 1 << bit)  # FLG
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path), compression_type="GZIP"))
    result, report = verify(gz_dataset)
    assert result.returncode == 1, result.stdout
    assert brief(report) == [("gzip", shard["file"], None, None)]
    assert report["findings"][0]["message"].startswith(
        f"the gzip header sets reserved flag bits ({1 << bit:#04x})"
    )


def test_verify_works_without_tensorflow(converted):
    code = (
        "import sys\n"
        "sys.modules['tensorflow'] = None  # any import of tensorflow now fails\n"
        "from recordforge.pipelines.cli import main\n"
        "status = main(['verify', sys.argv[1], '--deep'])\n"
        "assert sys.modules['tensorflow'] is None\n"
        "sys.exit(status)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(converted)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK: checked 2 shards, 8 records")


class MemoryFileSystem(FileSystem):
    """A Beam filesystem for `memtest://` URLs, held in a dict: a stand-in for gs:// that fails
    loudly if verify reaches a file any other way than through Beam FileSystems."""

    FILES: dict[str, bytes] = {}

    @classmethod
    def scheme(cls):
        return "memtest"

    def join(self, basepath, *paths):
        return "/".join([basepath.rstrip("/"), *(p.strip("/") for p in paths)])

    def split(self, path):
        head, _, tail = path.rpartition("/")
        return head, tail

    def has_dirs(self):
        return False

    def _list(self, dir_or_prefix):
        for path, data in sorted(self.FILES.items()):
            if path.startswith(dir_or_prefix):
                yield FileMetadata(path, len(data))

    def open(self, path, mime_type="application/octet-stream", compression_type=None):
        if path not in self.FILES:
            raise BeamIOError("not found", {path: FileNotFoundError(path)})
        return io.BytesIO(self.FILES[path])

    def exists(self, path):
        return path in self.FILES

    def size(self, path):
        return len(self.FILES[path])

    def metadata(self, path):
        return FileMetadata(path, self.size(path))

    def mkdirs(self, path):
        raise NotImplementedError

    def create(self, path, mime_type="application/octet-stream", compression_type=None):
        raise NotImplementedError

    def copy(self, source_file_names, destination_file_names):
        raise NotImplementedError

    def rename(self, source_file_names, destination_file_names):
        raise NotImplementedError

    def delete(self, paths):
        raise NotImplementedError

    def last_updated(self, path):
        raise NotImplementedError


@pytest.mark.parametrize("which", ["none", "gzip"])
def test_a_dataset_behind_a_url_is_read_through_beam_filesystems(converted, converted_gzip, which):
    from recordforge.pipelines.verify import verify_dataset

    local = converted if which == "none" else converted_gzip
    url = f"memtest://bucket/datasets/{which}"
    MemoryFileSystem.FILES.clear()
    for path in local.rglob("*"):
        if path.is_file():
            MemoryFileSystem.FILES[f"{url}/{path.relative_to(local)}"] = path.read_bytes()
    report = verify_dataset(url)
    assert report.ok, [f.message for f in report.findings.listed]
    assert (report.shards, report.records, report.files) == (len(shards(local)), 8, 1)

    first = shards(local)[0]
    compression = "GZIP" if which == "gzip" else None
    where = offsets(local / first["file"], compression)
    data = MemoryFileSystem.FILES[f"{url}/{first['file']}"]
    if which == "gzip":
        data = gzip.decompress(data)
    data = bytearray(data)
    data[where[1] + 12 + 20] ^= 0x01
    data = gzip.compress(bytes(data), mtime=0) if which == "gzip" else bytes(data)
    MemoryFileSystem.FILES[f"{url}/{first['file']}"] = data
    MemoryFileSystem.FILES[f"{url}/{NAME}-train.tfrecord-00000-of-00009"] = b""
    MemoryFileSystem.FILES[f"{url}/.recordforge-tmp-1/a.tmp"] = b"123"
    del MemoryFileSystem.FILES[f"{url}/errors/probe.jsonl"]
    report = verify_dataset(url)
    found = [(f.check, f.file, f.record, f.offset) for f in report.findings.listed]
    size_changed = [("size_mismatch", first["file"], None, None)] if which == "gzip" else []
    assert found == [
        *size_changed,
        ("data_crc", first["file"], 1, where[1]),
        ("missing_file", "errors/probe.jsonl", None, None),
        ("stray_file", f"{NAME}-train.tfrecord-00000-of-00009", None, None),
        ("temp_folder", ".recordforge-tmp-1", None, None),
    ]


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["{photos}"], "is not a recordforge dataset"),
        (["{missing}"], "is not a recordforge dataset"),
        (["{out}", "--max-findings", "-1"], "--max-findings"),
        (["{out}", "--deeep"], "unrecognised option '--deeep'"),
    ],
)
def test_usage_errors(converted, tmp_path, args, phrase):
    photos = _images(tmp_path / "photos")
    paths = {"photos": photos, "missing": tmp_path / "nothing", "out": converted}
    result = run_cli("verify", *(a.format(**paths) for a in args))
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("recordforge: error: ") and phrase in line
    assert result.stdout == ""


def test_every_check_is_documented_in_the_readme():
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    for check in CHECKS:
        assert f"`{check}`" in readme, check
