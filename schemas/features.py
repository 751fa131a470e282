"""Feature specs: what each Example key holds, derived from what the conversion actually wrote."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

DTYPES = ("int64", "float", "bytes")

# The keys TensorFlow's image model code already reads (docs/design.md, "Records and features").
IMAGE_ENCODED = "image/encoded"
IMAGE_FORMAT = "image/format"
IMAGE_HEIGHT = "image/height"
IMAGE_WIDTH = "image/width"
IMAGE_CHANNELS = "image/channels"
IMAGE_FILENAME = "image/filename"
IMAGE_LABEL = "image/class/label"
IMAGE_LABEL_TEXT = "image/class/text"
# Tabular rows (no image) carry a label column under these keys.
LABEL = "label"
LABEL_TEXT = "label/text"


@dataclass(frozen=True)
class DeclaredFeature:
    """A feature the conversion intends to write: its key, dtype and whether it is a list."""

    key: str
    dtype: str
    is_list: bool = False
    description: str = ""
    # False for features only some runs produce (labels): left out of the spec when no record
    # has them, rather than listed as always missing.
    listed_when_absent: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"feature {self.key!r}: dtype {self.dtype!r} not in {DTYPES}")


@dataclass(frozen=True)
class FeatureSpec:
    """How a reader parses one feature.

    Attributes:
        dtype: "int64", "float" (float32) or "bytes".
        shape: () for a scalar in every record, (k,) for exactly k values in every record,
            (-1,) for a variable number of values (including none, or the key being absent).
        optional: whether some records lack the key. Only ever true with shape (-1,), so
            shape alone tells a reader to use FixedLenFeature or VarLenFeature.
        description: where the feature comes from, in words.
    """

    dtype: str
    shape: tuple[int, ...]
    optional: bool
    description: str = ""

    def to_dict(self) -> dict:
        spec = {"dtype": self.dtype, "shape": list(self.shape), "optional": self.optional}
        if self.description:
            spec["description"] = self.description
        return spec

    @classmethod
    def from_dict(cls, spec: Mapping) -> FeatureSpec:
        return cls(
            dtype=spec["dtype"],
            shape=tuple(spec["shape"]),
            optional=bool(spec["optional"]),
            description=spec.get("description", ""),
        )


class ImageFacts:
    """What the images of the records have in common: formats, channel counts, size ranges.

    Mergeable and small (two short counters and two ranges), like FeatureTally. TensorFlow
    Datasets' Image feature is described from it (schemas/tfds_metadata.py).
    """

    def __init__(self) -> None:
        self.formats: collections.Counter[str] = collections.Counter()
        self.channels: collections.Counter[int] = collections.Counter()
        self.widths: tuple[int, int] | None = None  # (smallest, largest)
        self.heights: tuple[int, int] | None = None

    @property
    def count(self) -> int:
        return sum(self.formats.values())

    def add(self, image_format: str, channels: int, width: int, height: int, times: int = 1):
        self.formats[image_format] += times
        self.channels[channels] += times
        self.widths = _widen(self.widths, (width, width))
        self.heights = _widen(self.heights, (height, height))

    def merge(self, other: ImageFacts) -> ImageFacts:
        self.formats.update(other.formats)
        self.channels.update(other.channels)
        self.widths = _widen(self.widths, other.widths)
        self.heights = _widen(self.heights, other.heights)
        return self


def _widen(span: tuple[int, int] | None, other: tuple[int, int] | None):
    if span is None or other is None:
        return span or other
    return min(span[0], other[0]), max(span[1], other[1])


class FeatureTally:
    """Counts, per feature key, how many records have it and the range of its value counts;
    and the facts of the records' images.

    Mergeable (a Beam combiner accumulator) and small: one entry per key, whatever the data.
    """

    def __init__(self) -> None:
        self.num_records = 0
        self.keys: dict[str, list[int]] = {}  # key -> [records with it, min values, max values]
        self.images = ImageFacts()
        # key -> {dtype: records holding it as that dtype}, for records whose features are
        # typed by what they hold (TFRecord inputs, WriteDataset) rather than declared.
        self.dtypes: dict[str, dict[str, int]] = {}
        # key -> records holding it as a Feature with no list set, which TensorFlow's parser
        # takes for a missing key (a FixedLenFeature refuses it, a VarLenFeature gives []).
        self.untyped: dict[str, int] = {}

    def add(self, lengths: Iterable[tuple[str, int]], times: int = 1) -> None:
        """Count `times` records, each with (key, number of values) for each key it has."""
        self.num_records += times
        for key, length in lengths:
            entry = self.keys.get(key)
            if entry is None:
                self.keys[key] = [times, length, length]
            else:
                entry[0] += times
                entry[1] = min(entry[1], length)
                entry[2] = max(entry[2], length)

    def add_typed(self, facts: Sequence[tuple[str, str | None, int]], times: int = 1) -> None:
        """`add` for records typed by their values: (key, dtype, number of values) each, the
        dtype None for a feature with no list set (empty, of no type)."""
        self.add(((key, length) for key, _, length in facts), times)
        for key, dtype, _ in facts:
            if dtype is not None:
                seen = self.dtypes.setdefault(key, {})
                seen[dtype] = seen.get(dtype, 0) + times
            else:
                self.untyped[key] = self.untyped.get(key, 0) + times

    def merge(self, other: FeatureTally) -> FeatureTally:
        self.num_records += other.num_records
        self.images.merge(other.images)
        for key, seen in other.dtypes.items():
            mine = self.dtypes.setdefault(key, {})
            for dtype, count in seen.items():
                mine[dtype] = mine.get(dtype, 0) + count
        for key, count in getattr(other, "untyped", {}).items():
            self.untyped[key] = self.untyped.get(key, 0) + count
        for key, (count, low, high) in other.keys.items():
            entry = self.keys.get(key)
            if entry is None:
                self.keys[key] = [count, low, high]
            else:
                entry[0] += count
                entry[1] = min(entry[1], low)
                entry[2] = max(entry[2], high)
        return self


def derive_specs(
    declared: Sequence[DeclaredFeature] | InferredFeatures, tally: FeatureTally
) -> dict[str, FeatureSpec]:
    """The feature spec of a dataset: declared dtypes, shapes and optionality as observed.

    A declared feature present in every record gets a fixed shape (() for scalars, (k,) for lists
    that always hold k values); otherwise (-1,) and, if some record lacks it, optional. Records
    that arrive serialized declare their features by what they hold (InferredFeatures). A key
    some record holds as a Feature with no list set is (-1,) and optional: TensorFlow's parser
    takes such a Feature for a missing key, which a fixed shape (a FixedLenFeature) refuses.
    """
    if isinstance(declared, InferredFeatures):
        declared = declared.declare(tally)
    specs = {}
    for feature in declared:
        count, low, high = tally.keys.get(feature.key, (0, 0, 0))
        if count == 0 and not feature.listed_when_absent:
            continue
        everywhere = count == tally.num_records
        if not feature.is_list:
            shape = () if everywhere else (-1,)
        else:
            shape = (low,) if everywhere and low == high and tally.num_records else (-1,)
        optional = not everywhere
        if getattr(tally, "untyped", {}).get(feature.key) and -1 not in shape:
            shape, optional = (-1,), True
        specs[feature.key] = FeatureSpec(
            dtype=feature.dtype,
            shape=shape,
            optional=optional,
            description=feature.description,
        )
    return specs


class MixedFeatureTypes(ValueError):
    """Records hold one feature key with values of different dtypes: no spec parses them all."""


@dataclass(frozen=True)
class FeatureType:
    """What a feature schema says of one key of records that arrive serialized.

    Attributes:
        dtype: "int64", "float" or "bytes".
        shape: () a scalar, (k,) exactly k values, (-1,) any number; None: as the records are.
        description: carried into the manifest's spec.
    """

    dtype: str
    shape: tuple[int, ...] | None = None
    description: str = ""

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, **({} if self.shape is None else {"shape": list(self.shape)})}

    @property
    def fixed_count(self) -> int | None:
        """How many values a record that has the key must hold; None for any number."""
        if self.shape is None or self.shape == (-1,):
            return None
        return self.shape[0] if self.shape else 1


def infer_features(
    tally: FeatureTally, declared: Mapping[str, FeatureType] | None = None
) -> tuple[DeclaredFeature, ...]:
    """The features of records typed by what they hold, in key order, for `derive_specs`.

    A key is a scalar when every record that has it holds exactly one value, else a list; its
    dtype is the one its values have (a key only ever empty and untyped reads as bytes).
    `declared` ({key: FeatureType}, from a schema) fixes the dtype, and the kind when it gives
    a shape, of its keys.

    Raises:
        MixedFeatureTypes: a key the schema does not type holds values of two dtypes.
    """
    declared = declared or {}
    features = []
    for key in sorted(tally.keys):
        _, low, high = tally.keys[key]
        scalar = low == high == 1
        rule = declared.get(key)
        if rule is not None:
            # A fixed shape says which; any number of values (or no shape) leaves it to the
            # records, so that a manifest read as a schema gives back the spec it holds.
            is_list = not scalar if rule.fixed_count is None else rule.shape != ()
            features.append(DeclaredFeature(key, rule.dtype, is_list, rule.description))
            continue
        seen = tally.dtypes.get(key, {})
        if len(seen) > 1:
            raise MixedFeatureTypes(_mixed_message(key, seen))
        features.append(DeclaredFeature(key, next(iter(seen), "bytes"), is_list=not scalar))
    return tuple(features)


@dataclass(frozen=True)
class InferredFeatures:
    """The features of records that arrive serialized: known once their tally is, typed by the
    records' values and the feature schema's `types` ({key: FeatureType})."""

    types: Mapping[str, FeatureType] = field(default_factory=dict)

    def declare(self, tally: FeatureTally) -> tuple[DeclaredFeature, ...]:
        """`infer_features(tally, types)`; raises MixedFeatureTypes as it does."""
        return infer_features(tally, self.types)


def _mixed_message(key: str, seen: Mapping[str, int]) -> str:
    counts = " and ".join(
        f"{dtype} values in {count:,} record{'s' if count != 1 else ''}"
        for dtype, count in sorted(seen.items(), key=lambda item: (-item[1], item[0]))
    )
    return (
        f"feature {key!r} holds {counts}: one feature spec cannot parse them all. Declare its "
        "dtype (reshard --schema, WriteDataset(features=...)) to keep the records that match "
        "and quarantine the others"
    )


def feature_types(document: Mapping) -> dict[str, FeatureType]:
    """{key: FeatureType} from a schema document's `features` mapping.

    Each entry is a dtype (`age: int64`) or a mapping with `dtype` and, optionally, `shape`
    (`[]` a scalar, `[k]` k values, `[-1]` any number), as the `features` of a recordforge
    manifest are: a manifest is a schema too.

    Raises:
        ValueError: the document does not say that, in words naming the entry.
    """
    features = document.get("features") if isinstance(document, Mapping) else None
    if not isinstance(features, Mapping) or not features:
        raise ValueError("a feature schema needs a `features` mapping of key: dtype")
    types = {}
    for key, entry in features.items():
        spec = {"dtype": entry} if isinstance(entry, str) else entry
        if not isinstance(key, str) or not isinstance(spec, Mapping):
            raise ValueError(f"feature {key!r}: give a dtype or a mapping with `dtype`")
        unknown = set(spec) - {"dtype", "shape", "optional", "description"}
        if unknown:
            raise ValueError(f"feature {key!r}: unknown field {sorted(unknown)[0]!r}")
        dtype = spec.get("dtype")
        if dtype not in DTYPES:
            raise ValueError(f"feature {key!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        shape = spec.get("shape")
        if shape is not None and not (
            isinstance(shape, Sequence)
            and not isinstance(shape, str)
            and len(shape) <= 1
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape)
        ):
            raise ValueError(f"feature {key!r}: shape {shape!r} is not [], [k] or [-1]")
        types[key] = FeatureType(
            dtype,
            tuple(shape) if shape is not None else None,
            str(spec.get("description", "")),
        )
    return types
