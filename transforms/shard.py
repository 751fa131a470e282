"""Planning and assignment: per-split shard counts from bucket totals, then a shard per record.

Records travel in batches (lists of RecordRefs): Beam's cost is per element, and a batch pays it
once for hundreds of records. Neither planning nor assignment depends on how records are
batched, so the output does not either.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence

import apache_beam as beam

from transforms.core.records import RecordRef
from transforms.core.sharding import (
    ShardingConfig,
    SplitLayout,
    SplitStats,
    assign_bucket,
    bucket_of,
    layout_split,
)

CUT = "cut"


class PlanShards(beam.PTransform):
    """Batches of RecordRefs → batches per shard, plus the per-split layouts.

    Input: PCollection[list[tuple]] (packed RecordRefs, see records.pack). Returns a dict:
        assigned: PCollection[tuple[tuple[str, int], list[tuple]]]: (split, shard index) and
            some of its records, packed; a shard's records arrive in several such pieces
            (absent when not assigning).
        layouts: PCollection with a single dict {split: SplitLayout} (plan + bucket bounds),
            covering every configured split even when it received no records.
    """

    def __init__(self, config: ShardingConfig, splits: Sequence[str], assign: bool = True) -> None:
        super().__init__()
        self._config = config
        self._splits = tuple(splits)
        self._assign = assign

    def expand(self, batches):
        # {split: SplitLayout}: the only global step, over at most 65536 small totals per split.
        layouts = (
            batches
            | "BucketTotals" >> beam.Map(bucket_totals)
            | "SumTotals" >> beam.CombineGlobally(_SumTotalsFn())
            | "Layouts" >> beam.Map(build_layouts, self._config, self._splits)
        )
        if not self._assign:  # planning only
            return {"layouts": layouts}
        placed = batches | "AssignShards" >> beam.ParDo(
            _AssignBatchFn(), beam.pvalue.AsSingleton(layouts)
        ).with_outputs(CUT, main="pieces")
        # Records of the few buckets a shard boundary cuts: ((split, bucket), RecordRef) →
        # sorted by order key within their bucket to find which side of the boundary they fall.
        settled = (
            placed[CUT]
            | "GroupCutBuckets" >> beam.GroupByKey()
            | "AssignCutBuckets"
            >> beam.ParDo(_AssignCutBucketFn(), beam.pvalue.AsSingleton(layouts))
        )
        assigned = (placed.pieces, settled) | "AllPieces" >> beam.Flatten()
        return {"assigned": assigned, "layouts": layouts}


def bucket_totals(batch: Iterable[tuple]) -> dict[tuple[str, int], tuple[int, int, int]]:
    """{(split, bucket): (records, bytes, largest record)} of one batch of packed RecordRefs.

    Plain tuples, not SplitStats: Beam's coder encodes them natively (see records.pack).
    """
    totals: dict[tuple[str, int], tuple[int, int, int]] = {}
    for packed in batch:
        ref = RecordRef._make(packed)
        key = (ref.split, bucket_of(ref.order))
        count, total, largest = totals.get(key, (0, 0, 0))
        totals[key] = (count + 1, total + ref.size, max(largest, ref.size))
    return totals


class _SumTotalsFn(beam.CombineFn):
    """Merges {(split, bucket): (records, bytes, largest)} dicts (≤ 65536 entries per split)."""

    def create_accumulator(self):
        return {}

    def add_input(self, totals, batch_totals):
        for key, (count, total, largest) in batch_totals.items():
            mine = totals.get(key, (0, 0, 0))
            totals[key] = (mine[0] + count, mine[1] + total, max(mine[2], largest))
        return totals

    def merge_accumulators(self, accumulators):
        merged = {}
        for totals in accumulators:
            self.add_input(merged, totals)
        return merged

    def extract_output(self, totals):
        return totals


def build_layouts(
    totals: Mapping[tuple[str, int], tuple[int, int, int]],
    config: ShardingConfig,
    splits: Sequence[str],
) -> dict[str, SplitLayout]:
    """{split: SplitLayout} from {(split, bucket): (records, bytes, largest)}; every configured
    split included."""
    per_split: dict[str, list[tuple[int, SplitStats]]] = {split: [] for split in splits}
    for (split, bucket), stats in totals.items():
        per_split.setdefault(split, []).append((bucket, SplitStats(*stats)))
    return {split: layout_split(buckets, config) for split, buckets in sorted(per_split.items())}


class _AssignBatchFn(beam.DoFn):
    """A batch → ((split, shard), records) pieces; records of cut buckets go to CUT."""

    def process(self, batch: list[tuple], layouts: Mapping[str, SplitLayout]):
        pieces: dict[tuple[str, int], list[tuple]] = collections.defaultdict(list)
        for packed in batch:
            ref = RecordRef._make(packed)
            bucket = bucket_of(ref.order)
            shard = layouts[ref.split].whole_shard(bucket)
            if shard is None:
                yield beam.pvalue.TaggedOutput(CUT, ((ref.split, bucket), packed))
            else:
                pieces[(ref.split, shard)].append(packed)
        yield from pieces.items()


class _AssignCutBucketFn(beam.DoFn):
    """((split, bucket), refs) → ((split, shard), records) in order-key order."""

    def process(self, element, layouts: Mapping[str, SplitLayout]):
        (split, bucket), packed_refs = element
        ordered = sorted((RecordRef._make(p) for p in packed_refs), key=lambda ref: ref.order)
        shards = assign_bucket(layouts[split], bucket, [ref.size for ref in ordered])
        pieces: dict[tuple[str, int], list[tuple]] = collections.defaultdict(list)
        for ref, shard in zip(ordered, shards, strict=True):
            pieces[(split, shard)].append(tuple(ref))
        yield from pieces.items()
