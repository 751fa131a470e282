"""Python values as Example features: the typing rules for records given as dicts.

WriteDataset accepts records as {key: value} dicts, as a user's pipeline makes them. A value is
a scalar or a flat sequence (list, tuple, 1-D numpy array) of one kind: integers (bool, numpy
integers) become int64, floats (numpy floats) float, bytes and str (UTF-8) bytes; integers
among floats make a float list. None leaves the key out. A dtype declared for the key decides
instead, where the values allow it (integers into a float feature).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

from recordforge.schemas import codec

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT32_MAX = 3.4028234663852886e38


class UnusableValue(ValueError):
    """A dict record holds a value that no Example feature can hold as given."""


def example_from_values(values: Mapping, dtypes: Mapping[str, str] | None = None) -> codec.Example:
    """The Example of a dict record; `dtypes` ({key: dtype}) types the keys it names.

    Raises:
        UnusableValue: a key that is not text, a value of another kind (a dict, an object, a
            2-D array), a list mixing numbers and text, an integer beyond int64, a finite float
            beyond float32, or a value its declared dtype cannot hold.
    """
    dtypes = dtypes or {}
    example = codec.Example()
    feature_map = example.features.feature
    for key, value in values.items():
        if not isinstance(key, str):
            raise UnusableValue(f"feature keys are text; {key!r} is a {type(key).__name__}")
        if value is None:
            continue
        items = _items(key, value)
        dtype = _dtype(key, items, dtypes.get(key))
        if dtype is None:  # an empty list of no declared type: an empty Feature, of any type
            feature_map[key].SetInParent()
            continue
        codec.add_features(example, {key: (dtype, _converted(key, items, dtype))})
    return example


def _items(key: str, value) -> list:
    if isinstance(value, (str, bytes, bytearray, memoryview)) or _is_scalar(value):
        return [value]
    ndim = getattr(value, "ndim", None)
    if ndim is not None and ndim != 1:
        if ndim == 0:
            return [value.item()]
        raise UnusableValue(
            f"feature {key!r}: a {ndim}-D array; features are flat lists (reshape it to 1-D "
            "and keep its shape in another feature)"
        )
    if not isinstance(value, Sequence) and ndim is None:
        raise UnusableValue(
            f"feature {key!r}: a {type(value).__name__} is not a number, text, bytes or a "
            "list of them"
        )
    items = list(value.tolist() if ndim is not None else value)
    for item in items:
        if not (isinstance(item, (str, bytes, bytearray, memoryview)) or _is_scalar(item)):
            raise UnusableValue(
                f"feature {key!r}: a list holding a {type(item).__name__}; lists hold numbers, "
                "text or bytes"
            )
    return items


def _is_scalar(value) -> bool:
    return isinstance(value, numbers.Real)


def _dtype(key: str, items: list, declared: str | None) -> str | None:
    kinds = {_kind(item) for item in items}
    if declared is not None:
        allowed = {"int64": {"int64"}, "float": {"int64", "float"}, "bytes": {"bytes"}}[declared]
        if not kinds <= allowed:
            found = "text or bytes" if "bytes" in kinds else "a float" if "float" in kinds else ""
            raise UnusableValue(f"feature {key!r} is declared {declared}; it holds {found}")
        return declared
    if not kinds:
        return None
    if "bytes" in kinds and len(kinds) > 1:
        raise UnusableValue(f"feature {key!r}: a list mixing numbers and text")
    return "float" if "float" in kinds else kinds.pop()


def _kind(item) -> str:
    if isinstance(item, (str, bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(item, numbers.Integral):  # bool and numpy integers too
        return "int64"
    return "float"


def _converted(key: str, items: list, dtype: str) -> list:
    if dtype == "bytes":
        return [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in items]
    if dtype == "int64":
        converted = [int(item) for item in items]
        if any(not _INT64_MIN <= item <= _INT64_MAX for item in converted):
            raise UnusableValue(f"feature {key!r}: an integer beyond the int64 range")
        return converted
    converted = [float(item) for item in items]
    if any(math.isfinite(item) and abs(item) > _FLOAT32_MAX for item in converted):
        raise UnusableValue(f"feature {key!r}: a float beyond the float32 range")
    return converted
