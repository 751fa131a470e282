"""Planning and assignment: per-split shard counts from bucket totals, then a shard per record.

Records travel in columnar batches (pyarrow RecordBatches of RecordRefs, records.REF_SCHEMA):
Beam's cost is per element, and a batch pays it once for thousands of records; totals and
assignments are computed with array operations. Neither planning nor assignment depends on how
records are batched, so the output does not either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from transforms.core.records import concat_batches, sorted_by_order
from transforms.core.sharding import (
    NUM_BUCKETS,
    ShardingConfig,
    SplitLayout,
    assign_bucket,
    buckets_of,
    layout_from_totals,
)

CUT = "cut"


class PlanShards(beam.PTransform):
    """Batches of RecordRefs → batches per shard, plus the per-split layouts.

    Input: PCollection[pyarrow.RecordBatch] (REF_SCHEMA). Returns a dict:
        assigned: PCollection[tuple[tuple[str, int], pyarrow.RecordBatch]]: (split, shard
            index) and some of its records; a shard's records arrive in several such pieces
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
        # {split: SplitLayout}: the only global step, over (3, 65536) totals per split.
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
        # Records of the few buckets a shard boundary cuts: ((split, bucket), RecordBatch) →
        # sorted by order key within their bucket to find which side of the boundary they fall.
        settled = (
            placed[CUT]
            | "GroupCutBuckets" >> beam.GroupByKey()
            | "AssignCutBuckets"
            >> beam.ParDo(_AssignCutBucketFn(), beam.pvalue.AsSingleton(layouts))
        )
        assigned = (placed.pieces, settled) | "AllPieces" >> beam.Flatten()
        return {"assigned": assigned, "layouts": layouts}


def bucket_totals(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """{split: (records, bytes, largest record) per bucket, a (3, NUM_BUCKETS) int64 array} of
    one batch of RecordRefs."""
    buckets = buckets_of(batch.column("order"))
    sizes = batch.column("size").to_numpy(zero_copy_only=False)
    totals = {}
    for split, rows in _groups(batch.column("split")):
        b, s = buckets[rows], sizes[rows]
        counts = np.zeros((3, NUM_BUCKETS), dtype=np.int64)
        counts[0] = np.bincount(b, minlength=NUM_BUCKETS)
        np.add.at(counts[1], b, s)
        np.maximum.at(counts[2], b, s)
        totals[split] = counts
    return totals


class _SumTotalsFn(beam.CombineFn):
    """Merges {split: (3, NUM_BUCKETS) totals} dicts."""

    def create_accumulator(self):
        return {}

    def add_input(self, totals, batch_totals):
        for split, more in batch_totals.items():
            mine = totals.get(split)
            if mine is None:
                totals[split] = more.copy()
            else:
                mine[:2] += more[:2]
                np.maximum(mine[2], more[2], out=mine[2])
        return totals

    def merge_accumulators(self, accumulators):
        merged = {}
        for totals in accumulators:
            self.add_input(merged, totals)
        return merged

    def extract_output(self, totals):
        return totals


def build_layouts(
    totals: Mapping[str, np.ndarray], config: ShardingConfig, splits: Sequence[str]
) -> dict[str, SplitLayout]:
    """{split: SplitLayout} from {split: (3, NUM_BUCKETS) totals}; every configured split
    included."""
    empty = np.zeros((3, NUM_BUCKETS), dtype=np.int64)
    names = sorted(set(splits) | set(totals))
    return {split: layout_from_totals(totals.get(split, empty), config) for split in names}


class _AssignBatchFn(beam.DoFn):
    """A batch → ((split, shard), records) pieces; records of cut buckets go to CUT."""

    def setup(self):
        self._cached = (None, {})

    def process(self, batch: pa.RecordBatch, layouts: Mapping[str, SplitLayout]):
        whole = self._whole_shards(layouts)
        buckets = buckets_of(batch.column("order"))
        for split, rows in _groups(batch.column("split")):
            shards = whole[split][buckets[rows]]
            for shard, positions in _int_groups(shards):
                if shard >= 0:
                    yield (split, shard), batch.take(pa.array(rows[positions]))
                    continue
                cut_rows = rows[positions]
                for bucket, members in _int_groups(buckets[cut_rows]):
                    piece = batch.take(pa.array(cut_rows[members]))
                    yield beam.pvalue.TaggedOutput(CUT, ((split, bucket), piece))

    def _whole_shards(self, layouts):
        # The side input is the same object for every batch of a bundle: compute once.
        key, whole = self._cached
        if key is not layouts:
            whole = {split: layout.whole_shards() for split, layout in layouts.items()}
            self._cached = (layouts, whole)
        return whole


class _AssignCutBucketFn(beam.DoFn):
    """((split, bucket), record batches) → ((split, shard), records) in order-key order."""

    def process(self, element, layouts: Mapping[str, SplitLayout]):
        (split, bucket), pieces = element
        ordered = sorted_by_order(concat_batches(pieces))
        sizes = ordered.column("size").to_pylist()
        shards = np.array(assign_bucket(layouts[split], bucket, sizes), dtype=np.int64)
        for shard, positions in _int_groups(shards):
            yield (split, shard), ordered.take(pa.array(positions))


def _groups(splits: pa.Array):
    """(split name, int64 positions) for each distinct split of a string array."""
    encoded = splits.dictionary_encode()
    names = encoded.dictionary.to_pylist()
    if len(names) == 1:
        yield names[0], np.arange(len(splits), dtype=np.int64)
        return
    for code, positions in _int_groups(encoded.indices.to_numpy(zero_copy_only=False)):
        yield names[code], positions


def _int_groups(values: np.ndarray):
    """(value, positions where it occurs) for each distinct value, in ascending value order."""
    if not len(values):
        return
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    bounds = np.flatnonzero(np.diff(ordered)) + 1
    for group in np.split(order, bounds):
        yield int(values[group[0]]), group
