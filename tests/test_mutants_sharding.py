"""The planner's records, bucket arithmetic and layouts crossing a pickle, checked field by field.

Written for mutation testing (docs/testing.md): what the manifest and the workers receive
(`to_dict`, a pickled layout) and the fine bucket's bits, where a wrong value went unnoticed.
"""

from __future__ import annotations

import pickle
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest

from recordforge.transforms.core.planning import placement
from recordforge.transforms.core.planning.keys import order_key
from recordforge.transforms.core.planning.placement import (
    FineTotals,
    WholeShardTable,
    bucket_totals,
    build_layouts,
    fine_totals,
)
from recordforge.transforms.core.planning.sharding import (
    FINE_PER_BUCKET,
    MIB,
    NUM_BUCKETS,
    ShardingConfig,
    SplitStats,
    assign_all,
    bucket_of,
    buckets_of,
    fine_bucket_of,
    fine_buckets_of,
    human_size,
    layout_from_totals,
    layout_split,
    plan_shards,
)
from recordforge.transforms.core.records import RecordRef, ref_batch


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


# --- The reasons the manifest quotes, written out in full --------------------------------------


def test_a_small_split_for_one_host_gets_no_per_host_note():
    """60 MiB for one host: 6 shards of the 10 MiB minimum, and nothing about hosts."""
    plan = plan_shards(SplitStats(60, 60 * MIB, MIB), ShardingConfig(num_hosts=1))
    assert plan.num_shards == 6
    assert plan.reason == (
        "60.0 MiB is too little for 10 shards (10 per reading host) of at least 10.0 MiB: "
        "6 shards of about 10.0 MiB"
    )


def test_one_shard_is_said_in_the_singular():
    plan = plan_shards(SplitStats(15, 15 * MIB, MIB), ShardingConfig(num_hosts=1))
    assert plan.reason == (
        "15.0 MiB is too little for 10 shards (10 per reading host) of at least 10.0 MiB: "
        "1 shard of about 15.0 MiB"
    )
    forced = plan_shards(SplitStats(15, 15 * MIB, MIB), ShardingConfig(num_shards=1))
    assert forced.reason == "1 shard, as requested"


def test_a_small_split_for_two_hosts_says_how_many_per_host():
    plan = plan_shards(SplitStats(60, 60 * MIB, MIB), ShardingConfig(num_hosts=2))
    assert plan.num_shards == 6
    assert plan.reason == (
        "60.0 MiB is too little for 20 shards (10 per reading host) of at least 10.0 MiB: "
        "6 shards of about 10.0 MiB, 3 per host"
    )


def test_shards_of_exactly_the_ideal_size_are_not_called_below_it():
    config = ShardingConfig(min_shard_bytes=10, ideal_shard_bytes=100, max_shard_bytes=1_000)
    plan = plan_shards(SplitStats(100, 1_000, 10), config)
    assert plan.reason == "10 shards per reading host × 1 host: 10 shards of about 100 B"


def test_shards_below_the_ideal_size_say_so():
    config = ShardingConfig(min_shard_bytes=10, ideal_shard_bytes=100, max_shard_bytes=1_000)
    plan = plan_shards(SplitStats(99, 990, 10), config)
    assert plan.reason == (
        "10 shards per reading host × 1 host: 10 shards of about 99 B (below the 100 B ideal, "
        "but enough files for every host to read in parallel)"
    )


TINY = ShardingConfig(min_shard_bytes=10, ideal_shard_bytes=100, max_shard_bytes=1_000)
TINY_FOR_TWO = ShardingConfig(
    num_hosts=2, min_shard_bytes=10, ideal_shard_bytes=100, max_shard_bytes=1_000
)


@pytest.mark.parametrize(
    ("stats", "config", "reason"),
    [
        (SplitStats(), ShardingConfig(), "the split has no records: no shards"),
        (  # exactly the minimum shard size
            SplitStats(10, 10 * MIB, MIB),
            ShardingConfig(),
            "10.0 MiB in all is no more than the 10.0 MiB minimum shard size: one shard",
        ),
        (  # exactly 10 shards of the minimum size
            SplitStats(10, 100, 10),
            TINY,
            "10 shards per reading host × 1 host: 10 shards of about 10 B (below the 100 B "
            "ideal, but enough files for every host to read in parallel)",
        ),
        (  # exactly 10 shards of the maximum size
            SplitStats(100, 10_000, 100),
            TINY,
            "10 shards per reading host × 1 host: 10 shards of about 1000 B",
        ),
        (
            SplitStats(20, 2_000, 100),
            TINY_FOR_TWO,
            "10 shards per reading host × 2 hosts: 20 shards of about 100 B",
        ),
        (  # a little more than 10 shards of the maximum size: 11
            SplitStats(106, 10_600, 100),
            TINY,
            "10.4 KiB in 10 shards (10 per reading host) would make each larger than 1000 B: "
            "11 shards of about 963 B",
        ),
        (
            SplitStats(212, 21_200, 100),
            TINY_FOR_TWO,
            "20.7 KiB in 20 shards (10 per reading host) would make each larger than 1000 B: "
            "22 shards of about 963 B, 11 per host",
        ),
        (  # 48 shards for 8 hosts, but one record is larger than any but one shard
            SplitStats(5, 500 * MIB, 300 * MIB),
            ShardingConfig(num_hosts=8),
            "500.0 MiB is too little for 80 shards (10 per reading host) of at least 10.0 MiB: "
            "48 shards of about 10.4 MiB, 6 per host; reduced to 1: the largest record "
            "(300.0 MiB) must fit in the mean shard size, so that no shard is empty",
        ),
    ],
)
def test_the_reason_in_full(stats, config, reason):
    assert plan_shards(stats, config).reason == reason


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (1024 * 1024 - 1, "1024.0 KiB"),
        (1024**2, "1.0 MiB"),
        (3 * 1024**2, "3.0 MiB"),
        (1024**3, "1.0 GiB"),
        (2.5 * 1024**3, "2.5 GiB"),
        (1024**4, "1.0 TiB"),
        (3 * 1024**4, "3.0 TiB"),
        (5000 * 1024**4, "5000.0 TiB"),
    ],
)
def test_human_sizes(num_bytes, text):
    assert human_size(num_bytes) == text


# --- Buckets of a column of order keys -----------------------------------------------------------


def test_buckets_of_a_column_are_the_leading_bits_of_each_key():
    keys = [order_key("column", f"k{i}") for i in range(3_000)]
    keys += [b"\xff\xff\xff" + bytes(13), bytes(16), b"\x80\x01\xf0" + bytes(13)]
    column = pa.array(keys, pa.binary())
    expected_buckets = [int.from_bytes(key[:2], "big") for key in keys]
    expected_fine = [int.from_bytes(key[:3], "big") >> 4 for key in keys]
    for got, expected in (
        (buckets_of(column), expected_buckets),
        (fine_buckets_of(column), expected_fine),
    ):
        assert got.dtype == np.int64
        assert got.tolist() == expected
    # A slice of a column (an offset into its buffers) reads its own keys.
    assert buckets_of(column.slice(1_000, 7)).tolist() == expected_buckets[1_000:1_007]
    assert fine_buckets_of(column.slice(2_998, 3)).tolist() == expected_fine[2_998:3_001]


def test_an_empty_column_has_no_buckets():
    for leading_bits in (buckets_of, fine_buckets_of):
        got = leading_bits(pa.array([], pa.binary()))
        assert got.dtype == np.int64 and got.shape == (0,)


# --- Layouts ------------------------------------------------------------------------------------


def test_one_byte_records_each_fill_their_own_shard():
    """Four 1-byte records in buckets 0..3 and four shards: record k starts at byte k, the first
    byte of shard k, so bucket k lies whole in shard k."""
    layout = layout_from_totals(_totals({k: [1] for k in range(4)}), ShardingConfig(num_shards=4))
    assert [layout.whole_shard(k) for k in range(4)] == [0, 1, 2, 3]
    assert layout.whole_shards()[:4].tolist() == [0, 1, 2, 3]
    assert assign_all([1, 1, 1, 1], 4) == [0, 1, 2, 3]
    assert assign_all([1, 1, 1, 1], 2) == [0, 0, 1, 1]


def test_empty_buckets_and_fine_buckets_lie_in_no_shard():
    """Buckets 1, 2 and 5 hold nothing; bucket 3 (bytes 10 to 30 of 40, shards of 20) is cut
    at byte 20; its fine buckets 0 and 2 hold nothing."""
    layout = layout_from_totals(_totals({0: [10], 3: [20], 4: [10]}), ShardingConfig(num_shards=2))
    assert layout.whole_shards()[:6].tolist() == [0, -1, -1, -1, 1, -1]
    assert (layout.whole_shards()[6:] == -1).all()
    assert layout.cut().tolist() == [3]
    fine = np.zeros((1, FINE_PER_BUCKET), dtype=np.int64)
    fine[0, 1], fine[0, 3] = 10, 10  # bytes 10-20 (shard 0) and 20-30 (shard 1)
    refined = layout.refine(fine)
    assert refined.fine_whole_shards()[0, :5].tolist() == [-1, 0, -1, 1, -1]


def test_fine_start_is_only_known_for_cut_buckets_of_a_refined_layout():
    layout = layout_from_totals(_totals({0: [10], 3: [20], 4: [10]}), ShardingConfig(num_shards=2))
    with pytest.raises(
        ValueError, match="^the layout is not refined: its cut buckets have no fine totals$"
    ):
        layout.fine_start(3 << 4)
    fine = np.zeros((1, FINE_PER_BUCKET), dtype=np.int64)
    fine[0, 1], fine[0, 3] = 10, 10
    refined = layout.refine(fine)
    assert [refined.fine_start(3 << 4 | k) for k in range(5)] == [10, 10, 20, 20, 30]
    for bucket in (0, 2, 4, 9):  # before, between and after the one cut bucket
        with pytest.raises(KeyError, match=f"bucket {bucket} is not a cut bucket"):
            refined.fine_start(bucket << 4 | 1)


def test_bucket_positions_are_exact_past_float_precision():
    """Positions are int64: at 2^53 bytes a float could no longer tell byte 2^53 + 1 apart."""
    big = 1 << 53
    layout = layout_split(
        [(0, SplitStats(1, big, big)), (1, SplitStats(1, 1, 1)), (2, SplitStats(1, 1, 1))],
        ShardingConfig(num_shards=1),
    )
    assert layout.bucket_starts.dtype == np.int64 and layout.bucket_ends.dtype == np.int64
    assert int(layout.bucket_starts[2]) == big + 1
    assert int(layout.bucket_ends[2]) == big + 2
    assert layout.plan.stats == SplitStats(3, big + 2, big)


def test_buckets_meeting_shard_boundaries_past_int64_products():
    """T·n = 2^63 (computed with Python integers): buckets of 2^61, 1 and 2^61 - 1 bytes in two
    shards of 2^61. The first ends on the boundary, the second's only byte is the second
    shard's first, the third fills the rest of it; no bucket is cut."""
    half = 1 << 61
    totals = _totals({0: [half], 1: [1], 2: [half - 1]})
    layout = layout_from_totals(totals, ShardingConfig(num_shards=2))
    assert layout.plan.num_shards == 2 and layout.plan.stats.total_bytes == 2 * half
    assert layout.whole_shards()[:4].tolist() == [0, 1, 1, -1]
    assert [layout.whole_shard(k) for k in range(3)] == [0, 1, 1]
    assert layout.cut().tolist() == []


def test_records_in_the_last_bucket_count_towards_the_total():
    layout = layout_from_totals(_totals({NUM_BUCKETS - 1: [30, 40]}), ShardingConfig())
    assert layout.plan.stats == SplitStats(2, 70, 40)
    assert int(layout.bucket_starts[-1]) == 0 and int(layout.bucket_ends[-1]) == 70


# --- Placement: the fine totals' accumulator and the whole-shard table ----------------------------

DENSE_SLOTS = NUM_BUCKETS * FINE_PER_BUCKET


def _dense(entries: dict[int, int]) -> FineTotals:
    """A FineTotals whose one split, "train", is summed densely from the first batch."""
    fine = np.array(sorted(entries), dtype=np.int64)
    sizes = np.array([entries[f] for f in sorted(entries)], dtype=np.int64)
    with mock.patch.object(placement, "_SPARSE_ENTRIES_MAX", 0):
        return FineTotals().add({"train": (fine, sizes)})


def _as_dict(totals: FineTotals, split: str = "train") -> dict[int, int]:
    fine, sizes = totals.sparse()[split]
    assert sizes.dtype == np.int64
    return dict(zip(fine.tolist(), sizes.tolist(), strict=True))


def test_merging_dense_fine_totals_adds_them_split_by_split():
    left = _dense({3: 10, 70_000: 5})
    left.add({"test": (np.array([3]), np.array([1]))})  # sparse, another split
    left.merge(_dense({3: 1, 9: 2}))
    assert _as_dict(left) == {3: 11, 9: 2, 70_000: 5}
    assert _as_dict(left, "test") == {3: 1}
    assert set(left.sparse()) == {"train", "test"}
    sparse = FineTotals().add({"train": (np.array([9, 12]), np.array([4, 4]))})
    sparse.merge(_dense({3: 1, 9: 2}))
    assert _as_dict(sparse) == {3: 1, 9: 6, 12: 4}
    assert set(sparse.sparse()) == {"train"}


def test_dense_fine_totals_are_exact_int64_sums():
    """2^53 + 1 bytes in one fine bucket: a float counter would round it to 2^53."""
    totals = _dense({7: 1 << 53})
    totals.add({"train": (np.array([7]), np.array([1]))})
    assert _as_dict(totals) == {7: (1 << 53) + 1}


def test_dense_fine_totals_pickle_sparse_until_half_are_filled():
    few = _dense({k * 1_000: k + 1 for k in range(100)})
    encoded = pickle.dumps(few)
    assert len(encoded) < 20_000  # 100 (fine bucket, bytes) pairs, not 8 MiB of counters
    assert _as_dict(pickle.loads(encoded)) == _as_dict(few)
    # 40% filled: 16 B per filled fine bucket (6.7 MB) is still less than 8 B per counter (8.4 MB).
    filled = np.arange(0, DENSE_SLOTS - 1, 5, dtype=np.int64)
    filled = np.sort(np.concatenate([filled, filled + 1]))
    with mock.patch.object(placement, "_SPARSE_ENTRIES_MAX", 0):
        many = FineTotals().add({"train": (filled, np.ones(len(filled), np.int64))})
    assert 16 * len(filled) < 8 * DENSE_SLOTS
    assert len(pickle.dumps(many)) < 16 * len(filled) + 10_000


def test_dense_fine_totals_unpickled_from_read_only_buffers_can_still_be_added_to():
    """Out-of-band pickle buffers (protocol 5) can come back read-only."""
    full = FineTotals().add({"train": (np.arange(DENSE_SLOTS), np.ones(DENSE_SLOTS, np.int64))})
    buffers: list = []
    encoded = pickle.dumps(full, protocol=5, buffer_callback=buffers.append)
    back = pickle.loads(encoded, buffers=[bytes(b.raw()) for b in buffers])
    back.add({"train": (np.array([5]), np.array([10]))})
    back.merge(_dense({5: 1}))  # `+=` refuses a read-only array (np.add.at does not)
    fine, sizes = back.sparse()["train"]
    assert len(fine) == DENSE_SLOTS and sizes[5] == 12 and sizes.sum() == DENSE_SLOTS + 11


def test_the_whole_shard_table_has_a_row_for_cut_buckets_only():
    layout = layout_from_totals(_totals({0: [10], 3: [20], 4: [10]}), ShardingConfig(num_shards=2))
    fine = np.zeros((1, FINE_PER_BUCKET), dtype=np.int64)
    fine[0, 1], fine[0, 3] = 10, 10
    table = WholeShardTable.of(layout.refine(fine))
    assert table.cut_rows[3] == 0
    assert (np.delete(table.cut_rows, 3) == -1).all()
    assert table.buckets[:5].tolist() == [0, -1, -1, -1, 1]


def _ref(split: str, order: bytes, size: int) -> RecordRef:
    return RecordRef(split, order, size, b"", None, 0, "img.jpg", None, None, 0)


def test_bucket_totals_are_exact_int64_past_float_precision():
    """Two records of 2^53 and 1 bytes in bucket 0x0102: 2^53 + 1 bytes, which a float
    counter would round to 2^53."""
    refs = [
        _ref("train", b"\x01\x02" + bytes([k]) * 14, size) for k, size in ((1, 1 << 53), (2, 1))
    ]
    counts = bucket_totals(ref_batch(refs))["train"]
    assert counts.dtype == np.int64
    assert counts[:, 0x0102].tolist() == [2, (1 << 53) + 1, 1 << 53]
    assert int(counts.sum()) == 2 + (1 << 53) + 1 + (1 << 53)


def test_every_split_gets_a_layout_configured_or_found():
    """A configured split without records gets an empty layout; a split records name that was
    not configured gets one too."""
    totals = {"extra": _totals({5: [100, 200]})}
    layouts = build_layouts(totals, ShardingConfig(), ["train", "test"])
    assert sorted(layouts) == ["extra", "test", "train"]
    for split in ("train", "test"):
        assert layouts[split].plan.num_shards == 0
        assert layouts[split].bucket_starts.dtype == np.int64
        assert layouts[split].bucket_ends.dtype == np.int64
        assert not layouts[split].bucket_ends.any()
    assert layouts["extra"].plan.stats == SplitStats(2, 300, 200)


def test_sparse_fine_totals_of_buckets_are_exact_int64():
    totals = FineTotals().add({"train": (np.array([0x12 << 4 | 3]), np.array([1 << 53]))})
    totals.add({"train": (np.array([0x12 << 4 | 3, 0x40 << 4]), np.array([1, 9]))})
    found = totals.of_buckets("train", np.array([0x12, 0x30, 0x40]))
    assert found.dtype == np.int64 and found.shape == (3, FINE_PER_BUCKET)
    expected = np.zeros((3, FINE_PER_BUCKET), dtype=np.int64)
    expected[0, 3], expected[2, 0] = (1 << 53) + 1, 9
    assert found.tolist() == expected.tolist()


def test_sparse_fine_totals_sum_pieces_that_are_not_yet_summed():
    """Pieces passed in unsorted or with a fine bucket twice are summed before use."""
    for fine, sizes, expected in (
        ([17, 17], [20, 30], {17: 50}),
        ([9, 4], [1, 2], {4: 2, 9: 1}),
        ([3, 9, 5], [1, 2, 3], {3: 1, 5: 3, 9: 2}),
        ([3, 9, 9, 12], [1, 2, 3, 4], {3: 1, 9: 5, 12: 4}),
    ):
        totals = FineTotals().add({"train": (np.array(fine), np.array(sizes))})
        assert _as_dict(totals) == expected
        found, summed = totals.sparse()["train"]
        assert found.tolist() == sorted(expected)


def test_fine_totals_of_a_split_without_records_are_zero():
    never = FineTotals().of_buckets("train", np.array([1, 2]))
    assert never.dtype == np.int64 and never.tolist() == [[0] * FINE_PER_BUCKET] * 2
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    totals = FineTotals().add({"train": empty}).add({"train": empty})
    assert totals.of_buckets("train", np.array([1])).tolist() == [[0] * FINE_PER_BUCKET]
    fine, sizes = totals.sparse()["train"]
    assert fine.dtype == np.int64 and sizes.dtype == np.int64 and len(fine) == len(sizes) == 0


def test_fine_totals_of_a_batch_are_exact_int64():
    refs = [_ref("train", b"\x01\x02\x30" + bytes(13), 1 << 53), _ref("train", b"\x01\x02\x3f", 1)]
    fine, sizes = fine_totals(ref_batch(refs))["train"]
    assert sizes.dtype == np.int64
    assert fine.tolist() == [0x01023] and sizes.tolist() == [(1 << 53) + 1]


def test_one_add_reaches_every_split_after_a_dense_one():
    totals = _dense({3: 10})
    totals.add({"train": (np.array([3]), np.array([1])), "test": (np.array([4]), np.array([2]))})
    assert _as_dict(totals) == {3: 11}
    assert _as_dict(totals, "test") == {4: 2}
