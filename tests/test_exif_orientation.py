"""EXIF-oriented photos with and without preprocessing (issue 16 item 3): the facts the run
records (the features, the manifest's image facts that TFDS's Image shape is written from)
describe the image bytes stored in the record, which is what a reader decodes.

--resize/--encode turn the pixels as the EXIF orientation says, so a photo taken sideways is
stored with its width and height swapped; without them the original bytes are stored and
decoders (TensorFlow's ignore EXIF) see the pixels as they lie in the file.
"""

from __future__ import annotations

import io
import json

import pytest
from conftest import make_image, shard_files
from PIL import Image, ImageOps

from recordforge.transforms.build import stored_image
from recordforge.transforms.core.images.preprocess import Preprocessing, preprocess
from recordforge.transforms.core.images.probe import probe_image_bytes
from recordforge.transforms.core.records import ImageInfo

SOURCE_SIZE = (75, 50)  # (width, height) in the file, before any orientation
# (keywords of recordforge.convert, the stored (width, height) for orientations 1 and 3: 6 and 8
# swap them where pixels are re-encoded)
MODES = {
    "resize-shorter-side": ({"resize": "20"}, (30, 20)),
    "resize-wxh": ({"resize": "24x16"}, (24, 16)),
    "encode-only": ({"encode": "png"}, (75, 50)),
    "none": ({}, (75, 50)),
}


def _photo(path, orientation: int, fmt: str = "JPEG") -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return make_image(path, fmt, size=SOURCE_SIZE, seed=orientation, exif=exif.tobytes())


def _expected_size(mode: str, orientation: int) -> tuple[int, int]:
    options, (width, height) = MODES[mode]
    if options and "x" not in options.get("resize", "") and orientation in (5, 6, 7, 8):
        return height, width
    return width, height


def _records(out):
    import tensorflow as tf

    return [
        tf.train.Example.FromString(data.numpy())
        for data in tf.data.TFRecordDataset([str(p) for p in shard_files(out)])
    ]


def _int(example, key: str) -> int:
    (value,) = example.features.feature[key].int64_list.value
    return value


@pytest.mark.parametrize("orientations", [(1, 3), (6, 8)], ids=["upright", "turned"])
@pytest.mark.parametrize("mode", MODES)
def test_recorded_image_facts_are_those_of_the_stored_bytes(tmp_path, tf, mode, orientations):
    """A dataset of photos whose stored images all have one size: TFDS's Image, written from
    the manifest's image facts, gets that exact shape."""
    import recordforge

    originals = {
        f"o{n}.jpg": _photo(tmp_path / "photos" / "cats" / f"o{n}.jpg", n) for n in orientations
    }
    out = tmp_path / "out"
    options, _ = MODES[mode]
    recordforge.convert(tmp_path / "photos", out, name="photos", tfds=True, **options)

    records = _records(out)
    assert len(records) == len(orientations)
    shapes = set()
    for record in records:
        path = record.features.feature["image/filename"].bytes_list.value[0].decode()
        name = path.rsplit("/", 1)[-1]
        stored = record.features.feature["image/encoded"].bytes_list.value[0]
        if not options:
            assert stored == originals[name]  # without the options the file's bytes, as they are
        decoded = tuple(tf.io.decode_image(stored, expand_animations=False).shape)
        width, height = _expected_size(mode, int(name[1]))
        assert decoded == (height, width, 3), name
        # The record's features say what the reader decodes.
        features = tuple(_int(record, f"image/{key}") for key in ("height", "width", "channels"))
        assert features == decoded, name
        shapes.add(decoded)
    # So do the manifest's image facts, from which TFDS's Image shape is written.
    (shape,) = shapes
    tfds_features = json.loads((out / "features.json").read_text())["featuresDict"]["features"]
    dimensions = tfds_features["image/encoded"]["image"]["shape"]["dimensions"]
    assert tuple(int(d) for d in dimensions) == shape


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize(
    "options",
    [
        Preprocessing(shorter_side=20),
        Preprocessing(size=(24, 16)),
        Preprocessing(size=(24, 16), mode="pad"),
        Preprocessing(encode="png"),
        Preprocessing(encode="jpeg", channels=1),
    ],
    ids=["shorter-side", "wxh-crop", "wxh-pad", "png", "grey-jpeg"],
)
def test_the_planned_image_is_the_one_the_writer_stores(tmp_path, orientation, fmt, options):
    """What BuildRecords plans a record with (its features, the manifest's image facts),
    from the probe, equals the facts of what `preprocess` stores, for all eight orientations
    and the formats that carry EXIF."""
    data = _photo(tmp_path / "photo", orientation, fmt)
    facts = probe_image_bytes(data, orientation=True)
    assert facts.orientation == orientation
    assert probe_image_bytes(data).orientation == 1  # read only when asked
    probed = ImageInfo(len(data), facts.format, facts.width, facts.height, facts.channels)
    planned = stored_image(probed._replace(orientation=facts.orientation), options, 10**9)
    stored = probe_image_bytes(preprocess(data, options))
    assert (planned.format, planned.width, planned.height, planned.channels) == (
        stored.format,
        stored.width,
        stored.height,
        stored.channels,
    )
    turned = orientation >= 5 and options.size is None
    expected = options.output_size(*(SOURCE_SIZE[::-1] if turned else SOURCE_SIZE))
    assert (stored.width, stored.height) == expected


@pytest.mark.parametrize("orientation", range(1, 9))
def test_pixels_are_turned_as_pillow_turns_them(tmp_path, orientation):
    data = _photo(tmp_path / "photo", orientation, "PNG")
    stored = Image.open(io.BytesIO(preprocess(data, Preprocessing(encode="png"))))
    expected = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert stored.size == expected.size
    assert stored.tobytes() == expected.convert(stored.mode).tobytes()


def test_a_damaged_exif_block_counts_as_upright(tmp_path):
    """Metadata never makes a photo unusable: an unreadable EXIF block turns nothing."""
    buffer = io.BytesIO()
    Image.new("RGB", SOURCE_SIZE, (9, 99, 199)).save(buffer, "JPEG", exif=b"Exif\0\0garbage!")
    data = buffer.getvalue()
    assert probe_image_bytes(data, orientation=True).orientation == 1
    stored = probe_image_bytes(preprocess(data, Preprocessing(shorter_side=20)))
    assert (stored.width, stored.height) == (30, 20)
