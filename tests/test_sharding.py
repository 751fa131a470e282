"""The sharding planner: a table of realistic sizes, and properties of plans and assignment."""

from __future__ import annotations

import math
import pickle
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.transforms.core.planning import placement
from recordforge.transforms.core.planning.keys import order_key
from recordforge.transforms.core.planning.placement import (
    FineTotals,
    bucket_totals,
    build_layouts,
    fine_totals,
    merge_plan_totals,
    merge_totals,
    place_batch,
    place_cut_bucket,
    plan_layouts,
    plan_totals,
    refine_layouts,
    whole_shards_of,
)
from recordforge.transforms.core.planning.sharding import (
    FINE_BITS,
    FINE_PER_BUCKET,
    MIB,
    NUM_BUCKETS,
    ShardingConfig,
    SplitStats,
    assign_all,
    assign_from,
    bucket_of,
    fine_bucket_of,
    layout_from_totals,
    layout_split,
    plan_shards,
)
from recordforge.transforms.core.records import RecordRef, concat_batches, piece_rows, ref_batch

GIB, TIB = 1 << 30, 1 << 40
IMAGE = 110_000  # a typical JPEG record, in bytes


def stats_for(total: int, record: int = IMAGE) -> SplitStats:
    return SplitStats(
        num_records=max(1, total // record), total_bytes=total, max_record_bytes=record
    )


# (total bytes, reading hosts) -> expected shard count (docs/design.md, "The sharding planner").
PLAN_TABLE = [
    # 10 MiB: no more than one minimum-size shard, whatever the hosts.
    (10 * MIB, 1, 1),
    (10 * MIB, 8, 1),
    (10 * MIB, 64, 1),
    # 1 GiB: 10 shards of ~100 MiB for one host; 80 of ~13 MiB for 8 hosts (still >= 10 MiB);
    # for 64 hosts 640 shards would be < 10 MiB, so 102 shards rounded down to 64 (one per host).
    (GIB, 1, 10),
    (GIB, 8, 80),
    (GIB, 64, 64),
    # ImageNet-sized 140 GiB: shards near 200 MiB, more than 10 per host, a multiple of N.
    (140 * GIB, 1, 717),
    (140 * GIB, 8, 720),
    (140 * GIB, 64, 768),
    # 2 TiB.
    (2 * TIB, 1, 10486),
    (2 * TIB, 8, 10488),
    (2 * TIB, 64, 10496),
]


@pytest.mark.parametrize(("total", "hosts", "expected"), PLAN_TABLE)
def test_plan_table(total, hosts, expected):
    config = ShardingConfig(num_hosts=hosts)
    plan = plan_shards(stats_for(total), config)
    assert plan.num_shards == expected, plan.reason
    mean = plan.mean_shard_bytes
    if total > config.min_shard_bytes:
        assert mean >= config.min_shard_bytes, plan.reason
    assert mean <= config.max_shard_bytes, plan.reason
    if expected >= hosts:
        assert expected % hosts == 0, plan.reason
    assert plan.reason and str(expected) in plan.reason


def test_reasons_say_why():
    assert "one shard" in plan_shards(stats_for(5 * MIB), ShardingConfig()).reason
    assert "10 per reading host" in plan_shards(stats_for(GIB), ShardingConfig(num_hosts=64)).reason
    big = plan_shards(stats_for(140 * GIB), ShardingConfig(num_hosts=8)).reason
    assert "200.0 MiB" in big and "90 per host" in big


def test_forced_count_is_used_and_capped_by_records():
    assert plan_shards(stats_for(GIB), ShardingConfig(num_shards=3)).num_shards == 3
    plan = plan_shards(SplitStats(5, 5 * MIB, MIB), ShardingConfig(num_shards=100))
    assert plan.num_shards == 5
    assert "only 5 records" in plan.reason


def test_one_huge_record_caps_the_count():
    plan = plan_shards(SplitStats(5, 500 * MIB, 300 * MIB), ShardingConfig(num_hosts=8))
    assert plan.num_shards == 1
    assert "largest record" in plan.reason


def test_empty_split_gets_no_shards():
    assert plan_shards(SplitStats(), ShardingConfig()).num_shards == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_hosts": 0}, "the number of hosts must be at least 1, got 0"),
        ({"min_shard_bytes": 0}, "the minimum shard size must be positive"),
        (  # above the default maximum
            {"min_shard_bytes": 300 * MIB},
            r"the minimum shard size \(300.0 MiB\) exceeds the maximum \(200.0 MiB\)",
        ),
        ({"num_shards": 0}, "the number of shards must be at least 1, got 0"),
    ],
)
def test_nonsense_thresholds_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        ShardingConfig(**kwargs)


sizes_lists = st.lists(st.integers(min_value=17, max_value=5_000_000), min_size=1, max_size=400)
configs = st.builds(
    ShardingConfig,
    num_hosts=st.integers(1, 64),
    min_shard_bytes=st.integers(1, 20 * MIB),
    max_shard_bytes=st.just(400 * MIB),
    num_shards=st.one_of(st.none(), st.integers(1, 500)),
)


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_lists, config=configs)
def test_plan_invariants(sizes, config):
    stats = SplitStats(len(sizes), sum(sizes), max(sizes))
    plan = plan_shards(stats, config)
    assert 1 <= plan.num_shards <= len(sizes)
    # The largest record fits in the mean shard: the precondition for no empty shard.
    assert max(sizes) * plan.num_shards <= sum(sizes)
    if config.num_shards is None and plan.num_shards > 1:
        assert plan.mean_shard_bytes >= config.min_shard_bytes
    assert plan_shards(stats, config) == plan  # a pure function


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_lists, config=configs)
def test_assignment_is_balanced_contiguous_and_never_empty(sizes, config):
    plan = plan_shards(SplitStats(len(sizes), sum(sizes), max(sizes)), config)
    shards = assign_all(sizes, plan.num_shards)
    assert shards == sorted(shards), "each shard is a contiguous run in order-key order"
    assert set(shards) == set(range(plan.num_shards)), "no shard is empty"
    per_shard = [0] * plan.num_shards
    for shard, size in zip(shards, sizes, strict=True):
        per_shard[shard] += size
    mean = sum(sizes) / plan.num_shards
    # Within 10% of the mean unless a single record is larger than that 10%.
    assert max(per_shard) <= 1.1 * mean or max(sizes) > 0.1 * mean
    assert max(per_shard) <= mean + max(sizes)


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=17, max_value=200_000), min_size=1, max_size=300),
    hosts=st.integers(1, 16),
)
def test_bucketed_assignment_equals_global_assignment(sizes, hosts):
    """Assigning bucket by bucket (as the pipeline does) matches one global pass."""
    orders = [order_key("salt", f"0:img/{i}.jpg") for i in range(len(sizes))]
    ranked = sorted(zip(orders, sizes, strict=True))
    config = ShardingConfig(num_hosts=hosts, min_shard_bytes=50_000)
    buckets: dict[int, list[tuple[bytes, int]]] = {}
    for order, size in ranked:
        buckets.setdefault(bucket_of(order), []).append((order, size))
    layout = layout_split(
        [
            (bucket, SplitStats(len(items), sum(s for _, s in items), max(s for _, s in items)))
            for bucket, items in buckets.items()
        ],
        config,
    )
    by_order = {}
    cut = 0
    for bucket, items in buckets.items():
        assigned = assign_from(layout, layout.bucket_starts[bucket], [s for _, s in items])
        by_order.update({order: shard for (order, _), shard in zip(items, assigned, strict=True)})
        # The pipeline's shortcut: a bucket one shard holds whole needs no sorting.
        whole = layout.whole_shard(bucket)
        if whole is None:
            cut += 1
        else:
            assert set(assigned) == {whole}
    expected = assign_all([s for _, s in ranked], layout.plan.num_shards)
    assert [by_order[order] for order, _ in ranked] == expected
    assert cut <= layout.plan.num_shards - 1  # only boundaries cut buckets


def test_balance_on_realistic_image_sizes():
    """10,000 JPEG-like records of 20 KB to 2 MB land within 10% of the mean shard size."""
    sizes = [20_000 + (i * 7919) % 2_000_000 for i in range(10_000)]
    plan = plan_shards(SplitStats(len(sizes), sum(sizes), max(sizes)), ShardingConfig(num_hosts=4))
    shards = assign_all(sizes, plan.num_shards)
    per_shard = [0] * plan.num_shards
    for shard, size in zip(shards, sizes, strict=True):
        per_shard[shard] += size
    mean = sum(sizes) / plan.num_shards
    # 9.4 GiB / 200 MiB = 48.4 -> 49 shards, rounded up to a multiple of the 4 hosts.
    assert plan.num_shards == 52
    assert max(per_shard) <= 1.1 * mean
    assert min(per_shard) >= 0.9 * mean
    assert math.isclose(sum(per_shard), sum(sizes))


def _refs(sizes, buckets: int, split_of=lambda i: "train"):
    """RecordRefs whose order keys fall in the first `buckets` buckets (a small dataset's
    records then share buckets as a large dataset's do); the rest of each key is order_key's."""
    refs = []
    for i, size in enumerate(sizes):
        order = order_key("salt", f"0:img/{i}.jpg")
        order = (int.from_bytes(order[:2], "big") % buckets).to_bytes(2, "big") + order[2:]
        refs.append(
            RecordRef(split_of(i), order, size, b"", None, 0, f"img/{i}.jpg", None, None, 0)
        )
    return refs


def _place_as_the_pipeline_does(batches, config, splits=("train",)):
    """Every step PlanShards runs, in order: ({order key: (split, shard)}, layouts, records
    of cut buckets, cut fine buckets, records through the cut-bucket group)."""
    # Each batch's totals summed on its own "worker", then the accumulators merged.
    partials = [merge_plan_totals(({}, FineTotals()), plan_totals(batch)) for batch in batches]
    summed = ({}, FineTotals())
    for partial in partials:
        merge_plan_totals(summed, pickle.loads(pickle.dumps(partial)))  # as the combine ships it
    layouts = plan_layouts(summed, config, splits)
    in_cut_buckets = sum(
        int(summed[0][s][0][layouts[s].cut_buckets].sum()) for s in summed[0] if s in layouts
    )
    whole = whole_shards_of(layouts)
    placed, groups = [], {}
    for batch in batches:
        pieces, cut_pieces = place_batch(batch, whole)
        placed += pieces
        for key, piece in cut_pieces:
            groups.setdefault(key, []).append(piece)
    through_group = 0
    for (split, fine_bucket), pieces in sorted(groups.items()):
        through_group += sum(piece_rows(p) for p in pieces)
        placed += place_cut_bucket(split, fine_bucket, pieces, layouts)
    assignment = {}
    for (split, shard), piece in placed:
        for order in concat_batches([piece]).column("order").to_pylist():
            assert order not in assignment, "a record placed twice"
            assignment[order] = (split, shard)
    return assignment, layouts, in_cut_buckets, len(groups), through_group


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=17, max_value=100_000), min_size=1, max_size=400),
    buckets=st.integers(1, 40),
    shards=st.integers(1, 200),
    batch=st.integers(1, 300),
    two_splits=st.booleans(),
    sparse_entries_max=st.sampled_from([0, 40, placement._SPARSE_ENTRIES_MAX]),
)
def test_refined_placement_is_the_definition(
    sizes, buckets, shards, batch, two_splits, sparse_entries_max
):
    """Whole buckets, whole fine buckets and sorted cut fine buckets together put every record
    in shard floor(p·n / T), p its first byte's position in its split's order-key order.

    Whether the fine totals are summed densely at once (0), after a few records (a mix of
    sparse and dense accumulators), or stay sparse as in a small run."""
    split_of = (lambda i: ("train", "test")[i % 3 == 0]) if two_splits else (lambda i: "train")
    refs = _refs(sizes, buckets, split_of)
    batches = [ref_batch(refs[i : i + batch]) for i in range(0, len(refs), batch)]
    config = ShardingConfig(num_shards=shards)
    with mock.patch.object(placement, "_SPARSE_ENTRIES_MAX", sparse_entries_max):
        assignment, layouts, in_cut, cut_groups, through = _place_as_the_pipeline_does(
            batches, config, ("train", "test")
        )
    assert len(assignment) == len(refs)
    for split, layout in layouts.items():
        ranked = sorted((r.order, r.size) for r in refs if r.split == split)
        expected = (
            assign_all([size for _, size in ranked], layout.plan.num_shards) if ranked else []
        )
        assert [assignment[order] for order, _ in ranked] == [(split, s) for s in expected]
    boundaries = sum(max(0, layout.plan.num_shards - 1) for layout in layouts.values())
    assert cut_groups <= boundaries  # a boundary cuts at most one fine bucket
    assert through <= in_cut  # only records of cut buckets, and at most all of them


def test_refinement_keeps_most_records_of_cut_buckets_out_of_the_group():
    """With buckets a little smaller than a shard (10 TB in 200 MiB shards: ~1,500 records a
    bucket, 47,679 shards for 65,536 buckets), nearly every boundary cuts a bucket, so most
    records sit in cut buckets; only the fine buckets the boundaries cut still need sorting."""
    # 256 buckets of 160 records and 186 shards: a bucket is 0.73 of a shard, as at 10 TB.
    sizes = [20_000 + (i * 7919) % 180_000 for i in range(40_960)]
    refs = _refs(sizes, 256)
    batches = [ref_batch(refs[i : i + 256]) for i in range(0, len(refs), 256)]
    assignment, layouts, in_cut, cut_groups, through = _place_as_the_pipeline_does(
        batches, ShardingConfig(num_shards=186)
    )
    ranked = sorted((r.order, r.size) for r in refs)
    expected = assign_all([size for _, size in ranked], 186)
    assert [assignment[order] for order, _ in ranked] == [("train", s) for s in expected]
    assert in_cut > 0.6 * len(refs)  # without refinement: most records through the group
    assert 0 < cut_groups <= 185
    # Each cut fine bucket holds ~1/16 of a bucket: about 185 × 160 / 16 records in all.
    assert through < in_cut / 8
    assert through < 0.1 * len(refs)


def test_fine_buckets_follow_the_order_key_order():
    """Sorting by fine bucket never contradicts sorting by order key: a fine bucket is the
    bucket plus the next FINE_BITS bits of the hash."""
    orders = sorted(order_key("s", f"k{i}") for i in range(5_000))
    fine = [fine_bucket_of(order) for order in orders]
    assert fine == sorted(fine)
    assert {f >> FINE_BITS for f in fine} == {bucket_of(order) for order in orders}
    assert len(set(fine)) > len({bucket_of(order) for order in orders})


def test_fine_totals_that_do_not_add_up_are_refused():
    """Fine totals summed over other records than the bucket totals cannot place records:
    refining fails rather than placing them by wrong positions."""
    refs = _refs([1_000 + i for i in range(2_000)], 8)
    batch = ref_batch(refs)
    coarse = build_layouts(
        merge_totals({}, bucket_totals(batch)), ShardingConfig(num_shards=20), ["train"]
    )
    cut = coarse["train"].cut()
    assert len(cut)
    drop = next(i for i, ref in enumerate(refs) if bucket_of(ref.order) in cut)
    missing_one = FineTotals().add(fine_totals(ref_batch(refs[:drop] + refs[drop + 1 :])))
    with pytest.raises(
        ValueError,
        match="^the fine totals of the cut buckets do not add up to the buckets' totals: they "
        "were summed over other records$",
    ):
        refine_layouts(coarse, missing_one)
    refined = refine_layouts(coarse, FineTotals().add(fine_totals(batch)))["train"]
    assert refined.cut_buckets.tolist() == cut.tolist()
    ends = coarse["train"].bucket_ends[cut]
    assert refined.fine_starts[:, -1].tolist() == ends.tolist()
    assert refined.fine_starts[:, 0].tolist() == coarse["train"].bucket_starts[cut].tolist()


def test_fine_totals_cross_the_shuffle_small():
    """The accumulator sums into 2^20 dense counters per split but pickles only the fine
    buckets that hold records (dense once more than half do): a worker that saw few records
    ships little, and none ships more than the 8 MiB of counters."""
    refs = _refs([1_000 + i for i in range(500)], 4)
    summed = FineTotals().add(fine_totals(ref_batch(refs)))
    encoded = pickle.dumps(summed)
    assert len(encoded) < 20_000  # ≤ 500 fine buckets, not 8 MiB of counters
    fine, sizes = pickle.loads(encoded).sparse()["train"]
    expected_fine, expected_sizes = summed.sparse()["train"]
    assert fine.tolist() == expected_fine.tolist() and sizes.tolist() == expected_sizes.tolist()
    assert sizes.sum() == sum(r.size for r in refs)
    full = FineTotals().add({"train": (np.arange(1 << 20), np.ones(1 << 20, np.int64))})
    encoded = pickle.dumps(full)
    assert len(encoded) < (8 << 20) + 10_000  # dense, not 16 MiB of (bucket, bytes) pairs
    assert pickle.loads(encoded).sparse()["train"][1].sum() == 1 << 20


def test_fine_whole_shards_past_int64_products_are_exact():
    """Where T·n no longer fits in int64 the shards are computed with Python integers: the
    same rule, bucket by bucket and fine bucket by fine bucket."""
    rng = np.random.default_rng(3)
    totals = np.zeros((3, NUM_BUCKETS), dtype=np.int64)
    sizes = rng.integers(1 << 40, 1 << 41, size=NUM_BUCKETS)  # ~2^57 bytes in all
    totals[0], totals[1], totals[2] = 1_000, sizes, sizes // 1_000
    layout = layout_from_totals(totals, ShardingConfig(num_shards=40_000))
    n, total = layout.plan.num_shards, layout.plan.stats.total_bytes
    assert total * n >= 1 << 62
    cut = layout.cut()
    fine_sizes = np.tile(sizes[cut] // FINE_PER_BUCKET, (FINE_PER_BUCKET, 1)).T
    fine_sizes[:, -1] += sizes[cut] - fine_sizes.sum(axis=1)
    refined = layout.refine(fine_sizes)
    shards = refined.fine_whole_shards()
    for row, starts in enumerate(refined.fine_starts.tolist()[:500]):
        for k in range(FINE_PER_BUCKET):
            first, last = starts[k] * n // total, (starts[k + 1] - 1) * n // total
            assert shards[row, k] == (first if first == last else -1)
    whole = layout.whole_shards()
    for bucket in range(0, NUM_BUCKETS, 97):
        expected = layout.whole_shard(bucket)
        assert whole[bucket] == (-1 if expected is None else expected)


def test_a_refined_layout_pickles_compactly_and_whole():
    """The layouts go to every worker: a refined layout's fine bounds travel as small offsets
    (uint32 here) and come back exactly."""
    rng = np.random.default_rng(4)
    totals = np.zeros((3, NUM_BUCKETS), dtype=np.int64)
    sizes = rng.integers(100_000_000, 200_000_000, size=NUM_BUCKETS)  # ~150 MB buckets, 10 TB
    totals[0], totals[1], totals[2] = 1_500, sizes, 2_000_000
    layout = layout_from_totals(totals, ShardingConfig())
    cut = layout.cut()
    fine_sizes = rng.integers(0, 3, size=(len(cut), FINE_PER_BUCKET)) + 1
    fine_sizes = fine_sizes * (sizes[cut] // fine_sizes.sum(axis=1))[:, None]
    fine_sizes[:, -1] += sizes[cut] - fine_sizes.sum(axis=1)
    refined = layout.refine(fine_sizes)
    coarse_bytes, refined_bytes = len(pickle.dumps(layout)), len(pickle.dumps(refined))
    assert len(cut) > 40_000
    # 15 uint32 offsets and a uint16 bucket per cut bucket, not 17 int64 bounds and an int64.
    assert refined_bytes - coarse_bytes < len(cut) * (15 * 4 + 2) + 1_000
    back = pickle.loads(pickle.dumps(refined))
    assert back.plan == refined.plan
    assert np.array_equal(back.cut_buckets, refined.cut_buckets)
    assert np.array_equal(back.fine_starts, refined.fine_starts)
    assert np.array_equal(back.fine_whole_shards(), refined.fine_whole_shards())
    assert pickle.loads(pickle.dumps(layout)).fine_starts is None
