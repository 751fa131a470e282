"""The sharding planner: a table of realistic sizes, and properties of plans and assignment."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.core.keys import order_key
from transforms.core.sharding import (
    MIB,
    ShardingConfig,
    SplitStats,
    assign_all,
    assign_bucket,
    bucket_of,
    layout_split,
    plan_shards,
)

GIB, TIB = 1 << 30, 1 << 40
IMAGE = 110_000  # a typical JPEG record, in bytes


def stats_for(total: int, record: int = IMAGE) -> SplitStats:
    return SplitStats(
        num_records=max(1, total // record), total_bytes=total, max_record_bytes=record
    )


# (total bytes, reading hosts) -> expected shard count (see DESIGN.md's rule).
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
    "kwargs",
    [
        {"num_hosts": 0},
        {"min_shard_bytes": 0},
        {"min_shard_bytes": 300 * MIB},  # above the default maximum
        {"num_shards": 0},
    ],
)
def test_nonsense_thresholds_are_rejected(kwargs):
    with pytest.raises(ValueError):
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
        assigned = assign_bucket(layout, bucket, [s for _, s in items])
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
