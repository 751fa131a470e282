"""The sharding planner: how many shards a split gets, and which record goes to which shard.

The rule follows TensorFlow's guidance (docs/design.md, "The sharding planner"): about 10·N
files for N reading hosts when each can still be at least the minimum size; files near the maximum
size when the data is large; fewer files when the data is small; a multiple of N when possible;
never an empty shard, never more shards than records.

Assignment is exact and byte-balanced. Records are laid end to end in order-key order (a salted
hash, so the order is pseudo-random but fixed); a record whose first byte sits at position p of a
split of T bytes goes to shard floor(p·n / T). Each shard then holds at most T/n plus one record's
bytes, and because the planner keeps the largest record within T/n, no shard is ever empty. The
position p is found without a global sort: records are grouped into 2^16 buckets by the top bits of
their hash, bucket byte totals give each bucket's start, and a bucket that lies within one shard
needs no sorting at all. A bucket a shard boundary cuts is split again, by the next FINE_BITS bits
of the hash, into fine buckets (their byte totals are summed with the bucket totals, in the same
pass); only the fine buckets a boundary cuts have their records sorted, one at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

MIB = 1 << 20
BUCKET_BITS = 16
NUM_BUCKETS = 1 << BUCKET_BITS
# Cut buckets are split in 2^FINE_BITS fine buckets: at 10 TB (~1,500 records a bucket) only ~1/16
# of a cut bucket's records then need sorting, for a layouts side input that grows by at most
# NUM_BUCKETS × (2^FINE_BITS - 1) offsets (~4 MiB as uint32) per split.
FINE_BITS = 4
FINE_PER_BUCKET = 1 << FINE_BITS


@dataclass(frozen=True)
class ShardingConfig:
    """The planner's thresholds.

    Attributes:
        num_hosts: how many hosts will read the dataset in training (not the conversion workers).
        min_shard_bytes: no shard smaller than this, unless the whole split is.
        ideal_shard_bytes: the size TensorFlow calls ideal; only quoted in the reason.
        max_shard_bytes: large data is cut into shards no larger than this.
        num_shards: force this many shards per split (still capped so none is empty).
    """

    num_hosts: int = 1
    min_shard_bytes: int = 10 * MIB
    ideal_shard_bytes: int = 100 * MIB
    max_shard_bytes: int = 200 * MIB
    num_shards: int | None = None

    def __post_init__(self) -> None:
        if self.num_hosts < 1:
            raise ValueError(f"the number of hosts must be at least 1, got {self.num_hosts}")
        if self.min_shard_bytes < 1:
            raise ValueError("the minimum shard size must be positive")
        if not self.min_shard_bytes <= self.max_shard_bytes:
            raise ValueError(
                f"the minimum shard size ({human_size(self.min_shard_bytes)}) exceeds the maximum "
                f"({human_size(self.max_shard_bytes)})"
            )
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"the number of shards must be at least 1, got {self.num_shards}")

    def to_dict(self) -> dict:
        return {
            "num_hosts": self.num_hosts,
            "min_shard_bytes": self.min_shard_bytes,
            "ideal_shard_bytes": self.ideal_shard_bytes,
            "max_shard_bytes": self.max_shard_bytes,
            "num_shards": self.num_shards,
        }


@dataclass(frozen=True)
class SplitStats:
    """What the planner needs to know about a split. Sizes include TFRecord framing."""

    num_records: int = 0
    total_bytes: int = 0
    max_record_bytes: int = 0

    def merge(self, other: SplitStats) -> SplitStats:
        return SplitStats(
            self.num_records + other.num_records,
            self.total_bytes + other.total_bytes,
            max(self.max_record_bytes, other.max_record_bytes),
        )


@dataclass(frozen=True)
class ShardPlan:
    """The planner's answer for one split: the shard count and why."""

    num_shards: int
    reason: str
    stats: SplitStats

    @property
    def mean_shard_bytes(self) -> float:
        return self.stats.total_bytes / self.num_shards if self.num_shards else 0.0

    def to_dict(self) -> dict:
        return {
            "num_shards": self.num_shards,
            "reason": self.reason,
            "num_records": self.stats.num_records,
            "total_bytes": self.stats.total_bytes,
            "max_record_bytes": self.stats.max_record_bytes,
        }


def plan_shards(stats: SplitStats, config: ShardingConfig) -> ShardPlan:
    """Choose the number of shards for one split, and say why in words."""
    total, hosts = stats.total_bytes, config.num_hosts
    if stats.num_records == 0:
        return ShardPlan(0, "the split has no records: no shards", stats)
    if config.num_shards is not None:
        count, reason = config.num_shards, f"{_shards(config.num_shards)}, as requested"
    elif total <= config.min_shard_bytes:
        count = 1
        reason = (
            f"{human_size(total)} in all is no more than the "
            f"{human_size(config.min_shard_bytes)} minimum shard size: one shard"
        )
    elif total < 10 * hosts * config.min_shard_bytes:
        count = _round_down_to_multiple(total // config.min_shard_bytes, hosts)
        reason = (
            f"{human_size(total)} is too little for {10 * hosts} shards (10 per reading host) "
            f"of at least {human_size(config.min_shard_bytes)}: {_shards(count)} of about "
            f"{human_size(total / count)}{_multiple_note(count, hosts)}"
        )
    elif total <= 10 * hosts * config.max_shard_bytes:
        count = 10 * hosts
        reason = (
            f"10 shards per reading host × {hosts} host{'s' if hosts > 1 else ''}: {count} shards "
            f"of about {human_size(total / count)}{_ideal_note(total / count, config)}"
        )
    else:
        count = _round_up_to_multiple(math.ceil(total / config.max_shard_bytes), hosts)
        reason = (
            f"{human_size(total)} in {10 * hosts} shards (10 per reading host) would make each "
            f"larger than {human_size(config.max_shard_bytes)}: {_shards(count)} of about "
            f"{human_size(total / count)}{_multiple_note(count, hosts)}"
        )
    capped, why = _cap(count, stats)
    if capped < count:
        capped = _round_down_to_multiple(capped, hosts)
        reason = f"{reason}; reduced to {capped}: {why}"
    return ShardPlan(capped, reason, stats)


def _cap(count: int, stats: SplitStats) -> tuple[int, str]:
    # With the largest record no bigger than the mean shard, every shard receives a record (see
    # the module docstring). total // max_record never exceeds the record count, so this one
    # limit also keeps shards from outnumbering records.
    limit = stats.total_bytes // stats.max_record_bytes
    if limit >= count:
        return count, ""
    if limit == stats.num_records:
        return limit, f"only {limit} records"
    return limit, (
        f"the largest record ({human_size(stats.max_record_bytes)}) must fit in the mean shard "
        "size, so that no shard is empty"
    )


def _shards(count: int) -> str:
    return f"{count} shard{'s' if count != 1 else ''}"


def _round_down_to_multiple(count: int, hosts: int) -> int:
    return count - count % hosts if count >= hosts else max(count, 1)


def _round_up_to_multiple(count: int, hosts: int) -> int:
    return -(-count // hosts) * hosts


def _multiple_note(count: int, hosts: int) -> str:
    if hosts == 1:
        return ""
    if count % hosts == 0:
        return f", {count // hosts} per host"
    return f" (fewer than one per host: not a multiple of {hosts})"


def _ideal_note(shard_bytes: float, config: ShardingConfig) -> str:
    if shard_bytes < config.ideal_shard_bytes:
        return (
            f" (below the {human_size(config.ideal_shard_bytes)} ideal, but enough files for every "
            "host to read in parallel)"
        )
    return ""


def human_size(num_bytes: float) -> str:
    """A byte count for people: 1.5 GiB, 300.0 MiB, 12 B."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{int(num_bytes)} B"


# --- Assignment -------------------------------------------------------------------------------


def bucket_of(order_key: bytes) -> int:
    """The bucket a record falls in: the top BUCKET_BITS of its order key's hash."""
    return int.from_bytes(order_key[:2], "big")


def fine_bucket_of(order_key: bytes) -> int:
    """The fine bucket a record falls in: its bucket, then the next FINE_BITS of its hash."""
    return bucket_of(order_key) << FINE_BITS | order_key[2] >> (8 - FINE_BITS)


def buckets_of(order_keys: pa.Array) -> np.ndarray:
    """`bucket_of` of every order key of a binary array, as int64."""
    return _leading_bits(order_keys, BUCKET_BITS)


def fine_buckets_of(order_keys: pa.Array) -> np.ndarray:
    """`fine_bucket_of` of every order key of a binary array, as int64."""
    return _leading_bits(order_keys, BUCKET_BITS + FINE_BITS)


def _leading_bits(order_keys: pa.Array, bits: int) -> np.ndarray:
    """The first `bits` (at most 24) bits of every order key of a binary array, as int64."""
    if not len(order_keys):
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(order_keys.buffers()[1], dtype=np.int32)
    starts = offsets[order_keys.offset : order_keys.offset + len(order_keys)]
    data = np.frombuffer(order_keys.buffers()[2], dtype=np.uint8)
    value = data[starts].astype(np.int64) << 16 | data[starts + 1].astype(np.int64) << 8
    if bits > 16:
        value |= data[starts + 2]
    return value >> (24 - bits)


@dataclass(frozen=True, eq=False)
class SplitLayout:
    """A split's plan plus where each bucket starts and ends, in bytes, in the split's order.

    Attributes:
        plan: the split's plan.
        bucket_starts, bucket_ends: int64 arrays indexed by bucket (NUM_BUCKETS long); an
            empty bucket starts and ends where the next one starts.
        cut_buckets: once refined (`refine`), the buckets a shard boundary cuts, ascending
            (int64); None before.
        fine_starts: once refined, where each fine bucket of each cut bucket starts: an int64
            array of (len(cut_buckets), FINE_PER_BUCKET + 1) whose last column is the bucket's
            end; None before.
    """

    plan: ShardPlan
    bucket_starts: np.ndarray
    bucket_ends: np.ndarray
    cut_buckets: np.ndarray | None = None
    fine_starts: np.ndarray | None = None

    def shard_of(self, position: int) -> int:
        """The shard of the record whose first byte is at `position`."""
        return int(position) * self.plan.num_shards // self.plan.stats.total_bytes

    def whole_shard(self, bucket: int) -> int | None:
        """The shard that holds every record of `bucket`, or None if a shard boundary cuts it.

        Records of such a bucket need no ordering to be assigned: every one of them starts
        between the bucket's first and last byte, and so lands in the same shard. The buckets
        a boundary cuts (fewer than the shard count) are placed by fine bucket, the same way;
        only the fine buckets a boundary cuts need their records sorted.
        """
        first = self.shard_of(self.bucket_starts[bucket])
        last = self.shard_of(self.bucket_ends[bucket] - 1)
        return first if first == last else None

    def whole_shards(self) -> np.ndarray:
        """`whole_shard` of every bucket at once (int64, -1 for None; -1 for empty buckets)."""
        return self._whole_shards_between(self.bucket_starts, self.bucket_ends)

    def cut(self) -> np.ndarray:
        """The non-empty buckets a shard boundary cuts, ascending (int64)."""
        return np.flatnonzero((self.whole_shards() < 0) & (self.bucket_ends > self.bucket_starts))

    def refine(self, fine_sizes: np.ndarray) -> SplitLayout:
        """This layout with the fine buckets of its cut buckets placed too.

        `fine_sizes` is (len(self.cut()), FINE_PER_BUCKET) int64: the bytes of each fine bucket
        of each cut bucket. They must add up to the buckets' own totals (else ValueError).
        """
        cut = self.cut()
        sizes = np.asarray(fine_sizes, dtype=np.int64).reshape(len(cut), FINE_PER_BUCKET)
        starts = np.zeros((len(cut), FINE_PER_BUCKET + 1), dtype=np.int64)
        starts[:, 0] = self.bucket_starts[cut]
        starts[:, 1:] = starts[:, :1] + np.cumsum(sizes, axis=1)
        if not np.array_equal(starts[:, -1], self.bucket_ends[cut]):
            raise ValueError(
                "the fine totals of the cut buckets do not add up to the buckets' totals: they "
                "were summed over other records"
            )
        return SplitLayout(self.plan, self.bucket_starts, self.bucket_ends, cut, starts)

    def __reduce__(self):
        # The layouts are a side input sent to every worker: the fine bounds travel as offsets
        # within their bucket, in the smallest unsigned type that holds them (uint32 at 10 TB),
        # without the first and last (the bucket's start and end, already sent).
        fine = None
        if self.fine_starts is not None:
            offsets = self.fine_starts[:, 1:-1] - self.fine_starts[:, :1]
            dtype = np.min_scalar_type(int(offsets.max())) if offsets.size else np.uint8
            fine = (self.cut_buckets.astype(np.uint16), offsets.astype(dtype))
        return _unpickle_layout, (self.plan, self.bucket_starts, self.bucket_ends, fine)

    def fine_whole_shards(self) -> np.ndarray:
        """`whole_shard` of every fine bucket of every cut bucket, as (len(cut_buckets),
        FINE_PER_BUCKET) int64 (-1 where a boundary cuts it, and for empty fine buckets)."""
        starts = self._refinement()[:, :-1]
        return self._whole_shards_between(starts, self.fine_starts[:, 1:])

    def fine_start(self, fine_bucket: int) -> int:
        """Where a fine bucket of a cut bucket starts."""
        starts, bucket = self._refinement(), fine_bucket >> FINE_BITS
        row = int(np.searchsorted(self.cut_buckets, bucket))
        if row == len(self.cut_buckets) or self.cut_buckets[row] != bucket:
            raise KeyError(f"bucket {bucket} is not a cut bucket")
        return int(starts[row, fine_bucket & (FINE_PER_BUCKET - 1)])

    def _refinement(self) -> np.ndarray:
        if self.fine_starts is None:
            raise ValueError("the layout is not refined: its cut buckets have no fine totals")
        return self.fine_starts

    def _whole_shards_between(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The shard holding every record starting in [start, end), per element; -1 where a
        boundary falls inside, or the range is empty."""
        shards = np.full(starts.shape, -1, dtype=np.int64)
        total, count = self.plan.stats.total_bytes, self.plan.num_shards
        filled = ends > starts
        if not count or not filled.any():
            return shards
        if total * count < 1 << 62:  # exact in int64
            first = starts[filled] * count // total
            last = (ends[filled] - 1) * count // total
            shards[filled] = np.where(first == last, first, -1)
        else:
            for index in zip(*np.nonzero(filled), strict=True):
                first = self.shard_of(starts[index])
                shards[index] = first if first == self.shard_of(ends[index] - 1) else -1
        return shards


def _unpickle_layout(plan, bucket_starts, bucket_ends, fine) -> SplitLayout:
    if fine is None:
        return SplitLayout(plan, bucket_starts, bucket_ends)
    cut_buckets, offsets = fine
    cut_buckets = cut_buckets.astype(np.int64)
    starts = np.empty((len(cut_buckets), FINE_PER_BUCKET + 1), dtype=np.int64)
    starts[:, 0] = bucket_starts[cut_buckets]
    starts[:, 1:-1] = starts[:, :1] + offsets
    starts[:, -1] = bucket_ends[cut_buckets]
    return SplitLayout(plan, bucket_starts, bucket_ends, cut_buckets, starts)


def layout_split(
    bucket_totals: Iterable[tuple[int, SplitStats]], config: ShardingConfig
) -> SplitLayout:
    """Plan a split from its per-bucket totals and compute every bucket's start position."""
    totals = np.zeros((3, NUM_BUCKETS), dtype=np.int64)
    for bucket, stats in bucket_totals:
        totals[:, bucket] = (stats.num_records, stats.total_bytes, stats.max_record_bytes)
    return layout_from_totals(totals, config)


def layout_from_totals(totals: np.ndarray, config: ShardingConfig) -> SplitLayout:
    """Plan a split from (records, bytes, largest record) per bucket: a (3, NUM_BUCKETS) array."""
    counts, sizes, largest = totals
    ends = np.cumsum(sizes)
    stats = SplitStats(int(counts.sum()), int(ends[-1]), int(largest.max()))
    return SplitLayout(plan_shards(stats, config), ends - sizes, ends)


def assign_from(layout: SplitLayout, position: int, sizes: Sequence[int]) -> list[int]:
    """Shard indices for records laid end to end from `position` (a bucket's or a fine
    bucket's start), given their sizes in order-key order."""
    position = int(position)
    shards = []
    for size in sizes:
        shards.append(layout.shard_of(position))
        position += size
    return shards


def assign_all(sizes: Sequence[int], num_shards: int) -> list[int]:
    """Shard indices for a whole split given in order-key order (for tests and simulations)."""
    total = sum(sizes)
    position, shards = 0, []
    for size in sizes:
        shards.append(position * num_shards // total)
        position += size
    return shards
