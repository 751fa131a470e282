"""Preflight helpers: split parsing, names and paths, checked before any pipeline exists."""

from __future__ import annotations

import pytest

from recordforge.pipelines.preflight import default_name, normalize_path, parse_splits
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.planning.keys import SplitChooser


def test_parse_splits_keeps_what_was_typed():
    assert parse_splits("train=0.8,validation=0.1,test=0.1") == (
        ("train", 0.8),
        ("validation", 0.1),
        ("test", 0.1),
    )


def test_parse_splits_absorbs_rounding_the_chooser_would_reject():
    splits = parse_splits("a=0.33,b=0.33,c=0.3400001")
    SplitChooser(splits, salt="s")  # would raise if the fractions did not sum to 1
    assert [name for name, _ in splits] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "text", ["train=0.5,test=0.4", "train", "train=x", "a.b=1", "a=0.5,a=0.5", "a=0,b=1"]
)
def test_parse_splits_rejects(text):
    with pytest.raises(UsageError):
        parse_splits(text)


def test_default_name_and_paths(tmp_path):
    assert default_name("/data/out") == "out"
    assert default_name("/data/my data (v2)/") == "my-data-v2"
    assert default_name("gs://bucket/sets/pets") == "pets"
    assert normalize_path("gs://bucket/x/") == "gs://bucket/x"
    assert normalize_path("rel/dir") == str(tmp_path.cwd() / "rel" / "dir")
