"""Records that arrive serialized (TFRecord files, WriteDataset's input), made RecordRefs.

Each record is parsed once, to check that it is a tf.train.Example (and fits the feature schema,
when there is one) and to tally what its features hold; keyed by a hash of its bytes
(keys.content_key), given a split and an order key by the same rules as every other record,
and sized with its framing. Records gather in blocks of about BLOCK_BYTES: a block becomes one
columnar batch of complete RecordRefs (records.REF_SCHEMA, the Example bytes in `example`),
which the Beam layer parks in a spill file, as the CSV table path does with its blocks.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError

from recordforge.schemas import codec
from recordforge.schemas.codec import FeatureFacts
from recordforge.schemas.example_shapes import facts_by_shape
from recordforge.schemas.features import FeatureTally, FeatureType
from recordforge.schemas.values import UnusableValue, example_from_values
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.files.naming import is_valid_split_name
from recordforge.transforms.core.planning.keys import SplitChooser, content_key, order_key
from recordforge.transforms.core.records import complete_batch

# A block's records are parked together: big enough that each spill write and ranged read moves
# megabytes, small enough that a worker holds a few of them at most.
BLOCK_BYTES = 4 << 20
# The number of records in a block is bounded too: each costs a few Python objects until the
# block is taken.
BLOCK_RECORDS = 16384


class SerializedRecords:
    """Serialized Examples in, blocks of complete RecordRefs and their features' tally out.

    Args:
        splits: (split, fraction) pairs for records that come without a split.
        salt: salts the split and order hashes (as --split-salt does everywhere).
        types: {key: FeatureType} from a feature schema: records whose values disagree with it
            fail (FeatureTypeMismatch, FeatureShapeMismatch).
        block_bytes: how many bytes of records make a block full.
    """

    def __init__(
        self,
        splits: Sequence[tuple[str, float]],
        salt: str,
        types: Mapping[str, FeatureType] | None = None,
        block_bytes: int = BLOCK_BYTES,
    ) -> None:
        self._chooser = SplitChooser(tuple(splits), salt)
        self._salt = salt
        self._types = dict(types or {})
        self._block_bytes = block_bytes
        self._pending: list[tuple[bytes, str | None, Hashable]] = []
        self._pending_bytes = 0
        # Records with the same facts are tallied once, with how many there were.
        self._shapes: collections.Counter[FeatureFacts] = collections.Counter()

    def add(self, data: bytes, split: str | None = None, origin: Hashable = None) -> None:
        """Add one record; `split` None to choose it by hash; `origin` names it in errors."""
        self._pending.append((data, split, origin))
        self._pending_bytes += len(data)

    @property
    def full(self) -> bool:
        """Whether the block should be taken now."""
        return self._pending_bytes >= self._block_bytes or len(self._pending) >= BLOCK_RECORDS

    def __len__(self) -> int:
        return len(self._pending)

    def take(self) -> tuple[pa.RecordBatch | None, list[tuple[Hashable, InputError]]]:
        """(the block's usable records as one batch, or None; (origin, error) of the others).

        The block is empty afterwards.
        """
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return None, []
        examples = pa.array([data for data, _, _ in pending], pa.binary())
        # Most records are read column-wise (schemas/example_shapes.py); protobuf reads the rest.
        shape_of, shapes = facts_by_shape(examples)
        problems = [self._problem(facts) for facts in shapes]
        usable = np.ones(len(pending), dtype=bool)
        splits, orders, failed = [], [], []
        for index, (data, split, origin) in enumerate(pending):
            shape = shape_of[index]
            if shape >= 0:
                facts, problem = shapes[shape], problems[shape]
            else:
                facts, problem = self._parsed_facts(data)
            if problem is not None:
                failed.append((origin, problem))
                usable[index] = False
                continue
            key = content_key(data)
            splits.append(split or self._chooser.choose(key))
            orders.append(order_key(self._salt, key))
            self._shapes[facts] += 1
        if not splits:
            return None, failed
        if not usable.all():
            examples = examples.filter(pa.array(usable))
        return complete_batch(splits, orders, examples), failed

    def take_tally(self) -> FeatureTally:
        """The tally of the records taken since the last call."""
        tally = FeatureTally()
        for facts, times in self._shapes.items():
            tally.add_typed(facts, times)
        self._shapes.clear()
        return tally

    def _parsed_facts(self, data: bytes) -> tuple[FeatureFacts, InputError | None]:
        """A record's facts, read by protobuf, and why it cannot be used (None if it can)."""
        try:
            example = codec.parse(data)
        except DecodeError:
            # protobuf's message names recordforge's own copy of the type, not the user's.
            error = InputError(
                "NotAnExample", "the record's bytes do not parse as a tf.train.Example"
            )
            return (), error
        foreign = codec.foreign_fields(example)
        if foreign:
            return (), _not_an_example(foreign)
        facts = codec.feature_facts(example)
        return facts, self._problem(facts)

    def _problem(self, facts: FeatureFacts) -> InputError | None:
        if not self._types:
            return None
        try:
            check_types(facts, self._types)
        except InputError as error:
            return error
        return None


_FEATURE_LISTS = (2, 2)  # SequenceExample's field 2, length-delimited


def _not_an_example(foreign: Sequence[tuple[int, int]]) -> InputError:
    if tuple(foreign) == (_FEATURE_LISTS,):
        what = "a tf.train.SequenceExample (it has feature_lists), not a tf.train.Example"
    else:
        numbers = ", ".join(sorted({str(number) for number, _ in foreign}, key=int))
        what = (
            f"not a tf.train.Example: it holds fields an Example does not have (numbered "
            f"{numbers}), which would be lost"
        )
    return InputError("NotAnExample", f"the record is {what}")


def check_types(facts: FeatureFacts, types: Mapping[str, FeatureType]) -> None:
    """Raise InputError when a record's features disagree with the feature schema."""
    for key, dtype, count in facts:
        rule = types.get(key)
        if rule is None:
            continue
        if dtype is not None and dtype != rule.dtype:
            raise InputError(
                "FeatureTypeMismatch",
                f"feature {key!r} holds {dtype} values; the feature schema says {rule.dtype}",
            )
        expected = rule.fixed_count
        if expected is not None and count != expected:
            raise InputError(
                "FeatureShapeMismatch",
                f"feature {key!r} holds {count} value{'s' if count != 1 else ''}; the feature "
                f"schema's shape {list(rule.shape)} needs exactly {expected}",
            )


# The message types whose instances WriteDataset serializes: TensorFlow's tf.train.Example, and
# recordforge's own copy of it (schemas/recordforge_example.proto), the same on the wire.
_EXAMPLE_TYPES = ("tensorflow.Example", codec.Example.DESCRIPTOR.full_name)


def serialized_element(element, types: Mapping[str, FeatureType] | None = None):
    """(split or None, serialized Example) of one element of WriteDataset's input.

    An element is serialized tf.train.Example bytes (kept as they are), a tf.train.Example
    (serialized deterministically), a dict of feature values (schemas/values.py; `types` type
    the keys they name), or a (split, one of those) pair.

    Raises:
        InputError: an element of another kind, a split name that cannot name files, or a dict
            whose values no feature can hold.
    """
    split = None
    if isinstance(element, tuple):
        if len(element) != 2 or not isinstance(element[0], str):
            raise InputError(
                "UnusableElement",
                f"a tuple of {len(element)} items is not a (split, record) pair",
            )
        split, element = element
        if not is_valid_split_name(split):
            raise InputError(
                "BadSplitName",
                f"split {split[:40]!r} cannot name shard files (letters, digits, '_', '-')",
            )
    if isinstance(element, (bytes, bytearray, memoryview)):
        return split, bytes(element)
    if isinstance(element, Mapping):
        dtypes = {key: rule.dtype for key, rule in (types or {}).items()}
        try:
            return split, codec.serialize(example_from_values(element, dtypes))
        except UnusableValue as error:
            raise InputError("UnusableValue", str(error)) from None
    descriptor = getattr(element, "DESCRIPTOR", None)
    if getattr(descriptor, "full_name", None) in _EXAMPLE_TYPES:
        return split, element.SerializeToString(deterministic=True)
    raise InputError(
        "UnusableElement",
        f"a {type(element).__name__}: WriteDataset takes serialized tf.train.Example bytes, "
        "tf.train.Example objects, dicts of feature values, or (split, record) pairs of them",
    )
