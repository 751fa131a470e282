"""TensorFlow Datasets' metadata for a converted dataset, so `tfds.builder_from_directory` loads it.

TFDS reads from the dataset folder `dataset_info.json` (its DatasetInfo proto as JSON, parsed
strictly: unknown fields are errors), `features.json` (the FeatureConnector tree, each feature's
proto as JSON) and, per ClassLabel, `{key with / as .}.labels.txt` (its class names, one a line).
All are written here from the manifest, without importing TFDS: the formats are those TFDS 4.x
writes itself (`tfds.folder_dataset.write_metadata`), and tests load the result with the real
package. Features keep the keys of the Examples (`image/encoded` and all), so only the metadata
says what TFDS makes of them; the shards are the same with or without --tfds:

- `image/encoded` is TFDS's `Image` (decoded to uint8 [height, width, channels]) when every
  image is JPEG, PNG or BMP. TFDS decodes GIF and WebP as animations ([frames, h, w, c]), which
  its Image cannot describe as a picture, so with those it stays a bytes `Tensor`.
- the label is a `ClassLabel` (with the class names, when the manifest has them);
- supervised keys pair the image (or, without one, the other features) with the label.
Everything else is a plain `Tensor`, as in recordforge's own `load`.
"""

from __future__ import annotations

import json

from recordforge.schemas import features as keys
from recordforge.schemas.features import FeatureSpec, ImageFacts
from recordforge.schemas.manifest import Manifest

# The shard names recordforge writes are TFDS's default template.
FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
VERSION = "1.0.0"
FEATURES_FILE = "features.json"
DATASET_INFO_FILE = "dataset_info.json"

_FEATURES = "tensorflow_datasets.core.features."
_TENSOR_CLASS = _FEATURES + "tensor_feature.Tensor"
_DICT_CLASS = _FEATURES + "features_dict.FeaturesDict"
_IMAGE_CLASS = _FEATURES + "image_feature.Image"
_CLASS_LABEL_CLASS = _FEATURES + "class_label_feature.ClassLabel"
_TFDS_DTYPES = {"int64": "int64", "float": "float32", "bytes": "string"}

# Formats TFDS's Image decodes (tf.image.decode_image) to one [height, width, channels] picture.
_STILL_FORMATS = frozenset({"jpeg", "png", "bmp"})
# The channel counts TFDS's Image accepts with each encoding_format (None: any format) and
# TensorFlow decodes to (decode_image takes 0, 1, 3 or 4: TFDS's metadata accepts 2, and then
# no record could be decoded).
_CHANNELS = {"jpeg": (1, 3), "png": (1, 3, 4), None: (1, 3, 4)}
# Grey with alpha (2 channels) in every image: decoded to RGBA, the grey repeated, alpha kept.
_GREY_WITH_ALPHA, _AS_RGBA = 2, 4
# Images of different channel counts are decoded to RGB: TFDS's default Image shape.
_MIXED_CHANNELS = 3
LABEL_KEYS = ((keys.IMAGE_LABEL, keys.IMAGE_LABEL_TEXT), (keys.LABEL, keys.LABEL_TEXT))


def label_names_file(feature_key: str) -> str:
    """Where TFDS's ClassLabel keeps the class names of a top-level feature."""
    return feature_key.replace("/", ".") + ".labels.txt"


def documents(manifest: Manifest, images: ImageFacts | None = None) -> list[tuple[str, str]]:
    """(file name, text) of every TFDS metadata file, the label names first."""
    files = [
        (label_names_file(key), "".join(name + "\n" for name in names))
        for key, names in label_names(manifest).items()
    ]
    files.append((FEATURES_FILE, _json(features(manifest, images))))
    files.append((DATASET_INFO_FILE, _json(dataset_info(manifest))))
    return files


def dataset_info(manifest: Manifest) -> dict:
    """TFDS's `dataset_info.json`: name, version, file format, the splits' shard lengths and,
    with a label, the supervised keys."""
    if manifest.compression != "none":
        raise ValueError("TensorFlow Datasets reads uncompressed TFRecord shards only")
    labels = ""
    if manifest.labels:
        labels = " Class ids index these names: " + ", ".join(manifest.labels) + "."
    info = {
        "name": manifest.name,
        "version": VERSION,
        "description": f"Converted by recordforge {manifest.tool_version}.{labels}",
        "fileFormat": "tfrecord",
        "splits": [
            {
                "name": split_name,
                "filepathTemplate": FILEPATH_TEMPLATE,
                # int64 fields are strings in protobuf's JSON mapping.
                "numBytes": str(split.num_bytes),
                "shardLengths": [str(shard.num_records) for shard in split.shards],
            }
            for split_name, split in manifest.splits.items()
        ],
    }
    supervised = supervised_keys(manifest)
    if supervised is not None:
        inputs, label = supervised
        info["supervisedKeys"] = {"tuple": {"items": [_nest(inputs), _nest(label)]}}
    return info


def label_keys(manifest: Manifest) -> tuple[str, str] | None:
    """(label key, class name key) when the conversion labelled the records, else None.

    A CSV column that happens to be called `label` in an unlabelled table is just a column.
    """
    specs = manifest.features
    label, text = LABEL_KEYS[0] if keys.IMAGE_ENCODED in specs else LABEL_KEYS[1]
    labelled = bool(manifest.labels) or any(
        split.label_counts is not None for split in manifest.splits.values()
    )
    return (label, text) if labelled and label in specs else None


def supervised_keys(manifest: Manifest) -> tuple[str | dict, str] | None:
    """(input, label) for `as_supervised=True`: the image and its label; in a table without
    images, {key: key} of every other feature and the label. None without a label."""
    found = label_keys(manifest)
    if found is None:
        return None
    label, text = found
    if keys.IMAGE_ENCODED in manifest.features:
        return keys.IMAGE_ENCODED, label
    inputs = {key: key for key in sorted(manifest.features) if key not in (label, text)}
    return (inputs, label) if inputs else None


def _nest(value: str | dict) -> dict:
    # SupervisedKeys.Nest: a feature key, or a dict of nests.
    if isinstance(value, str):
        return {"featureKey": value}
    return {"dict": {"dict": {key: _nest(item) for key, item in value.items()}}}


def features(manifest: Manifest, images: ImageFacts | None = None) -> dict:
    """TFDS's `features.json`: a FeaturesDict of one feature connector per feature key.

    `images`: what the dataset's images have in common; without it `image/encoded` stays bytes.
    """
    label = (label_keys(manifest) or (None,))[0]
    connectors = {}
    for key, spec in sorted(manifest.features.items()):
        connector = None
        if key == keys.IMAGE_ENCODED and spec.shape == () and images is not None:
            connector = _image(images)
        elif key == label and spec.shape == () and spec.dtype == "int64":
            connector = _class_label(manifest)
        description = spec.description
        if connector is None:
            connector = _tensor(spec)
        elif "image" in connector:
            description = f"{description}, decoded (uint8, height × width × channels)".lstrip(", ")
        if description:
            connector["description"] = description
        connectors[key] = connector
    return {"pythonClassName": _DICT_CLASS, "featuresDict": {"features": connectors}}


def image_shape(images: ImageFacts) -> tuple[tuple[int | None, int | None, int], str | None]:
    """The (height, width, channels) TFDS decodes every image to (None: varies), and the
    encoding format when all are JPEG or all PNG.

    Raises:
        ValueError: an image format TFDS's Image decodes to more than one picture, or no images.
    """
    formats = set(images.formats)
    if not formats or not formats <= _STILL_FORMATS:
        raise ValueError(f"TFDS's Image does not describe {', '.join(sorted(formats)) or 'none'}")
    encoding = next(iter(formats)) if len(formats) == 1 and formats & {"jpeg", "png"} else None
    channels = next(iter(images.channels)) if len(images.channels) == 1 else _MIXED_CHANNELS
    if channels == _GREY_WITH_ALPHA:
        channels = _AS_RGBA
    if channels not in _CHANNELS[encoding] or (channels == 1 and "bmp" in formats):
        channels = _MIXED_CHANNELS  # TensorFlow decodes a BMP to 0, 3 or 4 channels only
    height, width = (_only(span) for span in (images.heights, images.widths))
    return (height, width, channels), encoding


def _image(images: ImageFacts) -> dict | None:
    try:
        shape, encoding = image_shape(images)
    except ValueError:
        return None
    image = {
        "shape": {"dimensions": [str(-1 if d is None else d) for d in shape]},
        "dtype": "uint8",
    }
    if encoding is not None:
        image["encodingFormat"] = encoding
    return {"pythonClassName": _IMAGE_CLASS, "image": image}


def _only(span: tuple[int, int] | None) -> int | None:
    return span[0] if span is not None and span[0] == span[1] else None


_INT64_MAX = 2**63 - 1


def num_classes(manifest: Manifest) -> int | None:
    """How many classes the label ids index: the class names, or for numeric labels the
    largest id + 1. None when unknown (no label counts), an id is negative, or the count does
    not fit in int64 (TFDS's numClasses field: an id of 2**63 - 1 made TFDS refuse the whole
    dataset's metadata, "Value out of range")."""
    if manifest.labels:
        return len(manifest.labels)
    ids = set()
    for split in manifest.splits.values():
        if split.label_counts is None:
            return None
        try:
            ids.update(int(label) for label in split.label_counts)
        except ValueError:
            return None
    if not ids or min(ids) < 0 or max(ids) + 1 > _INT64_MAX:
        return None
    return max(ids) + 1


def label_names(manifest: Manifest) -> dict[str, list[str]]:
    """{label key: class names} for the labels.txt files; none when the names cannot be read
    back from one (TFDS strips each line and drops empty ones)."""
    names = list(manifest.labels or ())
    found = label_keys(manifest)
    if not names or found is None or manifest.features[found[0]].shape != ():
        return {}
    # Read back in text mode (so \r is a line break too), split at line breaks, stripped.
    if not all(name and name == name.strip() and not {"\r", "\n"} & set(name) for name in names):
        return {}
    return {found[0]: names}


def names_left_out(manifest: Manifest) -> bool:
    """Whether the records' class names cannot go in TFDS's labels file (`label_names`), so
    that its ClassLabel has ids only."""
    found = label_keys(manifest)
    if not manifest.labels or found is None or manifest.features[found[0]].shape != ():
        return False
    return not label_names(manifest)


def _class_label(manifest: Manifest) -> dict | None:
    count = num_classes(manifest)
    if count is None:
        return None
    return {"pythonClassName": _CLASS_LABEL_CLASS, "classLabel": {"numClasses": str(count)}}


def _tensor(spec: FeatureSpec) -> dict:
    # Variable-length features (shape [-1]) may be absent from a record: TFDS parses them as
    # sequences that allow missing keys, giving an empty tensor.
    dimensions = {"dimensions": [str(d) for d in spec.shape]} if spec.shape else {}
    return {
        "pythonClassName": _TENSOR_CLASS,
        "tensor": {"dtype": _TFDS_DTYPES[spec.dtype], "encoding": "none", "shape": dimensions},
    }


def _json(document: dict) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
