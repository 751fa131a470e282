"""Placing batches of records into shards: the pure steps that PlanShards runs inside Beam.

The pipeline (transforms/shard.py) and the scale simulation (benchmarks/scale.py) both call
these, so what the simulation measures is what the pipeline does. Batches are pyarrow
RecordBatches of RecordRefs (records.REF_SCHEMA); totals and assignments are array operations.

    batches ─bucket_totals─▶ {split: (3, NUM_BUCKETS) totals} ─merge_totals─▶ one accumulator
            ─build_layouts─▶ {split: SplitLayout} ─whole_shards_of─▶ {split: shard per bucket}
    batch ─place_batch─▶ pieces of whole buckets + pieces of cut buckets
    cut bucket's pieces ─place_cut_bucket─▶ pieces, in order-key order
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from transforms.core.records import RefPiece, ordered_batch, take_piece, take_pieces
from transforms.core.sharding import (
    NUM_BUCKETS,
    ShardingConfig,
    SplitLayout,
    assign_bucket,
    buckets_of,
    layout_from_totals,
)

# ((split, shard index), some of the shard's records)
Piece = tuple[tuple[str, int], RefPiece]
# ((split, bucket), some records of a bucket that a shard boundary cuts)
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
    included."""
    empty = np.zeros((3, NUM_BUCKETS), dtype=np.int64)
    names = sorted(set(splits) | set(totals))
    return {split: layout_from_totals(totals.get(split, empty), config) for split in names}


def whole_shards_of(layouts: Mapping[str, SplitLayout]) -> dict[str, np.ndarray]:
    """{split: the shard holding each bucket whole, -1 where a boundary cuts it}."""
    return {split: layout.whole_shards() for split, layout in layouts.items()}


def place_batch(
    batch: pa.RecordBatch, whole: Mapping[str, np.ndarray]
) -> tuple[list[Piece], list[CutPiece]]:
    """A batch → its records grouped by shard, for buckets one shard holds whole, and grouped
    by bucket for the buckets a shard boundary cuts (these need their bucket sorted first).
    `whole` is `whole_shards_of(layouts)`."""
    keys: list[tuple[bool, tuple[str, int]]] = []  # (cut?, (split, shard or bucket))
    groups: list[np.ndarray] = []
    buckets = buckets_of(batch.column("order"))
    for split, rows in _groups(batch.column("split")):
        shards = whole[split][buckets[rows]]
        for shard, positions in _int_groups(shards):
            if shard >= 0:
                keys.append((False, (split, shard)))
                groups.append(rows[positions])
                continue
            cut_rows = rows[positions]
            for bucket, members in _int_groups(buckets[cut_rows]):
                keys.append((True, (split, bucket)))
                groups.append(cut_rows[members])
    pieces: list[Piece] = []
    cut: list[CutPiece] = []
    for (is_cut, key), piece in zip(keys, take_pieces(batch, groups), strict=True):
        (cut if is_cut else pieces).append((key, piece))
    return pieces, cut


def place_cut_bucket(
    split: str, bucket: int, batches: Iterable[RefPiece], layouts: Mapping[str, SplitLayout]
) -> Iterator[Piece]:
    """Every record of one cut bucket → its records grouped by shard, in order-key order."""
    ordered = ordered_batch(batches)
    sizes = ordered.column("size").to_pylist()
    shards = np.array(assign_bucket(layouts[split], bucket, sizes), dtype=np.int64)
    lists: list = []
    for shard, positions in _int_groups(shards):
        yield (split, shard), take_piece(ordered, positions, lists)


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
