"""Feature specs derived from what was written, and the manifest with its commit-time checks."""

from __future__ import annotations

import json

import pytest

from recordforge.schemas.features import DeclaredFeature, FeatureSpec, FeatureTally, derive_specs
from recordforge.schemas.manifest import Manifest
from recordforge.transforms.core.planning.assemble import (
    assemble_manifest,
    error_rate_message,
    summarize_errors,
)
from recordforge.transforms.core.planning.labels import LabelMap
from recordforge.transforms.core.planning.sharding import ShardingConfig, SplitStats, layout_split
from recordforge.transforms.core.records import ErrorFileResult, InputCounts, ShardResult

DECLARED = (
    DeclaredFeature("age", "int64"),
    DeclaredFeature("tags", "bytes", is_list=True),
    DeclaredFeature("bbox", "float", is_list=True),
    DeclaredFeature("note", "bytes"),
    DeclaredFeature("label", "int64", listed_when_absent=False),
    DeclaredFeature("never", "bytes"),
)


def tally_of(records):
    tally = FeatureTally()
    for record in records:
        tally.add(record.items())
    return tally


def test_specs_from_observations():
    records = [
        {"age": 1, "tags": 2, "bbox": 4, "note": 1},
        {"age": 1, "tags": 0, "bbox": 4},
        {"age": 1, "tags": 5, "bbox": 4},
    ]
    specs = derive_specs(DECLARED, tally_of(records))
    assert specs["age"] == FeatureSpec("int64", (), False)
    assert specs["tags"] == FeatureSpec("bytes", (-1,), False)  # present, varying length
    assert specs["bbox"] == FeatureSpec("float", (4,), False)  # always 4 values
    assert specs["note"] == FeatureSpec("bytes", (-1,), True)  # sometimes missing
    assert specs["never"] == FeatureSpec("bytes", (-1,), True)  # a CSV column with no values
    assert "label" not in specs  # labels appear only when some record has one


def test_tallies_merge_like_one():
    records = [{"age": 1, "tags": n} for n in range(6)] + [{"tags": 9}]
    whole = tally_of(records)
    halves = tally_of(records[:3]).merge(tally_of(records[3:]))
    assert derive_specs(DECLARED, whole) == derive_specs(DECLARED, halves)
    assert halves.num_records == 7


SMALL_SHARDS = ShardingConfig(min_shard_bytes=100)


def _layouts(split_sizes, config=SMALL_SHARDS):
    return {
        split: layout_split([(0, SplitStats(len(sizes), sum(sizes), max(sizes)))], config)
        for split, sizes in split_sizes.items()
    }


def _assemble(shards, counts, errors=(), layouts=None):
    layouts = layouts or _layouts({"train": [100] * 4, "test": [100] * 2})
    return assemble_manifest(
        shards=shards,
        errors=summarize_errors(errors),
        layouts=layouts,
        labels=LabelMap(("cat", "dog"), frozenset({0})),
        tally=tally_of([{"age": 1}] * 6),
        counts=counts,
        declared=DECLARED[:1],
        configured_splits=("train", "test"),
        name="ds",
        tool_version="9.9",
        created="2026-01-01T00:00:00+00:00",
        compression="none",
        options={"a": 1},
        source={"inputs": ["x"]},
        plan_config={"num_hosts": 1},
    )


def _shards():
    return [
        ShardResult("train", 0, 4, "ds-train.tfrecord-00000-of-00004", 1, 100),
        ShardResult("train", 1, 4, "ds-train.tfrecord-00001-of-00004", 1, 100),
        ShardResult("train", 2, 4, "ds-train.tfrecord-00002-of-00004", 1, 100),
        ShardResult("train", 3, 4, "ds-train.tfrecord-00003-of-00004", 1, 100),
        ShardResult("test", 0, 2, "ds-test.tfrecord-00000-of-00002", 1, 100),
        ShardResult("test", 1, 2, "ds-test.tfrecord-00001-of-00002", 1, 100),
    ]


def test_manifest_layout_and_round_trip():
    errors = [ErrorFileResult("errors/probe.jsonl", "probe", 2, (("TruncatedImage", 2),))]
    manifest = _assemble(_shards(), InputCounts(8, 2), errors)
    data = json.loads(manifest.to_json())
    assert list(data["splits"]) == ["train", "test"]  # configured order
    assert data["splits"]["train"]["num_records"] == 4
    assert data["splits"]["train"]["shards"][0] == {
        "file": "ds-train.tfrecord-00000-of-00004",
        "num_records": 1,
        "num_bytes": 100,
    }
    assert data["features"]["age"] == {"dtype": "int64", "shape": [], "optional": False}
    assert data["labels"] == ["cat", "dog"]
    assert data["errors"] == {
        "count": 2,
        "files": ["errors/probe.jsonl"],
        "by_stage": {"probe": 2},
        "by_kind": {"TruncatedImage": 2},
    }
    assert data["num_inputs"] == 8 and data["tool"]["version"] == "9.9"
    assert data["plan"]["splits"]["train"]["num_shards"] == 4
    assert Manifest.from_json(manifest.to_json()).to_json() == manifest.to_json()


def test_missing_shard_refuses_commit():
    with pytest.raises(RuntimeError, match=r"shards \[2\] were not written"):
        _assemble([s for s in _shards() if s.index != 2 or s.split != "train"], InputCounts(6, 0))


def test_duplicate_shard_refuses_commit():
    with pytest.raises(RuntimeError, match="reported twice"):
        _assemble(_shards() + _shards()[:1], InputCounts(6, 0))


def test_counts_that_do_not_add_up_refuse_commit():
    with pytest.raises(RuntimeError, match="counts do not add up"):
        _assemble(_shards(), InputCounts(7, 0))


def test_error_rate_message():
    assert error_rate_message(1, 10, 0.1, "out/errors") is None
    message = error_rate_message(2, 10, 0.1, "out/errors")
    assert "2 of 10 inputs failed (20.0%)" in message and "out/errors" in message
    assert error_rate_message(1, 10, 0.0, "e") is not None
    assert error_rate_message(3, 10, None, "e") is None
    assert "all 4 inputs failed" in error_rate_message(4, 4, None, "e")
