"""The Example codec: typed feature values to deterministic tf.train.Example bytes, and back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from google.protobuf.unknown_fields import UnknownFieldSet

from recordforge.schemas import recordforge_example_pb2 as example_pb2

Example = example_pb2.Example

# (dtype, values): dtype is "int64" | "float" | "bytes"; a scalar is a 1-element sequence.
FeatureValues = tuple[str, Sequence]


def build_example(features: Mapping[str, FeatureValues]) -> Example:
    """An Example holding `features`."""
    example = Example()
    add_features(example, features)
    return example


def add_features(example: Example, features: Mapping[str, FeatureValues]) -> None:
    """Add `features` to `example` in place (faster than nesting constructors)."""
    feature_map = example.features.feature
    for key, (dtype, values) in features.items():
        feature = feature_map[key]
        if dtype == "bytes":
            feature.bytes_list.value.extend(values)
        elif dtype == "int64":
            feature.int64_list.value.extend(values)
        elif dtype == "float":
            feature.float_list.value.extend(values)
        else:
            raise ValueError(f"feature {key!r}: unknown dtype {dtype!r}")


def serialize(example: Example) -> bytes:
    """The Example's bytes, with map entries in key order so equal Examples give equal bytes."""
    return example.SerializeToString(deterministic=True)


def parse(data: bytes) -> Example:
    """Parse serialized Example bytes."""
    return Example.FromString(data)


def foreign_fields(example: Example) -> tuple[tuple[int, int], ...]:
    """(number, wire type) of each field a parsed record holds that tf.train.Example does not
    have, sorted.

    protobuf parses any message whose field 1 looks like Example's `features` as an Example and
    keeps the rest aside: a tf.train.SequenceExample parses so, its `feature_lists` (field 2)
    set aside, as TensorFlow's parser skips them too.
    """
    return tuple(
        sorted({(field.field_number, field.wire_type) for field in UnknownFieldSet(example)})
    )


class ExampleEncoder:
    """Serializes many Examples with the same keys fast, by refilling a template in place.

    Building an Example afresh costs about 1 µs per feature; refilling one whose keys are
    already there costs a tenth of that. One template is kept per set of present keys (rows
    that lack optional cells have fewer keys), so the bytes are exactly `serialize` of a fresh
    `build_example` with the same features.

    Args:
        features: (key, dtype) of every feature a record may have, in a fixed order.
    """

    def __init__(self, features: Iterable[tuple[str, str]]) -> None:
        self._features = tuple(features)
        self._templates: dict[tuple[bool, ...], tuple[Example, list]] = {}

    def encode(self, values: Sequence[Sequence | None]) -> bytes:
        """Serialize one record: `values[i]` holds feature i's values, or None when absent."""
        present = tuple(v is not None for v in values)
        template = self._templates.get(present)
        if template is None:
            template = self._templates[present] = self._template(present)
        example, containers = template
        for container, value in zip(containers, [v for v in values if v is not None], strict=True):
            container[:] = value
        return serialize(example)

    def _template(self, present: tuple[bool, ...]) -> tuple[Example, list]:
        example = Example()
        containers = []
        for (key, dtype), here in zip(self._features, present, strict=True):
            if here:
                feature = example.features.feature[key]
                containers.append(getattr(feature, _LIST_FIELDS[dtype]).value)
        return example, containers


_LIST_FIELDS = {"bytes": "bytes_list", "int64": "int64_list", "float": "float_list"}


def to_python(example: Example) -> dict[str, FeatureValues]:
    """The Example's features as {key: (dtype, list of values)}, for inspection and tests."""
    result = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            result[key] = ("bytes", list(feature.bytes_list.value))
        elif kind == "int64_list":
            result[key] = ("int64", list(feature.int64_list.value))
        elif kind == "float_list":
            result[key] = ("float", list(feature.float_list.value))
        else:
            result[key] = ("bytes", [])  # a feature with no kind set parses as an empty list
    return result


_KIND_DTYPES = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}

# (key, dtype or None for a feature with no list set, number of values), in key order.
FeatureFacts = tuple[tuple[str, str | None, int], ...]


def feature_facts(example: Example) -> FeatureFacts:
    """What each feature of an Example holds: (key, dtype, number of values), in key order.

    A Feature with no list set reads as an empty list of any type (TensorFlow parses it so):
    its dtype is None.
    """
    facts = []
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None:
            facts.append((key, None, 0))
        else:
            facts.append((key, _KIND_DTYPES[kind], len(getattr(feature, kind).value)))
    facts.sort()
    return tuple(facts)
