"""Placing batches of records into shards: the pure steps that PlanShards runs inside Beam.

The pipeline (transforms/shard.py) and the scale simulation (benchmarks/scale.py) both call
these, so what the simulation measures is what the pipeline does. Batches are pyarrow
RecordBatches of RecordRefs (records.REF_SCHEMA); totals and assignments are array operations.

    batches ─plan_totals─▶ ({split: (3, NUM_BUCKETS) totals}, {split: bytes per fine bucket})
            ─merge_plan_totals─▶ one accumulator ─plan_layouts─▶ {split: SplitLayout}
            (bucket bounds, and the fine bucket bounds of cut buckets)
            ─whole_shards_of─▶ {split: WholeShardTable}
    batch ─place_batch─▶ pieces of whole (fine) buckets + pieces of cut fine buckets
    cut fine bucket's pieces ─place_cut_bucket─▶ pieces, in order-key order
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from recordforge.transforms.core.planning.sharding import (
    FINE_BITS,
    FINE_PER_BUCKET,
    NUM_BUCKETS,
    ShardingConfig,
    SplitLayout,
    assign_from,
    buckets_of,
    fine_buckets_of,
    layout_from_totals,
)
from recordforge.transforms.core.records import RefPiece, ordered_batch, take_piece, take_pieces

# ((split, shard index), some of the shard's records)
Piece = tuple[tuple[str, int], RefPiece]
# ((split, fine bucket), some records of a fine bucket that a shard boundary cuts)
CutPiece = tuple[tuple[str, int], RefPiece]


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


def merge_totals(
    totals: dict[str, np.ndarray], more: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Add `more` ({split: (3, NUM_BUCKETS) totals}) into `totals` (in place) and return it."""
    for split, added in more.items():
        mine = totals.get(split)
        if mine is None:
            totals[split] = added.copy()
        else:
            mine[:2] += added[:2]
            np.maximum(mine[2], added[2], out=mine[2])
    return totals


def build_layouts(
    totals: Mapping[str, np.ndarray], config: ShardingConfig, splits: Sequence[str]
) -> dict[str, SplitLayout]:
    """{split: SplitLayout} from {split: (3, NUM_BUCKETS) totals}; every configured split
    included, and `train` when none is configured and no record came (records without a
    split are `train`: an empty dataset has that split, with no records)."""
    empty = np.zeros((3, NUM_BUCKETS), dtype=np.int64)
    names = sorted(set(splits) | set(totals)) or ["train"]
    return {split: layout_from_totals(totals.get(split, empty), config) for split in names}


# {split: (fine buckets, ascending, int64; their bytes, int64)}
FineBytes = dict[str, tuple[np.ndarray, np.ndarray]]


def fine_totals(batch: pa.RecordBatch) -> FineBytes:
    """The bytes per fine bucket of one batch, sparse: a batch holds few of the 2^20."""
    fine = fine_buckets_of(batch.column("order"))
    sizes = batch.column("size").to_numpy(zero_copy_only=False).astype(np.int64)
    return {
        split: _summed(fine[rows], sizes[rows]) for split, rows in _groups(batch.column("split"))
    }


# A split's fine totals stay sparse up to this many (fine bucket, bytes) entries: a small run
# never allocates (and pages in) the 8 MiB of dense counters, ~0.09 s on a 300 MB conversion.
_SPARSE_ENTRIES_MAX = NUM_BUCKETS * FINE_PER_BUCKET // 16


class FineTotals:
    """Bytes per fine bucket, per split: the second half of the SumTotals accumulator.

    Kept sparse ((fine buckets, bytes) pieces) while a split has few, then summed in a dense
    array (NUM_BUCKETS × FINE_PER_BUCKET int64: 8 MiB, whatever the dataset), so adding a
    batch costs its own records only. Pickled sparse (the fine buckets that hold records: at
    most one per record a worker saw) unless more than half are filled, then dense: what
    crosses the combine's shuffle is at most 8 MiB per split, and ~16 B per record for a
    worker that saw few.
    """

    def __init__(self) -> None:
        self._dense: dict[str, np.ndarray] = {}
        self._pieces: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}

    def add(self, totals: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> FineTotals:
        """Add one batch's `fine_totals` (or another accumulator's `sparse()`)."""
        for split, (fine, sizes) in totals.items():
            dense = self._dense.get(split)
            if dense is not None:
                np.add.at(dense, fine, sizes)
                continue
            pieces = self._pieces.setdefault(split, [])
            pieces.append((fine, sizes))
            if sum(len(f) for f, _ in pieces) > _SPARSE_ENTRIES_MAX:
                self._densify(split)
        return self

    def merge(self, other: FineTotals) -> FineTotals:
        for split, dense in other._dense.items():
            mine = self._densify(split)
            mine += dense
        return self.add(other.sparse_pieces())

    def of_buckets(self, split: str, buckets: np.ndarray) -> np.ndarray:
        """The bytes of each fine bucket of `buckets` (ascending): (len(buckets),
        FINE_PER_BUCKET) int64."""
        dense = self._dense.get(split)
        if dense is not None:
            return dense.reshape(NUM_BUCKETS, FINE_PER_BUCKET)[buckets]
        found = np.zeros((len(buckets), FINE_PER_BUCKET), dtype=np.int64)
        fine, sizes = self._collapsed(split)
        rows = np.searchsorted(buckets, fine >> FINE_BITS)
        wanted = rows < len(buckets)
        wanted[wanted] = buckets[rows[wanted]] == fine[wanted] >> FINE_BITS
        found[rows[wanted], fine[wanted] & (FINE_PER_BUCKET - 1)] = sizes[wanted]
        return found

    def sparse(self) -> FineBytes:
        """{split: (fine buckets holding records, ascending; their bytes)}."""
        totals = {}
        for split, dense in self._dense.items():
            fine = np.flatnonzero(dense)
            totals[split] = (fine, dense[fine])
        totals.update(self.sparse_pieces())
        return totals

    def sparse_pieces(self) -> FineBytes:
        """`sparse()` of the splits not yet summed densely."""
        return {split: self._collapsed(split) for split in self._pieces}

    def _collapsed(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """A sparse split's pieces summed into one, which replaces them."""
        pieces = self._pieces.get(split) or [(np.zeros(0, np.int64), np.zeros(0, np.int64))]
        if len(pieces) > 1:
            pieces[:] = [_summed(*map(np.concatenate, zip(*pieces, strict=True)))]
        fine, sizes = pieces[0]
        if len(fine) > 1 and not (fine[1:] > fine[:-1]).all():  # one batch's, not yet summed
            pieces[0] = fine, sizes = _summed(fine, sizes)
        return fine, sizes

    def _densify(self, split: str) -> np.ndarray:
        dense = self._dense.get(split)
        if dense is None:
            dense = self._dense[split] = np.zeros(NUM_BUCKETS * FINE_PER_BUCKET, np.int64)
            for fine, sizes in self._pieces.pop(split, ()):
                np.add.at(dense, fine, sizes)
        return dense

    def __getstate__(self):
        state = {}
        for split, dense in self._dense.items():
            fine = np.flatnonzero(dense)
            state[split] = dense if 2 * len(fine) > len(dense) else (fine, dense[fine])
        state.update(self.sparse_pieces())
        return state

    def __setstate__(self, state) -> None:
        self._dense, self._pieces = {}, {}
        for split, value in state.items():
            if isinstance(value, np.ndarray):
                self._dense[split] = value if value.flags.writeable else value.copy()
            else:
                self.add({split: value})


def plan_totals(batch: pa.RecordBatch) -> tuple[dict[str, np.ndarray], FineBytes]:
    """What planning sums over the records: (`bucket_totals`, `fine_totals`) of one batch."""
    return bucket_totals(batch), fine_totals(batch)


def merge_plan_totals(
    totals: tuple[dict[str, np.ndarray], FineTotals], more: tuple
) -> tuple[dict[str, np.ndarray], FineTotals]:
    """Add `more` (a batch's `plan_totals`, or another accumulator) into `totals` (in place)."""
    coarse, fine = more
    merge_totals(totals[0], coarse)
    if isinstance(fine, FineTotals):
        totals[1].merge(fine)
    else:
        totals[1].add(fine)
    return totals


def plan_layouts(
    totals: tuple[Mapping[str, np.ndarray], FineTotals],
    config: ShardingConfig,
    splits: Sequence[str],
) -> dict[str, SplitLayout]:
    """{split: SplitLayout, refined} from the summed `plan_totals` of every batch."""
    coarse, fine = totals
    return refine_layouts(build_layouts(coarse, config, splits), fine)


def refine_layouts(layouts: Mapping[str, SplitLayout], fine: FineTotals) -> dict[str, SplitLayout]:
    """{split: SplitLayout refined with the fine totals of its cut buckets}."""
    return {
        split: layout.refine(fine.of_buckets(split, layout.cut()))
        for split, layout in layouts.items()
    }


@dataclass(frozen=True, eq=False)
class WholeShardTable:
    """Where a split's records go without sorting, by bucket and fine bucket.

    Attributes:
        buckets: the shard holding each bucket whole (NUM_BUCKETS, int64; -1 if cut or empty).
        cut_rows: each bucket's row in `fine`, -1 for buckets that are not cut.
        fine: the shard holding each fine bucket of each cut bucket whole (-1 if a boundary
            cuts it too, or it is empty).
    """

    buckets: np.ndarray
    cut_rows: np.ndarray
    fine: np.ndarray

    @classmethod
    def of(cls, layout: SplitLayout) -> WholeShardTable:
        fine = layout.fine_whole_shards()
        rows = np.full(NUM_BUCKETS, -1, dtype=np.int64)
        rows[layout.cut_buckets] = np.arange(len(layout.cut_buckets))
        return cls(layout.whole_shards(), rows, fine)

    def shards(self, buckets: np.ndarray, fine_buckets: np.ndarray) -> np.ndarray:
        """The shard of each record by its bucket and, in cut buckets, its fine bucket; -1
        where even its fine bucket is cut."""
        shards = self.buckets[buckets]
        cut = np.flatnonzero(shards < 0)
        if len(cut):
            fine = fine_buckets[cut]
            rows = self.cut_rows[fine >> FINE_BITS]
            shards[cut] = self.fine[rows, fine & (FINE_PER_BUCKET - 1)]
        return shards


def whole_shards_of(layouts: Mapping[str, SplitLayout]) -> dict[str, WholeShardTable]:
    """{split: WholeShardTable} of refined layouts."""
    return {split: WholeShardTable.of(layout) for split, layout in layouts.items()}


def place_batch(
    batch: pa.RecordBatch, whole: Mapping[str, WholeShardTable]
) -> tuple[list[Piece], list[CutPiece]]:
    """A batch → its records grouped by shard, for (fine) buckets one shard holds whole, and
    grouped by fine bucket for the fine buckets a shard boundary cuts (these need sorting
    first). `whole` is `whole_shards_of(layouts)`."""
    keys: list[tuple[bool, tuple[str, int]]] = []  # (cut?, (split, shard or fine bucket))
    groups: list[np.ndarray] = []
    fine = fine_buckets_of(batch.column("order"))
    buckets = fine >> FINE_BITS
    for split, rows in _groups(batch.column("split")):
        shards = whole[split].shards(buckets[rows], fine[rows])
        for shard, positions in _int_groups(shards):
            if shard >= 0:
                keys.append((False, (split, shard)))
                groups.append(rows[positions])
                continue
            cut_rows = rows[positions]
            for fine_bucket, members in _int_groups(fine[cut_rows]):
                keys.append((True, (split, fine_bucket)))
                groups.append(cut_rows[members])
    pieces: list[Piece] = []
    cut: list[CutPiece] = []
    for (is_cut, key), piece in zip(keys, take_pieces(batch, groups), strict=True):
        (cut if is_cut else pieces).append((key, piece))
    return pieces, cut


def place_cut_bucket(
    split: str, fine_bucket: int, batches: Iterable[RefPiece], layouts: Mapping[str, SplitLayout]
) -> Iterator[Piece]:
    """Every record of one cut fine bucket → its records grouped by shard, in order-key
    order."""
    ordered = ordered_batch(batches)
    sizes = ordered.column("size").to_pylist()
    layout = layouts[split]
    shards = np.array(assign_from(layout, layout.fine_start(fine_bucket), sizes), dtype=np.int64)
    lists: list = []
    for shard, positions in _int_groups(shards):
        yield (split, shard), take_piece(ordered, positions, lists)


def _summed(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys ascending, the sum of the values of each), exact in int64."""
    if not len(keys):
        return keys.astype(np.int64), values.astype(np.int64)
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return keys[starts], np.add.reduceat(values, starts)


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
