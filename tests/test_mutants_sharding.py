"""The planner's records, bucket arithmetic and layouts crossing a pickle, checked field by field.

Written for mutation testing (docs/testing.md): what the manifest and the workers receive
(`to_dict`, a pickled layout) and the fine bucket's bits, where a wrong value went unnoticed.
"""

from __future__ import annotations

import pickle
from unittest import mock

import numpy as np

from recordforge.transforms.core.planning import placement
from recordforge.transforms.core.planning.keys import order_key
from recordforge.transforms.core.planning.placement import FineTotals
from recordforge.transforms.core.planning.sharding import (
    FINE_PER_BUCKET,
    NUM_BUCKETS,
    ShardingConfig,
    SplitStats,
    bucket_of,
    fine_bucket_of,
    layout_from_totals,
    plan_shards,
)


def test_the_configuration_and_the_plan_as_the_manifest_records_them():
    config = ShardingConfig(
        num_hosts=3, min_shard_bytes=10, ideal_shard_bytes=20, max_shard_bytes=30, num_shards=7
    )
    assert config.to_dict() == {
        "num_hosts": 3,
        "min_shard_bytes": 10,
        "ideal_shard_bytes": 20,
        "max_shard_bytes": 30,
        "num_shards": 7,
    }
    plan = plan_shards(SplitStats(100, 1_000, 15), config)
    assert plan.to_dict() == {
        "num_shards": 7,
        "reason": "7 shards, as requested",
        "num_records": 100,
        "total_bytes": 1_000,
        "max_record_bytes": 15,
    }


def test_split_stats_merge_adds_counts_and_keeps_the_largest_record():
    merged = SplitStats(3, 300, 120).merge(SplitStats(2, 50, 40))
    assert merged == SplitStats(5, 350, 120)
    assert SplitStats(2, 50, 40).merge(SplitStats(3, 300, 120)) == SplitStats(5, 350, 120)


def test_a_fine_bucket_is_the_top_twenty_bits_of_the_order_key():
    for i in range(2_000):
        key = order_key("bits", f"k{i}")
        assert bucket_of(key) == int.from_bytes(key[:3], "big") >> 8
        assert fine_bucket_of(key) == int.from_bytes(key[:3], "big") >> 4


def _totals(sizes_by_bucket: dict[int, list[int]]) -> np.ndarray:
    totals = np.zeros((3, NUM_BUCKETS), dtype=np.int64)
    for bucket, sizes in sizes_by_bucket.items():
        totals[:, bucket] = (len(sizes), sum(sizes), max(sizes))
    return totals


def _same_layout(a, b) -> None:
    assert a.plan == b.plan
    for name in ("bucket_starts", "bucket_ends", "cut_buckets", "fine_starts"):
        left, right = getattr(a, name), getattr(b, name)
        if left is None:
            assert right is None, name
        else:
            assert right.dtype == np.int64 and left.dtype == np.int64, name
            assert np.array_equal(left, right), name


def test_layouts_come_back_from_a_pickle_whole():
    totals = _totals({3: [100] * 10, 9: [50] * 8, 700: [300] * 3})
    coarse = layout_from_totals(totals, ShardingConfig(num_shards=4))
    _same_layout(pickle.loads(pickle.dumps(coarse)), coarse)
    cut = coarse.cut()
    assert len(cut)
    fine = np.zeros((len(cut), FINE_PER_BUCKET), dtype=np.int64)
    fine[:, 5] = coarse.bucket_ends[cut] - coarse.bucket_starts[cut]
    refined = coarse.refine(fine)
    _same_layout(pickle.loads(pickle.dumps(refined)), refined)


def test_a_refined_layout_without_cut_buckets_pickles():
    """One shard: no boundary cuts a bucket, so the refinement holds no fine bounds."""
    coarse = layout_from_totals(_totals({1: [10, 20], 2: [5]}), ShardingConfig(num_shards=1))
    refined = coarse.refine(np.zeros((0, FINE_PER_BUCKET), dtype=np.int64))
    assert len(refined.cut_buckets) == 0
    _same_layout(pickle.loads(pickle.dumps(refined)), refined)


def test_dense_fine_totals_list_their_filled_fine_buckets():
    fine = np.array([5, 17, 17, 1 << 19], dtype=np.int64)
    sizes = np.array([10, 20, 30, 40], dtype=np.int64)
    with mock.patch.object(placement, "_SPARSE_ENTRIES_MAX", 0):  # dense from the first batch
        totals = FineTotals().add({"train": (fine, sizes)})
    found, summed = totals.sparse()["train"]
    assert found.tolist() == [5, 17, 1 << 19]
    assert summed.tolist() == [10, 50, 40]
