"""`--tfds`: TensorFlow Datasets reads the dataset with its own types (Image, ClassLabel,
supervised keys), checked with the real `tensorflow-datasets`; the shards are those of a plain
conversion, only the metadata differs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_image, run_cli

from recordforge.schemas import tfds_metadata
from recordforge.schemas.features import FeatureSpec, ImageFacts
from recordforge.schemas.manifest import ErrorSummary, Manifest, ShardInfo, SplitInfo

CLASSES = ("cats", "dogs", "owls")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """JPEG and PNG pictures, greyscale, RGB and RGBA, of many sizes, in three classes;
    converted with --tfds and without."""
    root = tmp_path_factory.mktemp("tfds")
    images = root / "images"
    for index in range(24):
        fmt = ("JPEG", "PNG")[index % 2]
        mode = ("RGB", "L")[index // 2 % 2] if fmt == "JPEG" else ("RGB", "L", "RGBA")[index % 3]
        make_image(
            images / CLASSES[index % 3] / f"img{index:02d}.{fmt.lower()}",
            fmt,
            size=(20 + index, 16 + 2 * index),
            mode=mode,
            seed=index,
        )
    common = ["--name", "pets", "--splits", "train=0.75,test=0.25", "--num-shards", "2"]
    for out, extra in ((root / "tfds", ["--tfds"]), (root / "plain", [])):
        result = run_cli("convert", images, "-o", out, *common, *extra)
        assert result.returncode == 0, result.stderr
    return {"images": images, "tfds": root / "tfds", "plain": root / "plain"}


def _builder(out):
    import tensorflow_datasets as tfds

    return tfds.builder_from_directory(str(out))


def test_only_the_metadata_differs_from_a_plain_conversion(photos):
    tfds_out, plain = photos["tfds"], photos["plain"]
    shards = sorted(p.name for p in plain.iterdir() if ".tfrecord-" in p.name)
    assert shards and shards == sorted(p.name for p in tfds_out.iterdir() if ".tfrecord-" in p.name)
    for name in shards:
        assert (tfds_out / name).read_bytes() == (plain / name).read_bytes(), name
    ours, theirs = (
        json.loads((folder / name).read_text())
        for folder, name in ((tfds_out, "recordforge.json"), (plain, "dataset_info.json"))
    )
    for manifest in (ours, theirs):
        del manifest["created"], manifest["options"]["tfds"]
    assert ours == theirs
    assert (tfds_out / "image.class.label.labels.txt").read_text() == "cats\ndogs\nowls\n"


def test_images_are_tfds_images_and_labels_are_class_labels(photos):
    import tensorflow_datasets as tfds

    info = _builder(photos["tfds"]).info
    image = info.features["image/encoded"]
    assert isinstance(image, tfds.features.Image)
    # Greyscale, RGB and RGBA of any size: decoded to RGB, TFDS's default shape.
    assert image.shape == (None, None, 3) and image.dtype == np.uint8
    assert image.encoding_format is None  # JPEG and PNG both
    label = info.features["image/class/label"]
    assert isinstance(label, tfds.features.ClassLabel)
    assert label.names == list(CLASSES) and label.num_classes == 3
    assert [label.int2str(i) for i in range(3)] == list(CLASSES) and label.str2int("owls") == 2
    assert info.supervised_keys == ("image/encoded", "image/class/label")
    # The other features stay what they are in the Examples.
    assert isinstance(info.features["image/filename"], tfds.features.Tensor)


def test_as_supervised_gives_each_decoded_image_and_its_label(photos):
    from PIL import Image

    builder = _builder(photos["tfds"])
    names = builder.info.features["image/class/label"]
    seen = 0
    for split, split_info in builder.info.splits.items():
        records = list(builder.as_dataset(split=split))
        pairs = list(builder.as_dataset(split=split, as_supervised=True))
        assert len(pairs) == len(records) == split_info.num_examples > 0
        for record, (image, label) in zip(records, pairs, strict=True):
            assert np.array_equal(image.numpy(), record["image/encoded"].numpy())
            assert int(label) == int(record["image/class/label"])
            name = record["image/filename"].numpy().decode()
            assert names.int2str(int(label)) == name.split("/")[0]
            source = np.asarray(Image.open(photos["images"] / name).convert("RGB"))
            pixels = image.numpy()
            assert pixels.dtype == np.uint8 and pixels.shape == source.shape, name
            if name.endswith(".png"):  # lossless: the very pixels, alpha dropped
                assert np.array_equal(pixels, source), name
            else:  # JPEG decoders may differ by rounding
                assert np.abs(pixels.astype(int) - source.astype(int)).mean() < 3, name
            seen += 1
    assert seen == 24


def test_show_examples_draws_the_images_with_their_class_names(photos):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import tensorflow_datasets as tfds

    builder = _builder(photos["tfds"])
    figure = tfds.show_examples(builder.as_dataset(split="train"), builder.info, rows=2, cols=3)
    try:
        assert len(figure.axes) == 6
        for axes in figure.axes:
            (drawn,) = axes.get_images()
            assert drawn.get_array().ndim == 3 and drawn.get_array().shape[2] == 3
            name, _, number = axes.get_xlabel().partition(" (")
            assert name in CLASSES and number == f"{CLASSES.index(name)})"
    finally:
        plt.close(figure)


def test_images_of_one_size_and_mode_get_a_fixed_shape_and_batch(tmp_path, cli):
    import tensorflow_datasets as tfds

    for index in range(8):
        make_image(tmp_path / "in" / f"digit{index % 2}" / f"{index}.png", "PNG",
                   size=(12, 10), mode="L", seed=index)  # fmt: skip
    out = tmp_path / "out"
    result = cli("convert", tmp_path / "in", "-o", out, "--tfds")
    assert result.returncode == 0, result.stderr
    builder = tfds.builder_from_directory(str(out))
    image = builder.info.features["image/encoded"]
    assert image.shape == (10, 12, 1) and image.encoding_format == "png"
    # A fixed shape: batches need no resizing.
    (images, labels) = next(iter(builder.as_dataset(split="train", as_supervised=True).batch(8)))
    assert images.shape == (8, 10, 12, 1) and sorted(labels.numpy().tolist()) == [0] * 4 + [1] * 4


def test_grey_images_with_alpha_are_decoded_by_tfds_as_rgba(tmp_path, cli):
    # features.json declared 2 channels, which TFDS's metadata takes and TensorFlow's decoder
    # refuses: as_dataset failed on the first record ("channels must be 0, 1, 3 or 4").
    import numpy as np
    import tensorflow_datasets as tfds
    from PIL import Image

    for index in range(4):
        grey = np.full((10, 12), 40 * index, np.uint8)
        alpha = np.full((10, 12), 200, np.uint8)
        path = tmp_path / "in" / f"class{index % 2}" / f"{index}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.dstack([grey, alpha]), "LA").save(path)
    out = tmp_path / "out"
    result = cli("convert", tmp_path / "in", "-o", out, "--tfds")
    assert result.returncode == 0, result.stderr
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["image/encoded"].shape == (10, 12, 4)
    decoded = [example["image/encoded"].numpy() for example in builder.as_dataset(split="train")]
    assert len(decoded) == 4
    for pixels in decoded:
        assert pixels.shape == (10, 12, 4)
        assert (pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 3] == 200).all()


def test_grey_images_with_a_palette_bmp_are_decoded_by_tfds(tmp_path, cli):
    # features.json declared 1 channel, and TFDS's decode_image(channels=1) refuses a BMP.
    import numpy as np
    import tensorflow_datasets as tfds
    from PIL import Image

    grey = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8), "L")
    (tmp_path / "in" / "a").mkdir(parents=True)
    (tmp_path / "in" / "b").mkdir()
    grey.save(tmp_path / "in" / "a" / "grey.jpg")
    grey.convert("RGB").convert("P").save(tmp_path / "in" / "b" / "palette.bmp")
    out = tmp_path / "out"
    result = cli("convert", tmp_path / "in", "-o", out, "--tfds")
    assert result.returncode == 0, result.stderr
    builder = tfds.builder_from_directory(str(out))
    decoded = [example["image/encoded"].numpy() for example in builder.as_dataset(split="train")]
    assert [pixels.shape for pixels in decoded] == [(8, 8, 3)] * 2


def test_gif_and_webp_images_stay_bytes_but_keep_their_labels(tmp_path, cli):
    import tensorflow_datasets as tfds

    sources = {}
    for index, fmt in enumerate(("JPEG", "WEBP", "GIF", "JPEG")):
        path = tmp_path / "in" / f"kind{index % 2}" / f"{index}.{fmt.lower()}"
        sources[path.relative_to(tmp_path / "in").as_posix()] = make_image(path, fmt, seed=index)
    out = tmp_path / "out"
    assert cli("convert", tmp_path / "in", "-o", out, "--tfds").returncode == 0
    builder = tfds.builder_from_directory(str(out))
    # TFDS decodes GIF and WebP as animations ([frames, h, w, c]): no Image describes them.
    assert isinstance(builder.info.features["image/encoded"], tfds.features.Tensor)
    assert builder.info.features["image/class/label"].names == ["kind0", "kind1"]
    records = list(builder.as_dataset(split="train"))
    pairs = list(builder.as_dataset(split="train", as_supervised=True))
    assert len(pairs) == 4
    for record, (image, label) in zip(records, pairs, strict=True):
        name = record["image/filename"].numpy().decode()
        assert image.numpy() == sources[name]
        assert builder.info.features["image/class/label"].int2str(int(label)) == name[:5]


def test_a_labelled_table_pairs_its_other_columns_with_a_class_label(tmp_path, cli):
    import tensorflow_datasets as tfds

    table = tmp_path / "table.csv"
    table.write_text(
        "id,size,species\n" + "".join(f"{i},{i * 0.5},{('fir', 'oak')[i % 2]}\n" for i in range(6))
    )
    out = tmp_path / "out"
    result = cli("convert", table, "-o", out, "--tfds", "--label-column", "species")
    assert result.returncode == 0, result.stderr
    builder = tfds.builder_from_directory(str(out))
    label = builder.info.features["label"]
    assert isinstance(label, tfds.features.ClassLabel) and label.names == ["fir", "oak"]
    assert "image/encoded" not in builder.info.features
    assert builder.info.supervised_keys == ({"id": "id", "size": "size"}, "label")
    rows = list(builder.as_dataset(split="train", as_supervised=True))
    assert len(rows) == 6
    for inputs, species in rows:
        assert sorted(inputs) == ["id", "size"]
        assert label.int2str(int(species)) == ("fir", "oak")[int(inputs["id"]) % 2]
        assert float(inputs["size"]) == int(inputs["id"]) * 0.5


def test_numeric_labels_are_class_ids_without_names(tmp_path, cli):
    import tensorflow_datasets as tfds

    table = tmp_path / "table.csv"
    table.write_text("x,grade\n1,0\n2,4\n3,2\n4,4\n")
    out = tmp_path / "out"
    result = cli("convert", table, "-o", out, "--tfds", "--label-column", "grade")
    assert result.returncode == 0, result.stderr
    builder = tfds.builder_from_directory(str(out))
    label = builder.info.features["label"]
    assert isinstance(label, tfds.features.ClassLabel)
    assert label.num_classes == 5 and label.int2str(4) == "4"  # ids 0..4, by number
    assert not list(out.glob("*.labels.txt"))
    assert builder.info.supervised_keys == ({"x": "x"}, "label")


def test_the_largest_int64_label_leaves_the_dataset_readable_by_tfds(tmp_path, cli):
    # Ids 0 and 2**63 - 1 made numClasses 2**63, out of int64's range: builder_from_directory
    # refused the dataset ("Failed to parse numClasses field: Value out of range").
    import tensorflow_datasets as tfds

    table = tmp_path / "table.csv"
    table.write_text(f"x,grade\n1,0\n2,{2**63 - 1}\n3,5\n")
    out = tmp_path / "out"
    result = cli("convert", table, "-o", out, "--tfds", "--label-column", "grade")
    assert result.returncode == 0, result.stderr
    builder = tfds.builder_from_directory(str(out))
    assert not isinstance(builder.info.features["label"], tfds.features.ClassLabel)
    grades = sorted(int(row["label"]) for row in builder.as_dataset(split="train"))
    assert grades == [0, 5, 2**63 - 1]


def test_the_summary_says_when_class_names_cannot_go_in_tfds_labels_file(tmp_path, cli):
    # A class folder named " cat" dropped every class's name from TFDS's ClassLabel, silently.
    import tensorflow_datasets as tfds

    for index, folder in enumerate((" cat", "dog", " cat", "dog")):
        make_image(tmp_path / "photos" / folder / f"{index}.png", "PNG", seed=index)
    out = tmp_path / "out"
    result = cli("convert", tmp_path / "photos", "-o", out, "--tfds")
    assert result.returncode == 0, result.stderr
    assert "its ClassLabel has ids only (the manifest keeps the names)" in result.stdout
    label = tfds.builder_from_directory(str(out)).info.features["image/class/label"]
    assert label.int2str(0) == "0"  # what the line warns of
    plain = cli("convert", tmp_path / "photos", "-o", tmp_path / "plain")
    assert "ClassLabel" not in plain.stdout  # without --tfds there is no ClassLabel to speak of


def test_a_table_without_labels_has_no_supervised_keys(tmp_path, cli):
    import tensorflow_datasets as tfds

    table = tmp_path / "table.csv"
    table.write_text("label,value\n3,a\n5,b\n")  # a column called label is just a column
    out = tmp_path / "out"
    assert cli("convert", table, "-o", out, "--tfds").returncode == 0
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.supervised_keys is None
    assert isinstance(builder.info.features["label"], tfds.features.Tensor)
    assert not list(out.glob("*.labels.txt"))


# --- The metadata as data (no TFDS) ---------------------------------------------------------


def facts(*images: tuple[str, int, int, int]) -> ImageFacts:
    tally = ImageFacts()
    for image in images:
        tally.add(*image)
    return tally


@pytest.mark.parametrize(
    ("images", "shape", "encoding"),
    [
        ([("jpeg", 3, 40, 30), ("jpeg", 3, 41, 30)], (30, None, 3), "jpeg"),
        ([("png", 1, 12, 10), ("png", 1, 12, 10)], (10, 12, 1), "png"),
        ([("png", 2, 12, 10)], (10, 12, 4), "png"),  # greyscale and alpha: as RGBA
        ([("jpeg", 1, 5, 5), ("png", 4, 5, 6), ("bmp", 3, 5, 5)], (None, 5, 3), None),
        ([("jpeg", 4, 8, 8)], (8, 8, 3), "jpeg"),  # CMYK JPEG: TFDS's JPEG Image has 1 or 3
        ([("bmp", 3, 8, 8)], (8, 8, 3), None),
        # Every image grey, one a palette BMP: TensorFlow decodes no BMP to 1 channel.
        ([("jpeg", 1, 8, 8), ("bmp", 1, 8, 8)], (8, 8, 3), None),
    ],
)
def test_the_image_shape_tfds_decodes_to(images, shape, encoding):
    assert tfds_metadata.image_shape(facts(*images)) == (shape, encoding)


@pytest.mark.parametrize("formats", [("gif",), ("jpeg", "webp"), ()])
def test_no_image_feature_for_animations_or_no_images(formats):
    with pytest.raises(ValueError, match="does not describe"):
        tfds_metadata.image_shape(facts(*((f, 3, 8, 8) for f in formats)))


def test_image_facts_merge_like_one_tally():
    images = [("jpeg", 3, 40, 30), ("png", 1, 8, 90), ("png", 4, 400, 3), ("jpeg", 3, 40, 30)]
    halves = facts(*images[:1]).merge(facts(*images[1:]))
    whole = facts(*images)
    assert (halves.formats, halves.channels) == (whole.formats, whole.channels)
    assert halves.widths == whole.widths == (8, 400) and halves.heights == (3, 90)
    assert whole.count == 4 and facts().merge(whole).widths == (8, 400)


def _manifest(labels, label_counts, features=("label",)) -> Manifest:
    return Manifest(
        name="ds",
        tool_version="0",
        created="",
        num_inputs=1,
        splits={
            "train": SplitInfo((ShardInfo("ds-train.tfrecord-00000-of-00001", 1, 9),), label_counts)
        },  # fmt: skip
        features={key: FeatureSpec("int64", (), False) for key in features},
        labels=labels,
        plan={},
        errors=ErrorSummary(),
        compression="none",
        options={},
    )


def test_class_names_that_a_names_file_cannot_hold_are_left_to_the_description():
    readable = _manifest(("a b", "c"), {"a b": 1, "c": 0})
    assert tfds_metadata.label_names(readable) == {"label": ["a b", "c"]}
    assert not tfds_metadata.names_left_out(readable)
    for names in ((" a", "b"), ("", "b"), ("a\nb", "c"), ("a\rb", "c")):
        manifest = _manifest(names, dict.fromkeys(names, 0))
        assert tfds_metadata.label_names(manifest) == {}
        assert tfds_metadata.names_left_out(manifest)  # the summary says so
        assert tfds_metadata.num_classes(manifest) == 2  # still a ClassLabel, by number
        files = dict(tfds_metadata.documents(manifest))
        assert "label.labels.txt" not in files
        assert all(name in json.loads(files["dataset_info.json"])["description"] for name in names)


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"0": 1, "4": 2}, 5),
        ({"3": 1}, 4),
        ({"-1": 1, "2": 1}, None),
        (None, None),
        ({"0": 1, str(2**63 - 2): 1}, 2**63 - 1),  # the most numClasses (int64) holds
        ({"0": 1, str(2**63 - 1): 1}, None),  # one more does not fit: a plain tensor
    ],
)
def test_numeric_label_ids_set_the_number_of_classes(counts, expected):
    assert tfds_metadata.num_classes(_manifest(None, counts)) == expected


def test_the_names_file_is_one_name_a_line():
    text = dict(tfds_metadata.documents(_manifest(("x", "y"), {"x": 1, "y": 0})))
    assert text["label.labels.txt"] == "x\ny\n"
    assert set(text) == {"label.labels.txt", "features.json", "dataset_info.json"}
