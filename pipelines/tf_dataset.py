"""Loading a converted dataset for training: a tf.data.Dataset built from the manifest.

TensorFlow is imported when `load` or `feature_spec` is called, not when recordforge is: the
conversion and the TF-free reader (`pipelines.dataset.iterate`) do not need it.
"""

from __future__ import annotations

from collections.abc import Mapping

from recordforge.pipelines.dataset import open_dataset
from recordforge.pipelines.library_calls import check_switches
from recordforge.schemas.features import IMAGE_ENCODED, FeatureSpec
from recordforge.transforms.core.errors import UsageError

# Decoded pixels go under this key, beside the original bytes under image/encoded.
DECODED_IMAGE = "image"


def feature_spec(dataset) -> dict:
    """The manifest's feature spec as `tf.io.parse_example` / `parse_single_example` takes it.

    `dataset`: the dataset folder, what `recordforge.convert` returned, or a manifest's
    `features` ({key: FeatureSpec}). Fixed shapes ([] and [k]) become FixedLenFeature;
    variable ones ([-1], which may be absent from a record) become RaggedFeature: a 1-D tensor
    per record, empty when absent.

    Raises:
        UsageError: a folder that holds no recordforge dataset.
    """
    import tensorflow as tf

    features: Mapping[str, FeatureSpec] = (
        dataset if isinstance(dataset, Mapping) else open_dataset(dataset).manifest.features
    )

    dtypes = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}
    return {
        key: tf.io.RaggedFeature(dtypes[spec.dtype])
        if -1 in spec.shape
        else tf.io.FixedLenFeature(spec.shape, dtypes[spec.dtype])
        for key, spec in features.items()
    }


def load(
    folder,
    split: str = "train",
    *,
    decode_images: bool = False,
    image_channels: int = 0,
    shuffle_files: bool = False,
    seed: int | None = None,
    parallel_reads: int = 16,
    deterministic: bool = True,
):
    """A tf.data.Dataset of one split's records, parsed into dicts of tensors.

    The shards are read `parallel_reads` at a time, interleaved record by record; the feature
    spec comes from the manifest, and the dataset's cardinality is the manifest's record count
    (known without reading a shard). Local paths and gs:// work as TensorFlow's file systems do:
    the manifest is read through Beam FileSystems, the shards by TensorFlow's own GCS client,
    which ignores STORAGE_EMULATOR_HOST (so gs:// here is not covered by the emulator tests).

    Args:
        folder: the dataset folder (the one holding dataset_info.json), or the dataset
            `recordforge.convert` returned.
        split: the split to read.
        decode_images: add the decoded pixels of `image/encoded` under "image" (uint8,
            [height, width, channels]); animated GIFs give their first frame.
        image_channels: with decode_images, the channels to decode to (0: as stored, which may
            differ between records; 3 gives RGB everywhere).
        shuffle_files: read the shards in a random order, a new one each epoch (`seed`).
        parallel_reads: how many shards are read at once.
        deterministic: keep the interleaved order reproducible (False may be faster).

    Raises:
        UsageError: the folder holds no recordforge dataset, or no such split, or no images
            to decode.
    """
    import tensorflow as tf

    check_switches(
        decode_images=decode_images, shuffle_files=shuffle_files, deterministic=deterministic
    )
    if image_channels not in (0, 1, 3, 4) or isinstance(image_channels, bool):
        raise UsageError(f"image_channels is 0 (as stored), 1, 3 or 4, got {image_channels!r}")
    if (
        isinstance(parallel_reads, bool)
        or not isinstance(parallel_reads, int)
        or parallel_reads < 1
    ):
        raise UsageError(f"parallel_reads is a whole number of at least 1, got {parallel_reads!r}")
    dataset = open_dataset(folder)
    split_info = dataset.split(split)
    files = [dataset.path(shard.file) for shard in split_info.shards]
    compression = "GZIP" if dataset.manifest.compression == "gzip" else None
    spec = feature_spec(dataset.manifest.features)
    # Typed: an empty split's empty list would otherwise be a float tensor.
    records = tf.data.Dataset.from_tensor_slices(tf.constant(files, dtype=tf.string))
    if shuffle_files:
        records = records.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    records = records.interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=compression),
        cycle_length=max(1, min(parallel_reads, len(files))),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    examples = records.map(
        lambda record: tf.io.parse_single_example(record, spec),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    if decode_images:
        if IMAGE_ENCODED not in spec:
            raise UsageError(f"{dataset.folder} has no {IMAGE_ENCODED} feature to decode")

        def decode(example):
            pixels = decode_image(tf, example[IMAGE_ENCODED], image_channels)
            return {**example, DECODED_IMAGE: pixels}

        examples = examples.map(
            decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic
        )
    return examples.apply(tf.data.experimental.assert_cardinality(split_info.num_records))


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def decode_image(tf, encoded, channels: int):
    """An image's pixels (uint8, [height, width, channels]; 0: as stored), first frame.

    TensorFlow's decoders convert between channel counts only in part: PNG always, a JPEG
    to 1 or 3 (not a CMYK one to 1), a BMP to 3 or 4, a GIF or WebP not at all. Those convert
    themselves; the others are decoded as stored and converted here: grey repeated for RGB,
    an opaque alpha added, alpha dropped, RGB made grey by tf.image.rgb_to_grayscale.
    """
    if channels == 0:
        return tf.io.decode_image(encoded, channels=0, expand_animations=False)
    is_png = tf.equal(tf.strings.substr(encoded, 0, len(_PNG_SIGNATURE)), _PNG_SIGNATURE)
    if channels == 4:
        converts = is_png
    else:
        converts = tf.logical_or(
            is_png,
            tf.cond(
                tf.io.is_jpeg(encoded),
                lambda: tf.io.extract_jpeg_shape(encoded)[2] != 4,  # not CMYK
                lambda: tf.constant(False),
            ),
        )

    def as_stored_then_converted():
        pixels = tf.io.decode_image(encoded, channels=0, expand_animations=False)
        stored = tf.shape(pixels)[2]
        rgb = tf.cond(
            stored >= 3, lambda: pixels[:, :, :3], lambda: tf.tile(pixels[:, :, :1], [1, 1, 3])
        )
        if channels == 3:
            return rgb
        if channels == 1:
            return tf.cond(
                stored <= 2, lambda: pixels[:, :, :1], lambda: tf.image.rgb_to_grayscale(rgb)
            )
        alpha = tf.cond(
            tf.equal(stored % 2, 0),  # 2 (grey and alpha) or 4
            lambda: pixels[:, :, -1:],
            lambda: tf.fill(tf.concat([tf.shape(pixels)[:2], [1]], 0), tf.constant(255, tf.uint8)),
        )
        return tf.concat([rgb, alpha], axis=2)

    pixels = tf.cond(
        converts,
        lambda: tf.io.decode_image(encoded, channels=channels, expand_animations=False),
        as_stored_then_converted,
    )
    pixels.set_shape([None, None, channels])
    return pixels
