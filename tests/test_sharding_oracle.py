"""The planner and placement against an independent oracle: the sharding rule written out naively.

tests/test_sharding.py checks properties, and derives expected placements from the plan under
test; a planner or a per-bucket total that is wrong in a self-consistent way passes those. Here
the expected shard count comes from `naive_shard_count`, the rule of docs/design.md ("The
sharding planner") as a search over candidate counts (not the planner's arithmetic), and the
expected shard of every record from sorting the records by order key and cutting the split where
the rule says.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordforge.transforms.core.planning.keys import order_key
from recordforge.transforms.core.planning.placement import (
    FineTotals,
    bucket_totals,
    fine_totals,
    merge_plan_totals,
    place_batch,
    place_cut_bucket,
    plan_layouts,
    plan_totals,
    whole_shards_of,
)
from recordforge.transforms.core.planning.sharding import (
    MIB,
    ShardingConfig,
    SplitStats,
    plan_shards,
)
from recordforge.transforms.core.records import RecordRef, concat_batches, ref_batch

GIB = 1 << 30


def naive_shard_count(
    sizes: list[int], hosts: int, min_bytes: int, max_bytes: int, forced: int | None = None
) -> int:
    """The sharding rule (docs/design.md, "The sharding planner"), trying counts one at a time.

    About 10 files per reading host when each is at least `min_bytes` and at most `max_bytes`;
    otherwise the most shards (a multiple of the hosts when there are that many) that stay at
    least `min_bytes`, or the fewest (a multiple of the hosts) that stay at most `max_bytes`.
    Then no empty shard: the largest record must fit in the mean shard, so while it does not,
    fewer shards, again a multiple of the hosts when there are that many.
    """
    if not sizes:
        return 0
    total, largest = sum(sizes), max(sizes)

    def mean_at_least(n: int, size: int) -> bool:
        return n * size <= total

    def mean_at_most(n: int, size: int) -> bool:
        return total <= n * size

    if forced is not None:
        wanted = forced
    elif total <= min_bytes:
        wanted = 1
    elif mean_at_least(10 * hosts, min_bytes) and mean_at_most(10 * hosts, max_bytes):
        wanted = 10 * hosts
    elif not mean_at_least(10 * hosts, min_bytes):
        fitting = [n for n in range(1, 10 * hosts) if mean_at_least(n, min_bytes)]
        multiples = [n for n in fitting if n % hosts == 0]
        wanted = max(multiples) if multiples else max(fitting)
    else:
        wanted = hosts
        while not mean_at_most(wanted, max_bytes):
            wanted += hosts
    if mean_at_least(wanted, largest):
        return wanted
    fitting = [n for n in range(1, wanted) if mean_at_least(n, largest)]
    multiples = [n for n in fitting if n % hosts == 0]
    return max(multiples) if multiples else max(fitting)


def naive_shards(refs: list[RecordRef], num_shards: int) -> dict[bytes, int]:
    """{order key: shard}: records sorted by order key, laid end to end, the split cut into
    `num_shards` equal byte ranges; a record goes where its first byte falls."""
    total = sum(ref.size for ref in refs)
    shards, position = {}, 0
    for ref in sorted(refs, key=lambda ref: ref.order):
        shards[ref.order] = position * num_shards // total
        position += ref.size
    return shards


# --- The planner ------------------------------------------------------------------------------

# (records, total bytes, largest record, hosts) -> the count, worked out by hand. Each is capped
# by its largest record, with more than one reading host: the count is rounded down to a
# multiple of the hosts after the cap, not left at whatever the cap allows.
CAPPED_WITH_HOSTS = [
    # 1 GiB for 8 hosts is 80 shards of 12.8 MiB, but a 100 MiB record fits only 10 times:
    # 10 shards, rounded down to 8 (one per host).
    (10_000, GIB, 100 * MIB, 8, 8),
    # 140 GiB for 4 hosts is 720 shards near 200 MiB; a 1 GiB record fits 140 times: 140.
    (1_000_000, 140 * GIB, GIB, 4, 140),
    # ... and 141 times for 141 GiB: rounded down to 140.
    (1_000_000, 141 * GIB, GIB, 4, 140),
    # 5 records of 30 MiB (150 MiB) for 3 hosts: 15 shards of 10 MiB, capped at 5 records,
    # rounded down to 3.
    (5, 150 * MIB, 30 * MIB, 3, 3),
    # Fewer than one per host: 2 fit, 2 it is (not rounded down to nothing).
    (2, 40 * MIB, 20 * MIB, 8, 2),
]


@pytest.mark.parametrize(("records", "total", "largest", "hosts", "expected"), CAPPED_WITH_HOSTS)
def test_a_capped_count_is_rounded_down_to_a_multiple_of_the_hosts(
    records, total, largest, hosts, expected
):
    plan = plan_shards(SplitStats(records, total, largest), ShardingConfig(num_hosts=hosts))
    assert plan.num_shards == expected, plan.reason
    assert f"reduced to {expected}" in plan.reason


def test_a_forced_count_that_is_capped_is_rounded_down_too():
    # 7 shards requested for 4 hosts; a record of a fifth of the split fits 5 times: 4.
    plan = plan_shards(SplitStats(50, 500, 100), ShardingConfig(num_hosts=4, num_shards=7))
    assert plan.num_shards == 4, plan.reason


@st.composite
def splits_and_configs(draw):
    """Record sizes and thresholds around them: every branch of the rule is reached, and the
    cap often (a few records much larger than the rest)."""
    small = draw(st.lists(st.integers(1, 2_000), min_size=1, max_size=60))
    large = draw(st.lists(st.integers(1, 200_000), max_size=4))
    sizes = draw(st.permutations(small + large))
    total = sum(sizes)
    hosts = draw(st.integers(1, 12))
    min_bytes = draw(st.integers(1, max(1, total // 2)))
    # At least total / 4000, so the oracle's search for the fewest shards stays short.
    max_bytes = draw(st.integers(max(min_bytes, total // 4000), max(min_bytes, total)))
    forced = draw(st.one_of(st.none(), st.integers(1, 80)))
    return sizes, hosts, min_bytes, max_bytes, forced


@settings(max_examples=150, deadline=None)
@given(case=splits_and_configs())
def test_the_planner_follows_the_rule(case):
    sizes, hosts, min_bytes, max_bytes, forced = case
    config = ShardingConfig(
        num_hosts=hosts, min_shard_bytes=min_bytes, max_shard_bytes=max_bytes, num_shards=forced
    )
    plan = plan_shards(SplitStats(len(sizes), sum(sizes), max(sizes)), config)
    assert plan.num_shards == naive_shard_count(sizes, hosts, min_bytes, max_bytes, forced), (
        plan.reason
    )
    if forced is None or plan.num_shards < forced:  # chosen or capped by the planner
        assert plan.num_shards < hosts or plan.num_shards % hosts == 0, plan.reason


# --- Placement --------------------------------------------------------------------------------


def make_refs(sizes: list[int], buckets: int, splits: int = 1) -> list[RecordRef]:
    """RecordRefs with real order keys whose first two bytes (the bucket) are folded into the
    first `buckets` buckets: few buckets, many records each, as in a large dataset."""
    refs = []
    for i, size in enumerate(sizes):
        order = order_key("oracle", f"0:img/{i}.jpg")
        order = (int.from_bytes(order[:2], "big") % buckets).to_bytes(2, "big") + order[2:]
        split = ("train", "test", "validation")[i % splits]
        refs.append(RecordRef(split, order, size, b"", None, 0, f"img/{i}.jpg", None, None, 0))
    return refs


def naive_bucket_totals(refs: list[RecordRef]) -> dict[str, dict[int, list[int]]]:
    """{split: {bucket: [records, bytes, largest record]}}, one record at a time."""
    totals: dict[str, dict[int, list[int]]] = {}
    for ref in refs:
        bucket = ref.order[0] * 256 + ref.order[1]
        entry = totals.setdefault(ref.split, {}).setdefault(bucket, [0, 0, 0])
        entry[0] += 1
        entry[1] += ref.size
        entry[2] = max(entry[2], ref.size)
    return totals


def test_bucket_totals_count_sum_and_take_the_largest_record():
    refs = make_refs([100, 7, 2_000, 55, 55, 3_000, 1, 999] * 5, buckets=3, splits=2)
    totals = bucket_totals(ref_batch(refs))
    expected = naive_bucket_totals(refs)
    assert set(totals) == set(expected) == {"train", "test"}
    for split, counts in totals.items():
        found = {int(b): counts[:, b].tolist() for b in counts[0].nonzero()[0]}
        assert found == expected[split]


def test_fine_totals_sum_the_bytes_of_each_fine_bucket():
    refs = make_refs(list(range(1, 400)), buckets=2)
    expected: dict[int, int] = {}
    for ref in refs:  # the bucket's 16 bits, then the top 4 bits of the next byte
        fine = (ref.order[0] << 12) | (ref.order[1] << 4) | (ref.order[2] >> 4)
        expected[fine] = expected.get(fine, 0) + ref.size
    fine, sizes = FineTotals().add(fine_totals(ref_batch(refs))).sparse()["train"]
    assert dict(zip(fine.tolist(), sizes.tolist(), strict=True)) == expected


def place(refs: list[RecordRef], config: ShardingConfig, batch_size: int):
    """Every record through the pure steps PlanShards runs: {order key: (split, shard)} and
    the layouts."""
    batches = [ref_batch(refs[i : i + batch_size]) for i in range(0, len(refs), batch_size)]
    summed = ({}, FineTotals())
    for batch in batches:
        merge_plan_totals(summed, plan_totals(batch))
    layouts = plan_layouts(summed, config, ["train"])
    whole = whole_shards_of(layouts)
    placed, cut_groups = [], {}
    for batch in batches:
        pieces, cut = place_batch(batch, whole)
        placed += pieces
        for key, piece in cut:
            cut_groups.setdefault(key, []).append(piece)
    for (split, fine_bucket), pieces in cut_groups.items():
        placed += place_cut_bucket(split, fine_bucket, pieces, layouts)
    assignment = {}
    for (split, shard), piece in placed:
        for order in concat_batches([piece]).column("order").to_pylist():
            assert order not in assignment, "a record placed twice"
            assignment[order] = (split, shard)
    return assignment, layouts


def check_against_the_oracle(refs, config, batch_size):
    assignment, layouts = place(refs, config, batch_size)
    assert len(assignment) == len(refs)
    for split in {ref.split for ref in refs}:
        members = [ref for ref in refs if ref.split == split]
        sizes = [ref.size for ref in members]
        count = naive_shard_count(
            sizes,
            config.num_hosts,
            config.min_shard_bytes,
            config.max_shard_bytes,
            config.num_shards,
        )
        assert layouts[split].plan.num_shards == count, layouts[split].plan.reason
        expected = naive_shards(members, count)
        assert {ref.order: assignment[ref.order] for ref in members} == {
            order: (split, shard) for order, shard in expected.items()
        }


def test_records_crowded_in_few_buckets_are_placed_by_the_rule():
    """300 records of about 1 KB in 3 buckets, 50 shards: a bucket holds a third of the split,
    far more than a shard, while the largest record fits a shard 250 times over."""
    sizes = [900 + (i * 37) % 200 for i in range(300)]
    check_against_the_oracle(make_refs(sizes, buckets=3), ShardingConfig(num_shards=50), 64)


def test_a_large_record_caps_the_placement_for_several_hosts():
    sizes = [1_000] * 200 + [30_000]
    config = ShardingConfig(num_hosts=4, min_shard_bytes=1_000, max_shard_bytes=100_000)
    # 230 KB: 40 shards (10 per host) of 5.75 KB, but the 30 KB record fits 7 times: 4.
    assert naive_shard_count(sizes, 4, 1_000, 100_000) == 4
    check_against_the_oracle(make_refs(sizes, buckets=5), config, 50)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50_000), min_size=1, max_size=250),
    buckets=st.integers(1, 30),
    hosts=st.integers(1, 6),
    min_bytes=st.integers(1, 20_000),
    forced=st.one_of(st.none(), st.integers(1, 120)),
    batch_size=st.integers(1, 300),
)
def test_placement_follows_the_rule(sizes, buckets, hosts, min_bytes, forced, batch_size):
    config = ShardingConfig(
        num_hosts=hosts,
        min_shard_bytes=min_bytes,
        max_shard_bytes=max(min_bytes, sum(sizes) // 500),
        num_shards=forced,
    )
    check_against_the_oracle(make_refs(sizes, buckets), config, batch_size)
