"""The readers people already use, on real conversions: recordforge's own `load` and `iterate`,
TensorFlow Datasets, Beam's ReadFromTFRecord, and the `tfrecord` package with our index files."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import read_dataset

from recordforge.pipelines import iterate, load, open_dataset
from recordforge.transforms.core.errors import UsageError

CSV_WITH_GAPS = (
    "id,name,score,tags\n"
    "1,one,0.5,a b\n"
    "2,two,,\n"  # score and tags missing: optional, variable-length features
    "3,three,2.5,c\n"
    "4,four,-1,d e f\n"
)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, request):
    """Image datasets converted once for the module: plain with index files and TFDS metadata,
    and gzipped."""
    from conftest import make_image, run_cli

    root = tmp_path_factory.mktemp("readers")
    images = root / "images"
    for index in range(60):
        fmt = ("JPEG", "PNG", "WEBP")[index % 3]
        mode = ("RGB", "L", "RGBA")[index % 3] if fmt != "JPEG" else "RGB"
        make_image(
            images / f"class{index % 3}" / f"img{index:03d}.{fmt.lower()}",
            fmt,
            size=(30 + index, 20 + 2 * index),
            mode=mode,
            seed=index,
        )
    plain, gzipped = root / "plain", root / "gzipped"
    common = ["--splits", "train=0.75,test=0.25", "--num-shards", "3"]
    for out, extra in ((plain, ["--write-index", "--tfds"]), (gzipped, ["--compression", "gzip"])):
        result = run_cli("convert", images, "-o", out, *common, *extra)
        assert result.returncode == 0, result.stderr
    return {"images": images, "plain": plain, "gzipped": gzipped}


def _tf_records(path) -> list[bytes]:
    """The records of one shard, read by TensorFlow (independent of recordforge's reader)."""
    import tensorflow as tf

    compression = "GZIP" if str(path).endswith(".gz") else None
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=compression)]


def _manifest(out) -> dict:
    return open_dataset(str(out)).manifest.to_dict()


# --- recordforge's own readers ---------------------------------------------------------------


@pytest.mark.parametrize("variant", ["plain", "gzipped"])
def test_load_gives_every_record_with_known_cardinality(converted, variant):
    import tensorflow as tf

    out = converted[variant]
    manifest = _manifest(out)
    for split, info in manifest["splits"].items():
        dataset = load(str(out), split)
        # Known from the manifest: no scan happened, cardinality is not UNKNOWN (-2).
        assert int(dataset.cardinality()) == info["num_records"]
        names = [ex["image/filename"].numpy().decode() for ex in dataset]
        expected = []
        for shard in info["shards"]:
            for record in _tf_records(out / shard["file"]):
                example = tf.train.Example.FromString(record)
                expected.append(example.features.feature["image/filename"].bytes_list.value[0])
        assert sorted(names) == sorted(n.decode() for n in expected)
        assert len(names) == info["num_records"]


def test_load_decodes_images_and_matches_the_source_pixels(converted):
    from PIL import Image

    out, images = converted["plain"], converted["images"]
    dataset = load(str(out), "test", decode_images=True, image_channels=3, deterministic=True)
    seen = 0
    for example in dataset.take(8):
        pixels = example["image"].numpy()
        name = example["image/filename"].numpy().decode()
        assert pixels.shape == (int(example["image/height"]), int(example["image/width"]), 3)
        source = np.asarray(Image.open(images / name).convert("RGB"))
        if name.endswith((".png", ".webp")):  # lossless: exactly the same pixels
            assert (pixels == source).all(), name
        else:  # JPEG decoders may differ by rounding
            assert np.abs(pixels.astype(int) - source.astype(int)).mean() < 3, name
        seen += 1
    assert seen == 8


def test_load_gives_every_image_the_channels_asked_for(tmp_path):
    # TensorFlow's WebP, GIF and BMP decoders (and a CMYK JPEG's) refuse some channel counts:
    # load(..., image_channels=3) stopped mid-epoch on a WebP with alpha, 1 on a BMP or a GIF.
    import io

    import tensorflow as tf
    from conftest import run_cli
    from PIL import Image

    rng = np.random.RandomState(3)
    rgba = Image.fromarray((rng.rand(6, 9, 4) * 255).astype("uint8"), "RGBA")
    variants = {
        "alpha.webp": (rgba, "WEBP", {"lossless": True}),
        "grey.webp": (rgba.convert("L"), "WEBP", {"lossless": True}),
        "palette.bmp": (rgba.convert("RGB").convert("P"), "BMP", {}),
        "rgba.bmp": (rgba, "BMP", {}),
        "frame.gif": (rgba.convert("RGB"), "GIF", {}),
        "cmyk.jpg": (rgba.convert("CMYK"), "JPEG", {"quality": 95}),
        "rgb.jpg": (rgba.convert("RGB"), "JPEG", {"quality": 95}),
        "grey-alpha.png": (rgba.convert("LA"), "PNG", {}),
        "rgba.png": (rgba, "PNG", {}),
    }
    stored = {}
    for name, (image, fmt, options) in variants.items():
        data = io.BytesIO()
        image.save(data, fmt, **options)
        (tmp_path / "in" / "all").mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / "all" / name).write_bytes(data.getvalue())
        stored[name] = tf.io.decode_image(data.getvalue(), expand_animations=False).numpy()
    out = tmp_path / "out"
    done = run_cli("convert", tmp_path / "in", "-o", out)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "dataset_info.json").read_text())["num_records"] == len(variants)
    for channels in (1, 3, 4):
        pixels = {
            example["image/filename"].numpy().decode().split("/")[-1]: example["image"].numpy()
            for example in load(str(out), decode_images=True, image_channels=channels)
        }
        assert sorted(pixels) == sorted(variants)
        for name, image in pixels.items():
            assert image.shape == (6, 9, channels), (name, channels)
            source = stored[name]
            if channels == 3:  # the stored colours, alpha dropped or grey repeated
                expected = (
                    source[:, :, :3] if source.shape[2] >= 3 else np.repeat(source[:, :, :1], 3, 2)
                )
                assert np.array_equal(image, expected), (name, channels)
            if channels == 4 and source.shape[2] in (2, 4):  # the stored alpha kept
                assert np.array_equal(image[:, :, 3], source[:, :, -1]), (name, channels)


def test_load_shuffles_files_per_seed_and_keeps_every_record(converted):
    out = str(converted["plain"])

    def order(**kwargs):
        return [ex["image/filename"].numpy() for ex in load(out, "train", **kwargs)]

    plain = order()
    assert order() == plain  # deterministic by default
    shuffled = order(shuffle_files=True, seed=3, parallel_reads=1)
    assert sorted(shuffled) == sorted(plain)
    assert order(shuffle_files=True, seed=3, parallel_reads=1) == shuffled


def test_load_and_iterate_handle_optional_variable_length_features(tmp_path, cli):
    source = tmp_path / "table.csv"
    source.write_text(CSV_WITH_GAPS)
    schema = tmp_path / "schema.yaml"
    schema.write_text("columns:\n  tags: {dtype: bytes, list: true, separator: ' '}\n")
    out = tmp_path / "out"
    result = cli("convert", source, "-o", out, "--schema", schema)
    assert result.returncode == 0, result.stderr
    by_id = {int(ex["id"]): ex for ex in load(str(out), "train")}
    assert sorted(by_id) == [1, 2, 3, 4]
    assert by_id[2]["score"].numpy().tolist() == [] and by_id[2]["tags"].numpy().tolist() == []
    assert by_id[4]["tags"].numpy().tolist() == [b"d", b"e", b"f"]
    assert by_id[1]["score"].numpy().tolist() == [0.5]
    plain = {row["id"][0]: row for row in iterate(str(out), "train")}
    assert plain[2] == {"id": [2], "name": [b"two"]}  # absent features are simply not there
    assert plain[4]["tags"] == [b"d", b"e", b"f"] and plain[3]["score"] == [2.5]


def test_load_and_iterate_read_a_split_with_no_records(tmp_path, cli):
    # One image in two splits leaves one of them empty: load() raised a TypeError (an empty
    # list of file names became a float tensor).
    from conftest import make_image

    make_image(tmp_path / "photos" / "solo" / "a.png", "PNG", seed=1)
    out = tmp_path / "out"
    result = cli("convert", tmp_path / "photos", "-o", out, "--splits", "train=0.5,test=0.5")
    assert result.returncode == 0, result.stderr
    counts = {name: split.num_records for name, split in _splits(out).items()}
    assert sorted(counts.values()) == [0, 1]
    for name, count in counts.items():
        dataset = load(str(out), name)
        assert dataset.cardinality().numpy() == count
        assert len(list(dataset)) == count
        assert len(list(iterate(str(out), name))) == count


def _splits(out):
    return open_dataset(str(out)).manifest.splits


def test_iterate_needs_no_tensorflow_and_agrees_with_tf(converted):
    out = converted["gzipped"]
    script = (
        "import json, sys\n"
        "sys.modules['tensorflow'] = None  # any import of TensorFlow now fails\n"
        "from recordforge.pipelines import iterate\n"
        f"rows = list(iterate({str(out)!r}, 'train'))\n"
        "print(json.dumps([[r['image/filename'][0].decode(), len(r['image/encoded'][0]),"
        " r['image/class/label'][0]] for r in rows]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    _, splits = read_dataset(out)
    expected = [
        [r["image/filename"].decode(), len(r["image/encoded"]), int(r["image/class/label"])]
        for r in splits["train"]
    ]
    assert rows == expected  # same records, same order (shard by shard, as written)


def test_readers_name_a_missing_split_or_dataset(converted, tmp_path):
    with pytest.raises(UsageError, match=r"no split 'validation' \(its splits: train, test\)"):
        load(str(converted["plain"]), "validation")
    (tmp_path / "dataset_info.json").write_text('{"name": "someone else\'s"}')
    with pytest.raises(UsageError, match="is not a recordforge dataset"):
        next(iterate(str(tmp_path)))


@pytest.mark.parametrize(
    ("entry", "name"),
    [
        ("file", "../elsewhere/elsewhere-train.tfrecord-00000-of-00001"),
        ("file", "/etc/hostname"),
        ("file", "gs://someone/else.tfrecord"),
        ("index", "index/../../x.idx"),
    ],
)
def test_readers_refuse_a_manifest_naming_files_outside_its_folder(
    converted, tmp_path, cli, entry, name
):
    """A manifest edited or damaged to name a shard elsewhere must not lead a reader there: the
    other dataset's records would be read as this one's."""
    dataset = tmp_path / "dataset"
    shutil.copytree(converted["plain"], dataset)
    manifest = json.loads((dataset / "recordforge.json").read_text())
    manifest["splits"]["train"]["shards"][0][entry] = name
    (dataset / "recordforge.json").write_text(json.dumps(manifest))
    message = f"not a valid recordforge manifest.*{re.escape(repr(name))} is not the name of a file"
    for read in (lambda: load(str(dataset)), lambda: next(iterate(str(dataset)))):
        with pytest.raises(UsageError, match=message):
            read()
    result = cli("verify", dataset)
    assert result.returncode == 2
    assert "is not the name of a file inside the dataset's folder" in result.stderr


# --- index files: read by DALI and the `tfrecord` package -----------------------------------


def _run_tfrecord_package(script: str):
    """Run `script` in a fresh process and return what it prints as JSON.

    The `tfrecord` package registers its own copy of TensorFlow's Example protos, which clashes
    with TensorFlow's in one process; its users (PyTorch, DALI) run it without TensorFlow. DALI
    runs apart too, as its users run it.
    """
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_index_files_match_the_tfrecord_packages_own_indexer(converted, tmp_path):
    out = converted["plain"]
    shards = [s for split in _manifest(out)["splits"].values() for s in split["shards"]]
    assert shards and all(s["index"] == f"index/{s['file']}.idx" for s in shards)
    pairs = [(str(out / s["file"]), str(tmp_path / f"{s['file']}.reference.idx")) for s in shards]
    _run_tfrecord_package(
        "import json\n"
        "from tfrecord.tools.tfrecord2idx import create_index\n"
        f"for shard, index in {pairs!r}:\n"
        "    create_index(shard, index)\n"
        "print('[]')\n"
    )
    for shard, (_, reference) in zip(shards, pairs, strict=True):
        ours = (out / shard["index"]).read_bytes()
        assert ours == pathlib.Path(reference).read_bytes()
        assert len(ours.decode().splitlines()) == shard["num_records"]


@pytest.mark.parametrize("part,parts", [(0, 3), (1, 3), (2, 3), (1, 2)])
def test_tfrecord_package_reads_a_chosen_range_through_our_index(converted, part, parts):
    import tensorflow as tf

    out = converted["plain"]
    shard = max(_manifest(out)["splits"]["train"]["shards"], key=lambda s: s["num_records"])
    loaded = _run_tfrecord_package(
        "import json\n"
        "from tfrecord.reader import tfrecord_loader\n"
        f"rows = tfrecord_loader({str(out / shard['file'])!r}, {str(out / shard['index'])!r},\n"
        "    {'image/filename': 'byte', 'image/encoded': 'byte'},"
        f" shard=({part}, {parts}))\n"
        "print(json.dumps([[bytes(r['image/filename']).decode(), bytes(r['image/encoded']).hex()]"
        " for r in rows]))\n"
    )
    expected = _tf_records(out / shard["file"])
    start = len(expected) * part // parts
    end = len(expected) * (part + 1) // parts
    wanted = [tf.train.Example.FromString(r).features.feature for r in expected[start:end]]
    assert len(loaded) == end - start > 0
    for (name, encoded), want in zip(loaded, wanted, strict=True):
        assert name.encode() == want["image/filename"].bytes_list.value[0]
        assert bytes.fromhex(encoded) == want["image/encoded"].bytes_list.value[0]


def test_dali_reads_every_record_through_our_index_files(converted):
    """NVIDIA DALI's own TFRecord reader (on the CPU), given our shards and index files."""
    import tensorflow as tf

    out = converted["plain"]
    for split, info in _manifest(out)["splits"].items():
        paths = [str(out / s["file"]) for s in info["shards"]]
        indexes = [str(out / s["index"]) for s in info["shards"]]
        count = info["num_records"]
        # One batch of the whole split, in file order (DALI does not shuffle unless asked).
        loaded = _run_tfrecord_package(
            "import json\n"
            "import numpy as np\n"
            "import nvidia.dali.fn as fn\n"
            "import nvidia.dali.tfrecord as tfrec\n"
            "from nvidia.dali import pipeline_def\n"
            f"@pipeline_def(batch_size={count}, num_threads=1, device_id=None)\n"
            "def read():\n"
            f"    rows = fn.readers.tfrecord(path={paths!r}, index_path={indexes!r},"
            " name='reader', features={\n"
            "        'image/filename': tfrec.FixedLenFeature((), tfrec.string, ''),\n"
            "        'image/encoded': tfrec.FixedLenFeature((), tfrec.string, ''),\n"
            "        'image/class/label': tfrec.FixedLenFeature([1], tfrec.int64, -1)})\n"
            "    return rows['image/filename'], rows['image/encoded'], rows['image/class/label']\n"
            "pipe = read()\n"
            "pipe.build()\n"
            "names, images, labels = pipe.run()\n"
            "print(json.dumps({'epoch': pipe.epoch_size('reader'), 'rows': [\n"
            "    [bytes(np.array(names[i])).decode(), bytes(np.array(images[i])).hex(),\n"
            "     int(np.array(labels[i])[0])] for i in range(len(names))]}))\n"
        )
        assert loaded["epoch"] == count, split
        expected = []
        for path in paths:
            for record in _tf_records(path):
                feature = tf.train.Example.FromString(record).features.feature
                expected.append(
                    [
                        feature["image/filename"].bytes_list.value[0].decode(),
                        feature["image/encoded"].bytes_list.value[0].hex(),
                        feature["image/class/label"].int64_list.value[0],
                    ]
                )
        assert loaded["rows"] == expected, split


def test_the_natural_shard_glob_matches_shards_only(converted):
    """`OUT/name-train.tfrecord-*-of-*` (index files used to match it: tf.data then failed with
    DataLossError reading an index as records)."""
    import tensorflow as tf

    out = converted["plain"]
    for split, info in _manifest(out)["splits"].items():
        pattern = str(out / f"plain-{split}.tfrecord-*-of-*")
        matched = sorted(tf.io.gfile.glob(pattern))
        assert matched == sorted(str(out / s["file"]) for s in info["shards"])
        records = tf.data.TFRecordDataset(tf.data.Dataset.list_files(pattern, shuffle=False))
        assert sum(1 for _ in records) == info["num_records"]
    assert sorted(p.name for p in (out / "index").iterdir()) == sorted(
        f"{s['file']}.idx" for split in _manifest(out)["splits"].values() for s in split["shards"]
    )


def test_index_needs_uncompressed_shards(tmp_path, cli, converted):
    result = cli("convert", converted["images"], "-o", tmp_path / "o", "--write-index",
                 "--compression", "gzip")  # fmt: skip
    assert result.returncode == 2
    assert "--write-index needs uncompressed shards" in result.stderr
    assert not (tmp_path / "o").exists()


# --- TensorFlow Datasets -----------------------------------------------------------------------


def test_tfds_builder_from_directory_yields_every_record(converted):
    import tensorflow_datasets as tfds

    out = converted["plain"]
    ours = json.loads((out / "recordforge.json").read_text())
    assert ours["tool"]["name"] == "recordforge" and ours["options"]["tfds"] is True
    builder = tfds.builder_from_directory(str(out))
    assert set(builder.info.splits) == set(ours["splits"])
    for split, info in ours["splits"].items():
        assert builder.info.splits[split].num_examples == info["num_records"]
        assert builder.info.splits[split].shard_lengths == [
            s["num_records"] for s in info["shards"]
        ]
        dataset = builder.as_dataset(split=split)
        assert int(dataset.cardinality()) == info["num_records"]
        from_tfds = sorted(
            (ex["image/filename"].numpy(), ex["image/encoded"].numpy()) for ex in dataset
        )
        from_ours = sorted(
            (ex["image/filename"][0], ex["image/encoded"][0]) for ex in iterate(str(out), split)
        )
        assert from_tfds == from_ours
    assert set(builder.info.features.keys()) == set(ours["features"])


def test_tfds_reads_optional_features_and_its_own_split_slicing(tmp_path, cli):
    import tensorflow_datasets as tfds

    source = tmp_path / "table.csv"
    source.write_text(CSV_WITH_GAPS)
    out = tmp_path / "out"
    result = cli("convert", source, "-o", out, "--tfds")
    assert result.returncode == 0, result.stderr
    assert "Dataset: " + str(out / "recordforge.json") in result.stdout
    builder = tfds.builder_from_directory(str(out))
    rows = {int(ex["id"]): ex for ex in builder.as_dataset(split="train")}
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[2]["score"].numpy().tolist() == [] and rows[3]["score"].numpy().tolist() == [2.5]
    assert len(list(builder.as_dataset(split="train[:50%]"))) == 2


def test_tfds_needs_uncompressed_shards(tmp_path, cli, converted):
    result = cli("convert", converted["images"], "-o", tmp_path / "o", "--tfds",
                 "--compression", "gzip")  # fmt: skip
    assert result.returncode == 2 and "--tfds needs uncompressed shards" in result.stderr


def test_overwrite_replaces_a_tfds_dataset_with_a_plain_one(tmp_path, cli, converted):
    out = tmp_path / "out"
    images = converted["images"]
    assert cli("convert", images, "-o", out, "--tfds", "--write-index").returncode == 0
    result = cli("convert", images, "-o", out, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "dataset_info.json",
        "out-train.tfrecord-00000-of-00001",
    ]
    assert open_dataset(str(out)).manifest_file == "dataset_info.json"


# --- Beam --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["plain", "gzipped"])
def test_readme_beam_recipe_reads_every_shard_of_a_split(converted, variant, tmp_path, monkeypatch):
    # The README's recipe, as a user would paste it: the shard list from the manifest.
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"### Apache Beam\n\n```python\n(.*?)```", readme, re.S)
    out = converted[variant]
    expected = [
        record
        for shard in _manifest(out)["splits"]["train"]["shards"]
        for record in _tf_records(out / shard["file"])
    ]
    assert len(expected) > 10
    (tmp_path / "out").symlink_to(out)
    monkeypatch.chdir(tmp_path)
    code = block.group(1).replace("with beam.Pipeline() as pipeline:", "with pipeline:")
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.util import assert_that, equal_to

    pipeline = beam.Pipeline(runner=FnApiRunner())
    code += "    assert_that(records, equal_to(expected))\n"
    exec(
        code,
        {
            "pipeline": pipeline,
            "expected": expected,
            "assert_that": assert_that,
            "equal_to": equal_to,
        },
    )


@pytest.mark.parametrize("variant", ["plain", "gzipped"])
def test_beam_read_from_tfrecord_reads_every_shard(converted, variant):
    # The pattern a user would write; index files must not match it.
    import apache_beam as beam
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    out = converted[variant]
    expected = [
        record
        for split in _manifest(out)["splits"].values()
        for shard in split["shards"]
        for record in _tf_records(out / shard["file"])
    ]
    assert len(expected) == 60
    with TestPipeline(runner="FnApiRunner") as pipeline:
        records = pipeline | beam.io.ReadFromTFRecord(
            str(out / "*.tfrecord-*-of-*"),
            compression_type=CompressionTypes.AUTO,
        )
        assert_that(records, equal_to(expected))


@pytest.mark.parametrize("heading", ["In training: `load`", "Without TensorFlow: `iterate`"])
def test_readme_reading_examples_run(tmp_path, cli, converted, monkeypatch, heading):
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(rf"### {re.escape(heading)}\n\n```python\n(.*?)```", readme, re.S)
    result = cli("convert", converted["images"], "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(block.group(1), namespace)  # the README's code, as a user would paste it
    if "dataset" in namespace:
        assert int(namespace["dataset"].cardinality()) == 60
        first = next(iter(namespace["images"]))
        assert first["image"].shape[-1] == 3
    else:
        assert namespace["manifest"].num_records == 60
        assert namespace["jpeg"][:2] in (b"\xff\xd8", b"\x89P", b"RI")  # JPEG, PNG, WebP bytes


def test_iterate_refuses_a_truncated_gzip_shard(converted, tmp_path):
    import gzip
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(converted["gzipped"], out)
    shard = out / _manifest(out)["splits"]["train"]["shards"][0]["file"]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 6])  # the gzip trailer cut short: records may look whole
    with pytest.raises((EOFError, gzip.BadGzipFile)):
        list(iterate(str(out), "train"))


def test_feature_spec_takes_the_dataset_folder_as_the_other_readers_do(converted, tmp_path):
    # It took only a manifest's `features`: the folder, as load and iterate take it, gave an
    # AttributeError traceback.
    import tensorflow as tf

    import recordforge

    out = converted["plain"]
    spec = recordforge.feature_spec(str(out))
    assert spec == recordforge.feature_spec(open_dataset(str(out)))
    assert spec == recordforge.feature_spec(open_dataset(str(out)).manifest.features)
    shard = out / _manifest(out)["splits"]["train"]["shards"][0]["file"]
    parsed = tf.io.parse_example(tf.constant(_tf_records(shard)), spec)
    assert set(parsed) == set(spec)
    with pytest.raises(UsageError, match="not a recordforge dataset"):
        recordforge.feature_spec(str(tmp_path))
