"""verify's checks (transforms/core/verify.py) where a broken check went unnoticed.

Written for mutation testing (docs/testing.md): each test fails if the check it names is
weakened (a comparison turned one-sided, a condition dropped).
"""

from __future__ import annotations

import io

from conftest import make_image

from recordforge.schemas import codec
from recordforge.schemas.features import FeatureSpec
from recordforge.schemas.manifest import ShardInfo
from recordforge.transforms.core.tfrecord import frame_record
from recordforge.transforms.core.verify import ExampleChecker, ShardVerifier

SPEC = {
    "id": FeatureSpec("int64", (), False),
    "name": FeatureSpec("bytes", (), False),
    "tags": FeatureSpec("bytes", (-1,), True),
}
SHARD = "ds-train.tfrecord-00000-of-00001"
INDEX = SHARD + ".idx"


def record(**features) -> bytes:
    values = {"id": ("int64", [1]), "name": ("bytes", [b"a"]), "tags": ("bytes", [b"x"])}
    for key, value in features.items():
        key = key.replace("__", "/")
        if value is None:
            values.pop(key)
        else:
            values[key] = value
    return codec.serialize(codec.build_example(values))


def verify(records, *, listed, spec=SPEC, index=None, deep=False):
    """(check, record, offset, message) of each finding for `records` framed as one shard."""
    stream = io.BytesIO(b"".join(frame_record(r) for r in records))
    verifier = ShardVerifier(ShardInfo(SHARD, listed, 0), ExampleChecker(spec), deep=deep)
    findings = verifier.findings(stream, index, INDEX if index is not None else None)
    return [(f.check, f.record, f.offset, f.message) for f in findings]


def test_a_shard_with_more_records_than_listed():
    assert verify([record()] * 3, listed=2) == [
        ("record_count", None, None, "the shard holds 3 records; the manifest lists 2")
    ]
    assert verify([record()] * 3, listed=3) == []


def test_a_missing_optional_feature_is_no_problem_beside_another():
    """A record that fails the quick test is examined feature by feature: an optional feature
    it lacks is still not reported."""
    assert verify([record(tags=None, id=("bytes", [b"1"]))], listed=1) == [
        (
            "wrong_dtype",
            0,
            0,
            "feature 'id' holds bytes values; the manifest says int64",
        )
    ]
    assert verify([record(tags=None, extra=("int64", [1]))], listed=1) == [
        ("unknown_feature", 0, 0, "feature 'extra' is not in the manifest")
    ]


def test_an_index_line_must_have_exactly_two_numbers():
    records = [record(), record(name=("bytes", [b"longer"]))]
    first, second = (16 + len(r) for r in records)
    good = [f"0 {first}\n".encode(), f"{first} {second}\n".encode()]
    assert verify(records, listed=2, index=good) == []
    for line in (f"{first} {second} 7\n", f"{first}\n", f"{first} -{second}\n", "\n"):
        found = verify(records, listed=2, index=[good[0], line.encode()])
        text = line.rstrip("\n")
        assert found == [("index", 1, first, f"line 2 is not 'offset length': {text!r}")]


IMAGE_SPEC = {
    "image/encoded": FeatureSpec("bytes", (), False),
    "image/width": FeatureSpec("int64", (), True),
    "image/height": FeatureSpec("int64", (), True),
    "image/format": FeatureSpec("bytes", (), True),
    "image/channels": FeatureSpec("int64", (), True),
}


def image_record(png: bytes, **facts) -> bytes:
    values = {
        "image/encoded": ("bytes", [png]),
        "image/width": ("int64", [30]),
        "image/height": ("int64", [20]),
        "image/format": ("bytes", [b"png"]),
        "image/channels": ("int64", [3]),
    }
    for key, value in facts.items():
        key = "image/" + key
        if value is None:
            values.pop(key)
        else:
            values[key] = value
    return codec.serialize(codec.build_example(values))


def test_deep_compares_only_the_facts_a_record_has(tmp_path):
    png = make_image(tmp_path / "a.png", "PNG", size=(30, 20))
    records = [
        image_record(png, channels=None),  # lacks a fact: nothing to compare
        image_record(png, width=None, height=None, format=None, channels=None),
        image_record(png, channels=None, height=("int64", [21])),
        image_record(png, channels=("int64", [])),  # facts that are not one value: the
        image_record(png, channels=("int64", [1, 1])),  # spec check reports them, not deep
    ]
    found = verify(records, listed=5, spec=IMAGE_SPEC, deep=True)
    offsets = [sum(16 + len(r) for r in records[:i]) for i in range(len(records))]
    assert found == [
        ("image_facts", 2, offsets[2], "image/height is 21 but the image decodes as 20"),
        (
            "wrong_length",
            3,
            offsets[3],
            "feature 'image/channels' has 0 values; its shape [] needs exactly 1",
        ),
        (
            "wrong_length",
            4,
            offsets[4],
            "feature 'image/channels' has 2 values; its shape [] needs exactly 1",
        ),
    ]
