"""The Example codec and the spliced encoder on the inputs they refuse or rarely see.

Written for mutation testing (docs/testing.md): error paths and the inspection helper, which
the property tests (valid Examples of every shape) do not reach.
"""

from __future__ import annotations

import pytest

from recordforge.schemas import codec
from recordforge.schemas.spliced import serialize_around, widen_empty_value


def test_an_unknown_dtype_is_refused_with_its_key():
    with pytest.raises(ValueError) as raised:
        codec.build_example({"k": ("int32", [1])})
    assert str(raised.value) == "feature 'k': unknown dtype 'int32'"


def test_to_python_gives_each_feature_its_dtype():
    example = codec.build_example(
        {"b": ("bytes", [b"x", b""]), "f": ("float", [0.5]), "i": ("int64", [-3, 4])}
    )
    example.features.feature["none"].Clear()  # a Feature with no list set
    assert codec.to_python(example) == {
        "b": ("bytes", [b"x", b""]),
        "f": ("float", [0.5]),
        "i": ("int64", [-3, 4]),
        "none": ("bytes", []),
    }


def test_an_example_without_features_is_left_without_them():
    empty = codec.Example()
    skeleton, offset = serialize_around(empty, "image/encoded", 3)
    expected = codec.serialize(codec.build_example({"image/encoded": ("bytes", [b"abc"])}))
    assert skeleton[:offset] + b"abc" + skeleton[offset:] == expected
    assert not empty.HasField("features") and codec.serialize(empty) == b""


def _with_empty(key: str, **others) -> bytes:
    return codec.serialize(codec.build_example({key: ("bytes", [b""]), **others}))


@pytest.mark.parametrize(
    ("serialized", "message"),
    [
        (b"", "not a serialized Example with only its `features` field"),
        (b"\x12\x00", "not a serialized Example with only its `features` field"),
        (_with_empty("k") + b"\x00", "not a serialized Example with only its `features` field"),
        (_with_empty("other"), "no entry for b'k'"),
        (
            codec.serialize(codec.build_example({"k": ("bytes", [b"x"])})),
            "the Example's 'k' is not a single empty bytes value",
        ),
        (
            codec.serialize(codec.build_example({"k": ("bytes", [b"", b""])})),
            "the Example's 'k' is not a single empty bytes value",
        ),
    ],
)
def test_widening_refuses_what_is_not_a_stand_in(serialized, message):
    with pytest.raises(ValueError) as raised:
        widen_empty_value(serialized, "k", 5)
    assert str(raised.value) == message


def test_widening_finds_the_stand_in_among_other_entries():
    serialized = _with_empty("k", a=("int64", [1]), z=("bytes", [b"z" * 200]))
    skeleton, offset = widen_empty_value(serialized, "k", 300)
    expected = codec.build_example(
        {"k": ("bytes", [b"p" * 300]), "a": ("int64", [1]), "z": ("bytes", [b"z" * 200])}
    )
    assert skeleton[:offset] + b"p" * 300 + skeleton[offset:] == codec.serialize(expected)
