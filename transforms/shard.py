"""Planning and assignment: per-split shard counts from bucket totals, then a shard per record.

Records travel in columnar batches (pyarrow RecordBatches of RecordRefs, records.REF_SCHEMA):
Beam's cost is per element, and a batch pays it once for thousands of records; totals and
assignments are computed with array operations. Neither planning nor assignment depends on how
records are batched, so the output does not either. The DoFns only wire the pure steps of
transforms/core/planning/placement.py, which the scale simulation (benchmarks/scale.py) runs too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import apache_beam as beam
import pyarrow as pa

from recordforge.transforms.core.planning.placement import (
    FineTotals,
    merge_plan_totals,
    place_batch,
    place_cut_bucket,
    plan_layouts,
    plan_totals,
    whole_shards_of,
)
from recordforge.transforms.core.planning.sharding import ShardingConfig, SplitLayout
from recordforge.transforms.internals import in_global_window
from recordforge.transforms.progress import count_planned

CUT = "cut"


class PlanShards(beam.PTransform):
    """Batches of RecordRefs → batches per shard, plus the per-split layouts.

    Input: PCollection[pyarrow.RecordBatch] (REF_SCHEMA). Returns a dict:
        assigned: PCollection[tuple[tuple[str, int], pyarrow.RecordBatch]]: (split, shard
            index) and some of its records; a shard's records arrive in several such pieces
            (absent when not assigning).
        layouts: PCollection with a single dict {split: SplitLayout} (plan, bucket bounds, and
            the bounds of the fine buckets of cut buckets), covering every configured split
            even when it received no records.
    """

    def __init__(
        self,
        config: ShardingConfig,
        splits: Sequence[str],
        assign: bool = True,
        summed_totals=None,
    ) -> None:
        """`summed_totals`: a PCollection holding the one sum of `plan_totals_of(batches)`, for
        a caller that sums them in a global combine of its own (CombineTogether); without it
        PlanShards runs that combine itself."""
        super().__init__()
        self._config = config
        self._splits = tuple(splits)
        self._assign = assign
        self._summed_totals = summed_totals

    def expand(self, batches):
        summed = self._summed_totals
        if summed is None:
            # The combine's own precombine sums a bundle's batches where they are made.
            summed = (
                batches
                | "BucketTotals" >> beam.Map(plan_totals)
                | "SumTotals" >> beam.CombineGlobally(_SumTotalsFn())
            )
        # {split: SplitLayout}: the only global step, over (3, 65536) bucket totals and 2^20
        # fine bucket byte totals per split.
        layouts = (
            summed
            | "Layouts" >> beam.Map(plan_layouts, self._config, self._splits)
            | "CountPlanned" >> beam.Map(count_planned)
        )
        if not self._assign:  # planning only
            return {"layouts": layouts}
        placed = batches | "AssignShards" >> beam.ParDo(
            _AssignBatchFn(), beam.pvalue.AsSingleton(layouts)
        ).with_outputs(CUT, main="pieces")
        settled = placed[CUT] | SettleCutBuckets(layouts)
        assigned = (placed.pieces, settled) | "AllPieces" >> beam.Flatten()
        return {"assigned": assigned, "layouts": layouts}


class SettleCutBuckets(beam.PTransform):
    """Records of the few fine buckets a shard boundary cuts → pieces by shard.

    Input: PCollection[((split, fine bucket), RefPiece)]; each fine bucket's records are sorted
    by order key to find which side of the boundary they fall. Output: PCollection[((split, shard),
    RefPiece)]. `layouts` is the PlanShards layouts PCollection.
    """

    def __init__(self, layouts) -> None:
        super().__init__()
        self._layouts = layouts

    def expand(self, cut):
        return (
            cut
            | "GroupCutBuckets" >> beam.GroupByKey()
            | "AssignCutBuckets"
            >> beam.ParDo(_AssignCutBucketFn(), beam.pvalue.AsSingleton(self._layouts))
        )


def plan_totals_of(batches):
    """What planning sums over the records: (a PCollection of partial sums, the CombineFn that
    sums them), for PlanShards' `summed_totals`, or for CombineTogether beside other tallies.

    The partial sums are one per bundle, summed where the records are made: a batch's totals
    are megabytes (its (3, 65536) bucket totals), and a combine shared with other tallies
    takes its inputs through a Flatten, which a runner materializes element by element, before
    the combine's own precombine.
    """
    return batches | "BucketTotals" >> beam.ParDo(_BundleTotalsFn()), _SumTotalsFn()


class _BundleTotalsFn(beam.DoFn):
    """Batches → the sum of their `plan_totals`, one per bundle (none for an empty bundle)."""

    def start_bundle(self):
        self._totals = None

    def process(self, batch: pa.RecordBatch):
        if self._totals is None:
            self._totals = _SumTotalsFn().create_accumulator()
        merge_plan_totals(self._totals, plan_totals(batch))

    def finish_bundle(self):
        totals, self._totals = self._totals, None
        if totals is not None:
            yield in_global_window(totals)


class _SumTotalsFn(beam.CombineFn):
    """Sums `plan_totals`, or partial sums of them: ({split: (3, NUM_BUCKETS) totals},
    FineTotals)."""

    def create_accumulator(self):
        return {}, FineTotals()

    def add_input(self, totals, batch_totals):
        return merge_plan_totals(totals, batch_totals)

    def merge_accumulators(self, accumulators):
        # Into the first (which Beam allows to be modified): no copy of its 8 MiB counters.
        accumulators = iter(accumulators)
        merged = next(accumulators, None) or self.create_accumulator()
        for totals in accumulators:
            merge_plan_totals(merged, totals)
        return merged

    def extract_output(self, totals):
        return totals


class WholeShards:
    """`whole_shards_of(layouts)`, computed once per layouts object: a side input is the same
    object for every element of a bundle."""

    def __init__(self) -> None:
        self._cached = (None, {})

    def of(self, layouts: Mapping[str, SplitLayout]):
        key, whole = self._cached
        if key is not layouts:
            whole = whole_shards_of(layouts)
            self._cached = (layouts, whole)
        return whole


class _AssignBatchFn(beam.DoFn):
    """A batch → ((split, shard), records) pieces; records of cut buckets go to CUT."""

    def setup(self):
        self._whole = WholeShards()

    def process(self, batch: pa.RecordBatch, layouts: Mapping[str, SplitLayout]):
        pieces, cut = place_batch(batch, self._whole.of(layouts))
        yield from pieces
        for piece in cut:
            yield beam.pvalue.TaggedOutput(CUT, piece)


class _AssignCutBucketFn(beam.DoFn):
    """((split, fine bucket), record batches) → ((split, shard), records) in order-key order."""

    def process(self, element, layouts: Mapping[str, SplitLayout]):
        (split, fine_bucket), pieces = element
        yield from place_cut_bucket(split, fine_bucket, pieces, layouts)
