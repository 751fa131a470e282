"""`recordforge reshard`: TFRecord files (a TFX ExampleGen output, globs, plain and gzip, corrupt
ones) into a planned dataset; the records are the input's, byte for byte.

Inputs are written by TensorFlow itself (tf.io.TFRecordWriter, tf.train.Example), as ExampleGen
writes them; outputs are read back with tf.data and checked by `recordforge verify`.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import random

import pytest
from conftest import read_dataset, read_errors, run_cli, shard_files

import recordforge
from recordforge.transforms.core.tfrecord.framing import frame_record, read_records

SMALL_SHARDS = ("--min-shard-mb", "0.05", "--max-shard-mb", "0.2")


def examples(count: int, seed: int) -> list[bytes]:
    """`count` serialized tf.train.Examples of varied sizes (about 50 B to 4 KB)."""
    import tensorflow as tf

    rng = random.Random(seed)
    records = []
    for i in range(count):
        feature = {
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[seed * 100_000 + i])),
            "score": tf.train.Feature(float_list=tf.train.FloatList(value=[rng.random()])),
            "text": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[b"w" * rng.randint(0, 4000)])
            ),
            "values": tf.train.Feature(
                float_list=tf.train.FloatList(value=[rng.random()] * rng.randint(0, 4))
            ),
        }
        if i % 5:
            feature["tag"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"t%d" % i]))
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        records.append(example.SerializeToString())  # as ExampleGen does (not deterministic)
    return records


def write_tfrecords(path: pathlib.Path, records, compression: str | None = None) -> None:
    import tensorflow as tf

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for record in records:
            writer.write(record)


@pytest.fixture(scope="module")
def examplegen(tmp_path_factory) -> tuple[pathlib.Path, dict[str, list[bytes]]]:
    """An ExampleGen output artifact: Split-train (3 gzip files) and Split-eval (1 file)."""
    artifact = tmp_path_factory.mktemp("pipeline") / "CsvExampleGen" / "examples" / "7"
    records = {"train": examples(1200, 1), "eval": examples(300, 2)}
    for split, files in (("train", 3), ("eval", 1)):
        for i in range(files):
            name = f"data_tfrecord-{i:05d}-of-{files:05d}.gz"
            write_tfrecords(artifact / f"Split-{split}" / name, records[split][i::files], "GZIP")
    return artifact, records


def output_records(out: pathlib.Path) -> dict[str, list[bytes]]:
    """Each split's records as stored, shard by shard (both CRCs checked)."""
    info = json.loads((out / "dataset_info.json").read_text())
    found = {}
    for split, entry in info["splits"].items():
        found[split] = []
        for shard in entry["shards"]:
            opener = gzip.open if info["compression"] == "gzip" else open
            with opener(out / shard["file"], "rb") as f:
                found[split] += list(read_records(f))
    return found


def shards_bytes(out: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in shard_files(out)}


def test_examplegen_output_keeps_its_splits_and_its_records_byte_for_byte(examplegen, tmp_path):
    artifact, records = examplegen
    out = tmp_path / "out"
    done = run_cli("reshard", artifact, "--output", out, "--num-hosts", "2", *SMALL_SHARDS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Resharded 1,500 inputs into 1,500 records")
    info, parsed = read_dataset(out)  # tf.data with the manifest's spec
    assert list(info["splits"]) == ["eval", "train"]  # the input's splits, sorted
    stored = output_records(out)
    for split in ("train", "eval"):
        assert collections.Counter(stored[split]) == collections.Counter(records[split])
        assert len(parsed[split]) == len(records[split])
    assert sorted(int(r["id"]) for r in parsed["train"]) == sorted(100_000 + i for i in range(1200))
    assert info["features"] == {
        "id": {"dtype": "int64", "shape": [], "optional": False},
        "score": {"dtype": "float", "shape": [], "optional": False},
        "tag": {"dtype": "bytes", "shape": [-1], "optional": True},
        "text": {"dtype": "bytes", "shape": [], "optional": False},
        "values": {"dtype": "float", "shape": [-1], "optional": False},
    }
    assert info["source"]["kind"] == "tfrecord" and info["source"]["splits"] == ["eval", "train"]
    assert info["options"]["splits_from"] == "input"
    # Planned and balanced: a multiple of the hosts, no shard past its share plus one record.
    for split, entry in info["splits"].items():
        plan = info["plan"]["splits"][split]
        assert entry["num_shards"] == plan["num_shards"] and plan["num_shards"] % 2 == 0
        share = plan["total_bytes"] / plan["num_shards"]
        for shard in entry["shards"]:
            assert shard["num_bytes"] <= share + plan["max_record_bytes"]
            assert (out / shard["file"]).stat().st_size == shard["num_bytes"]
    assert info["splits"]["train"]["num_shards"] >= 4
    verified = run_cli("verify", out)
    assert verified.returncode == 0, verified.stdout
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_the_output_depends_on_the_records_not_on_files_order_or_runner(examplegen, tmp_path):
    artifact, records = examplegen
    everything = records["train"] + records["eval"]
    # The same records in one plain file, reversed, beside an empty file.
    plain = tmp_path / "one-file"
    write_tfrecords(plain / "all.tfrecord", list(reversed(everything)))
    write_tfrecords(plain / "empty.tfrecord", [])
    options = ("--splits", "train=0.8,test=0.2", "--num-shards", "3", "--name", "ds")
    outs = {}
    for name, source, extra in (
        ("examplegen", artifact, ()),
        ("plain", plain, ()),
        ("glob", str(artifact / "Split-*" / "*.gz"), ()),
        (
            "processes",
            artifact,
            ("--direct_num_workers=2", "--direct_running_mode=multi_processing"),
        ),
    ):
        outs[name] = tmp_path / name
        done = run_cli("reshard", source, "--output", outs[name], *options, *extra)
        assert done.returncode == 0, done.stderr
    reference = shards_bytes(outs["examplegen"])
    assert len(reference) == 6
    for name in ("plain", "glob", "processes"):
        assert shards_bytes(outs[name]) == reference, name
    stored = output_records(outs["examplegen"])
    assert sum(len(r) for r in stored.values()) == 1500
    assert 0.7 < len(stored["train"]) / 1500 < 0.9


def test_corrupt_input_records_are_quarantined_with_file_and_offset(tmp_path):
    good = examples(40, 3)
    folder = tmp_path / "in"
    folder.mkdir()
    # A bit flipped in the payload of the 6th record: that record alone is lost.
    flipped = bytearray(b"".join(frame_record(r) for r in good[:10]))
    sixth = sum(16 + len(r) for r in good[:5])
    flipped[sixth + 12 + 3] ^= 0x04
    (folder / "flipped.tfrecord").write_bytes(bytes(flipped))
    # A file cut short in its 9th record, and a gzip file cut short.
    cut = b"".join(frame_record(r) for r in good[10:19])
    (folder / "cut.tfrecord").write_bytes(cut[:-5])
    zipped = gzip.compress(b"".join(frame_record(r) for r in good[19:40]), mtime=0)
    (folder / "cut.tfrecord.gz").write_bytes(zipped[: len(zipped) * 2 // 3])
    # A framed record that is no Example, and a file that is no TFRecord file at all.
    (folder / "garbage.tfrecord").write_bytes(frame_record(good[0]) + frame_record(b"\xff" * 9))
    (folder / "notes.txt").write_text("not records\n")
    (folder / ".hidden").write_bytes(b"skipped")
    out = tmp_path / "out"
    done = run_cli("reshard", folder, "--output", out)
    assert done.returncode == 0, done.stderr
    info = json.loads((out / "dataset_info.json").read_text())
    errors = {(pathlib.Path(e["source"]["path"]).name, e["error"]): e for e in read_errors(out)}
    flipped_error = errors["flipped.tfrecord", "BadRecordCrc"]
    assert flipped_error["source"]["offset"] == sixth
    assert flipped_error["message"].startswith(f"at byte {sixth:,} of the file: data CRC mismatch")
    cut_error = errors["cut.tfrecord", "TruncatedRecord"]
    assert cut_error["source"]["offset"] == sum(16 + len(r) for r in good[10:18])
    gz_error = errors["cut.tfrecord.gz", "TruncatedGzip"]
    assert "of the decompressed stream" in gz_error["message"]
    assert errors["garbage.tfrecord", "NotAnExample"]["source"]["offset"] == 16 + len(good[0])
    assert errors["garbage.tfrecord", "NotAnExample"]["stage"] == "record"
    assert errors["notes.txt", "NotATFRecordFile"]["source"]["offset"] == 0
    assert len(errors) == 5
    # Nothing lost: every record read is in a shard, every problem in the quarantine.
    stored = output_records(out)["train"]
    read_back = 9 + 8 + 1  # flipped.tfrecord less one, cut.tfrecord's first 8, garbage's first
    gz_kept = (info["num_records"]) - read_back
    assert 0 < gz_kept < 21
    assert info["num_inputs"] == info["num_records"] + info["errors"]["count"] == len(stored) + 5
    assert collections.Counter(stored) <= collections.Counter(good + [good[0]])
    assert info["source"]["ignored_hidden_files"] == 1
    assert run_cli("verify", out).returncode == 0


def test_a_feature_schema_types_features_and_quarantines_records_that_disagree(tmp_path):
    import tensorflow as tf

    def record(value) -> bytes:
        kind = (
            tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
            if isinstance(value, int)
            else tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
        )
        return tf.train.Example(features=tf.train.Features(feature={"x": kind})).SerializeToString()

    records = [record(i) for i in range(30)] + [record(0.5), record(1.5)]
    write_tfrecords(tmp_path / "in.tfrecord", records)
    # Without a schema, one key of two dtypes has no spec: the run stops, writes nothing.
    refused = run_cli("reshard", tmp_path / "in.tfrecord", "--output", tmp_path / "refused")
    assert refused.returncode == 1
    message = refused.stderr.strip().splitlines()[-1]
    assert message.startswith(
        "recordforge: failed: feature 'x' holds int64 values in 30 records and float values in "
        "2 records: one feature spec cannot parse them all"
    ), refused.stderr
    assert "Traceback" not in refused.stderr
    # The output folder is as it was (absent): no manifest, no shards, no temporary files.
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
    # With the schema, the float records go to the quarantine.
    schema = tmp_path / "schema.yaml"
    schema.write_text("features:\n  x: {dtype: int64, shape: []}\n")
    out = tmp_path / "out"
    done = run_cli("reshard", tmp_path / "in.tfrecord", "--output", out, "--schema", schema)
    assert done.returncode == 0, done.stderr
    info = json.loads((out / "dataset_info.json").read_text())
    assert (info["num_records"], info["errors"]["by_kind"]) == (30, {"FeatureTypeMismatch": 2})
    assert info["features"] == {"x": {"dtype": "int64", "shape": [], "optional": False}}
    assert info["options"]["schema"] == {"x": {"dtype": "int64", "shape": []}}
    # A manifest is a schema too: resharding the output with it keeps the same spec.
    again = tmp_path / "again"
    manifest = out / "dataset_info.json"
    done = run_cli("reshard", out, "--output", again, "--schema", manifest, "--num-shards", "2")
    assert done.returncode == 0, done.stderr
    second = json.loads((again / "dataset_info.json").read_text())
    assert second["features"] == info["features"] and second["num_records"] == 30
    # The first output's manifest and errors file hold no records.
    assert second["source"]["skipped_metadata_files"] == 2


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "input not found: "),
        ("inside", "is inside the output folder"),
        ("around", "is inside the input"),
        ("mixed", "some inputs are in splits ("),
        ("schema", "schema file "),
        ("alias bomb", "aliases (*name) are not allowed"),
        ("schema folder", "is not a regular file"),
        ("splits", "--splits: fractions must add up to 1"),
        ("empty", "holds no TFRecord files"),
    ],
)
def test_usage_mistakes_are_one_line_and_write_nothing(tmp_path, case, message):
    one = tmp_path / "data" / "Split-train" / "a.tfrecord"
    write_tfrecords(one, examples(3, 4))
    write_tfrecords(tmp_path / "data" / "loose.tfrecord", examples(2, 5))
    (tmp_path / "bad.yaml").write_text("features: {x: text}\n")
    # The "billion laughs": each line doubles the last; expanded, it would not fit in memory.
    bomb = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 60)]
    (tmp_path / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    (tmp_path / "hidden-only").mkdir()
    (tmp_path / "hidden-only" / ".x").write_text("")
    out = tmp_path / "out"
    args = {
        "missing": (tmp_path / "nope", "--output", out),
        "inside": (one, "--output", tmp_path / "data"),
        "around": (tmp_path / "data", "--output", tmp_path / "data" / "out", "--splits", "a=1"),
        "mixed": (tmp_path / "data", "--output", out),
        "schema": (one, "--output", out, "--schema", tmp_path / "bad.yaml"),
        "alias bomb": (one, "--output", out, "--schema", tmp_path / "bomb.yaml"),
        "schema folder": (one, "--output", out, "--schema", tmp_path / "hidden-only"),
        "splits": (one, "--output", out, "--splits", "train=0.5"),
        "empty": (tmp_path / "hidden-only", "--output", out),
    }[case]
    done = run_cli("reshard", *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recordforge: error: "), done.stderr
    assert message in lines[0]
    assert not out.exists() or not any(out.iterdir())


def test_python_reshard_returns_the_dataset(examplegen, tmp_path):
    artifact, records = examplegen
    dataset = recordforge.reshard(
        str(artifact),
        str(tmp_path / "out"),
        splits={"a": 0.5, "b": 0.5},
        num_shards=2,
        compression="gzip",
    )
    assert dataset.manifest.num_records == 1500
    assert set(dataset.manifest.splits) == {"a", "b"}
    assert dataset.manifest.compression == "gzip"
    assert sorted(dataset.records("a")) + sorted(dataset.records("b")) != []
    assert collections.Counter([*dataset.records("a"), *dataset.records("b")]) == (
        collections.Counter(records["train"] + records["eval"])
    )
    with pytest.raises(ValueError, match="reshard\\(\\) has no option 'num_host'"):
        recordforge.reshard(str(artifact), str(tmp_path / "x"), num_host=2)
    with pytest.raises(ValueError, match="--num-hosts must be between 1 and"):
        recordforge.reshard(str(artifact), str(tmp_path / "x"), num_hosts=0)


def test_a_refused_overwrite_leaves_the_previous_dataset_as_it_was(tmp_path):
    """reshard --overwrite stages like convert: the old dataset stays until the new one commits."""
    import tensorflow as tf

    def record(value) -> bytes:
        kind = (
            tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
            if isinstance(value, int)
            else tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
        )
        return tf.train.Example(features=tf.train.Features(feature={"x": kind})).SerializeToString()

    write_tfrecords(tmp_path / "good.tfrecord", [record(i) for i in range(20)])
    write_tfrecords(tmp_path / "mixed.tfrecord", [record(1), record(0.5)])
    out = tmp_path / "out"
    assert run_cli("reshard", tmp_path / "good.tfrecord", "--output", out).returncode == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    refused = run_cli("reshard", tmp_path / "mixed.tfrecord", "--output", out, "--overwrite")
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert run_cli("verify", out).returncode == 0


def test_a_hidden_tfrecord_file_named_on_its_own_is_read(tmp_path):
    # Named on its own, `.part.tfrecord` was skipped as hidden; in a folder it still is.
    folder = tmp_path / "files"
    records = examples(20, 5)
    write_tfrecords(folder / ".part.tfrecord", records[:12])
    write_tfrecords(folder / "seen.tfrecord", records[12:])
    dataset = recordforge.reshard(str(folder / ".part.tfrecord"), str(tmp_path / "one"))
    assert sorted(output_records(tmp_path / "one")["train"]) == sorted(records[:12])
    assert dataset.manifest.num_records == 12
    recordforge.reshard(str(folder), str(tmp_path / "folder"))
    assert sorted(output_records(tmp_path / "folder")["train"]) == sorted(records[12:])


def test_a_stopped_reshard_keeps_nothing_and_does_not_offer_resume(tmp_path):
    """reshard has no `--resume` (its shards carry no fingerprint of their inputs): a stop does
    not say 'add --resume to continue' nor keep staged shards, and `--resume` is refused rather
    than discarding them under a note that it keeps them."""
    import os
    import signal
    import subprocess
    import time

    from conftest import RECORDFORGE

    for i in range(4):
        write_tfrecords(tmp_path / "in" / f"part-{i}.tfrecord", examples(400, i))
    out = tmp_path / "out"
    assert run_cli("reshard", tmp_path / "in", "--output", out, "--num-shards", "2").returncode == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    work = tmp_path / ".out.recordforge"
    args = (tmp_path / "in", "--output", out, "--num-shards", "16", "--overwrite", "--workers", "1")
    process = subprocess.Popen(
        [RECORDFORGE, "reshard", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if (work / "parts").is_dir() and any(
            name.endswith(".part.json") for name in os.listdir(work / "parts")
        ):
            break
        time.sleep(0.005)
    assert process.poll() is None, process.communicate()[1]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    last = stderr.strip().splitlines()[-1]
    assert last == f"recordforge: stopped by SIGTERM; {out} is as it was; nothing staged was kept"
    assert not work.exists()
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before

    resumed = run_cli("reshard", *args, "--resume")
    assert resumed.returncode == 2, resumed.stderr
    assert resumed.stderr.strip() == (
        "recordforge: error: --resume: a reshard cannot be continued; rerun without --resume "
        "(it starts over, and finishes an interrupted commit first)"
    )
    with pytest.raises(ValueError, match="a reshard cannot be continued"):
        recordforge.reshard(str(tmp_path / "in"), str(out), overwrite=True, resume=True)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_feature_with_no_list_set_gets_a_spec_tensorflow_parses(tmp_path):
    """A Feature with no list set (`tf.train.Feature()`) is a missing key to TensorFlow's parser:
    a FixedLenFeature refuses it ('is required but could not be found'). A key that only ever
    held no values was given the fixed shape [0], so tf.data with the manifest's spec (and
    `load`) failed on the first record, and `verify` passed the dataset."""
    import tensorflow as tf

    def record(i: int, empty: tf.train.Feature) -> bytes:
        feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])), "e": empty}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    typed_empty = tf.train.Feature(bytes_list=tf.train.BytesList())
    cases = {
        "untyped": [record(i, tf.train.Feature()) for i in range(6)],
        "mixed": [record(i, tf.train.Feature() if i % 2 else typed_empty) for i in range(6)],
        "typed": [record(i, typed_empty) for i in range(6)],  # [0] parses: kept as it was
    }
    for case, records in cases.items():
        write_tfrecords(tmp_path / case / "in.tfrecord", records)
        out = tmp_path / f"out-{case}"
        done = run_cli("reshard", tmp_path / case / "in.tfrecord", "--output", out)
        assert done.returncode == 0, done.stderr
        spec = json.loads((out / "dataset_info.json").read_text())["features"]["e"]
        if case == "typed":
            assert spec == {"dtype": "bytes", "shape": [0], "optional": False}
        else:
            assert (spec["shape"], spec["optional"]) == ([-1], True), case
        parsed = list(recordforge.load(out, "train").as_numpy_iterator())
        assert sorted(int(row["id"]) for row in parsed) == list(range(6)), case
        assert all(len(row["e"]) == 0 for row in parsed), case
        assert run_cli("verify", out).returncode == 0

    # verify finds such a Feature under a fixed-shape key, as TensorFlow's parser does.
    out = tmp_path / "out-typed"
    info = json.loads((out / "dataset_info.json").read_text())
    (shard,) = info["splits"]["train"]["shards"]
    path = out / shard["file"]
    with open(path, "rb") as f:
        stored = list(read_records(f))
    untyped = [record(100, tf.train.Feature())]
    path.write_bytes(b"".join(frame_record(r) for r in stored[:-1] + untyped))
    shard["num_bytes"] = path.stat().st_size
    info["splits"]["train"]["num_bytes"] = path.stat().st_size
    (out / "dataset_info.json").write_text(json.dumps(info))
    checked = run_cli("verify", out)
    assert checked.returncode == 1, checked.stdout
    assert "missing_feature: feature 'e' has no list set" in checked.stdout


def test_an_empty_examplegen_split_is_kept_with_no_records(tmp_path):
    """Split-eval holding files of no records: the manifest left the split out (load(out,
    "eval") failed, unknown split) where an empty hashed split is listed with 0 records; and
    the summary printed the kept splits as a Python list ("['eval', 'train']")."""
    artifact = tmp_path / "CsvExampleGen" / "examples" / "3"
    records = examples(40, 3)
    write_tfrecords(artifact / "Split-train" / "data_tfrecord-00000-of-00001.gz", records, "GZIP")
    write_tfrecords(artifact / "Split-eval" / "data_tfrecord-00000-of-00001.gz", [], "GZIP")
    out = tmp_path / "out"
    done = run_cli("reshard", artifact, "--output", out)
    assert done.returncode == 0, done.stderr
    assert "splits kept from the inputs: eval, train" in done.stdout
    assert "['" not in done.stdout
    info = json.loads((out / "dataset_info.json").read_text())
    assert list(info["splits"]) == ["eval", "train"]
    assert info["splits"]["eval"] == {
        "num_records": 0,
        "num_bytes": 0,
        "num_shards": 0,
        "shards": [],
    }
    assert collections.Counter(output_records(out)["train"]) == collections.Counter(records)
    assert list(recordforge.load(out, "eval")) == []
    assert run_cli("verify", out).returncode == 0


def test_split_names_holding_hyphens_are_taken_from_the_inputs_manifest(tmp_path):
    # The split came from the shard's file name alone, `{name}-{split}.tfrecord-…`, which
    # cannot tell split `a-test` of dataset `ds` from split `test` of dataset `ds-a`: a-test
    # and b-test were merged into one split `test`, and fold-1 became `1`.
    table = tmp_path / "t.csv"
    rows = [
        "id,part",
        *(f"{i},{part}" for i, part in enumerate(["a-test", "b-test", "fold-1"] * 2)),
    ]
    table.write_text("\n".join(rows) + "\n")
    source, out = tmp_path / "source", tmp_path / "out"
    assert run_cli("convert", table, "--split-column", "part", "--output", source).returncode == 0
    done = run_cli("reshard", source, "--output", out)
    assert done.returncode == 0, done.stderr
    splits = json.loads((out / "dataset_info.json").read_text())["splits"]
    assert {name: split["num_records"] for name, split in splits.items()} == {
        "a-test": 2,
        "b-test": 2,
        "fold-1": 2,
    }


def test_a_users_errors_folder_is_read_and_tfds_class_names_files_are_metadata(tmp_path):
    # Every file in a folder named `errors` was taken for a dataset's quarantine and skipped
    # (its records lost, "no errors"); TFDS's `{key}.labels.txt` of a ClassLabel not named
    # label made a TFDS folder "partly in splits" and refused.
    records = examples(30, 3)
    inputs = tmp_path / "in"
    write_tfrecords(inputs / "ok" / "part-0.tfrecord", records[:10])
    write_tfrecords(inputs / "errors" / "part-0.tfrecord", records[10:])
    (inputs / "errors" / "convert.jsonl").write_text("{}\n")  # a dataset's own: skipped
    tfds_folder = tmp_path / "tfds"
    write_tfrecords(tfds_folder / "toy-train.tfrecord-00000-of-00001", records[:20])
    write_tfrecords(tfds_folder / "toy-test.tfrecord-00000-of-00001", records[20:])
    (tfds_folder / "category.labels.txt").write_text("cat\ndog\n")
    for source, splits in ((inputs, {"train": 30}), (tfds_folder, {"test": 10, "train": 20})):
        out = tmp_path / f"out-{source.name}"
        done = run_cli("reshard", source, "--output", out)
        assert done.returncode == 0, done.stderr
        manifest = json.loads((out / "dataset_info.json").read_text())
        assert {name: s["num_records"] for name, s in manifest["splits"].items()} == splits
        assert manifest["source"]["skipped_metadata_files"] == 1


def test_reshard_has_no_help_keyword(tmp_path):
    # It printed the command's help and exited the process (SystemExit).
    with pytest.raises(recordforge.errors.UsageError, match="reshard\\(\\) has no option 'help'"):
        recordforge.reshard(str(tmp_path), str(tmp_path / "out"), help=True)


def test_a_file_reached_through_a_link_or_twice_is_read_once_and_counted(tmp_path):
    # A file given by its path and reached through a link was read twice: its records were in
    # the dataset twice.
    records = examples(12, 4)
    real, given = tmp_path / "real", tmp_path / "in"
    write_tfrecords(real / "a.tfrecord", records[:5])
    write_tfrecords(given / "b.tfrecord", records[5:])
    (given / "a_link.tfrecord").symlink_to(real / "a.tfrecord")
    out = tmp_path / "out"
    done = run_cli("reshard", given, real / "a.tfrecord", real / "a.tfrecord", "--output", out)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert manifest["num_inputs"] == manifest["splits"]["train"]["num_records"] == 12
    assert manifest["source"]["files"] == 2 and manifest["source"]["duplicate_files"] == 2
    assert "skipped: 2 files reached a second time" in done.stdout


def test_a_fifo_and_a_socket_are_quarantined_and_links_to_folders_counted(tmp_path):
    # reshard's listing dropped what cannot be an input without a word: a FIFO or a socket
    # among the inputs vanished from the counts, and links to folders were not counted.
    import os
    import socket

    given = tmp_path / "in"
    write_tfrecords(given / "a.tfrecord", examples(8, 5))
    os.mkfifo(given / "pipe.tfrecord")
    (given / "elsewhere").symlink_to(tmp_path / "other", target_is_directory=True)
    write_tfrecords(tmp_path / "other" / "c.tfrecord", examples(2, 7))
    out = tmp_path / "out"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(given / "socket.tfrecord"))
        done = run_cli("reshard", given, "--output", out)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert manifest["splits"]["train"]["num_records"] == 8
    assert manifest["source"]["symlinked_folders_not_followed"] == 1
    kinds = sorted((e["source"]["path"].rsplit("/", 1)[-1], e["error"]) for e in read_errors(out))
    assert kinds == [("pipe.tfrecord", "NotARegularFile"), ("socket.tfrecord", "NotARegularFile")]
    assert manifest["errors"]["count"] == 2 and manifest["num_inputs"] == 10
    # A glob names the FIFO and the socket too: quarantined, not dropped.
    globbed = tmp_path / "globbed"
    done = run_cli("reshard", f"{given}/*.tfrecord", "--output", globbed)
    assert done.returncode == 0, done.stderr
    assert [e["error"] for e in read_errors(globbed)] == ["NotARegularFile"] * 2  # and the socket


def test_an_empty_split_of_a_recordforge_input_is_kept(tmp_path):
    # A split its manifest lists with no records has no files, so reshard never saw it: the
    # output had no `eval` split, and load(out, "eval") failed where it had read none.
    records = examples(20, 8)
    artifact = tmp_path / "examples"
    write_tfrecords(artifact / "Split-train" / "data_tfrecord-00000-of-00001", records)
    write_tfrecords(artifact / "Split-eval" / "data_tfrecord-00000-of-00001", [])
    first = tmp_path / "first"
    done = run_cli("reshard", artifact, "--output", first)
    assert done.returncode == 0, done.stderr
    assert json.loads((first / "dataset_info.json").read_text())["splits"]["eval"]["shards"] == []
    again = tmp_path / "again"
    done = run_cli("reshard", first, "--output", again)
    assert done.returncode == 0, done.stderr
    splits = json.loads((again / "dataset_info.json").read_text())["splits"]
    assert {name: split["num_records"] for name, split in splits.items()} == {
        "eval": 0,
        "train": 20,
    }
    assert list(recordforge.load(again, "eval")) == []


def test_only_the_inputs_own_folder_and_those_below_it_name_a_split(tmp_path):
    # A `Split-*` folder above the given input named the split of every file below it.
    records = examples(12, 9)
    above = tmp_path / "Split-archive" / "in"
    write_tfrecords(above / "a.tfrecord", records[:6])
    artifact = tmp_path / "artifact"
    write_tfrecords(artifact / "Split-eval" / "data_tfrecord-00000-of-00001", records[6:])
    cases = {
        "above": ((above,), {"train": 6}),
        "split folder given": ((artifact / "Split-eval",), {"eval": 6}),
        "file given": ((artifact / "Split-eval" / "data_tfrecord-00000-of-00001",), {"eval": 6}),
    }
    for case, (given, splits) in cases.items():
        out = tmp_path / f"out-{case.replace(' ', '-')}"
        done = run_cli("reshard", *given, "--output", out)
        assert done.returncode == 0, (case, done.stderr)
        manifest = json.loads((out / "dataset_info.json").read_text())
        found = {name: split["num_records"] for name, split in manifest["splits"].items()}
        assert found == splits, case
