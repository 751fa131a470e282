"""The scale simulation: the planner and shard assignment on N synthetic records, in bounded memory.

    python -m benchmarks.scale --records 100000000 [--mean-kb 100] [--hosts 1] [--workers 1000]

It runs the pipeline's own pure steps (core/planning/placement.py, the functions PlanShards'
DoFns call) on batches shaped like the pipeline's: pyarrow RecordBatches of IMAGE_BATCH
RecordRefs (records.REF_SCHEMA).
Only the Beam plumbing between them is replaced, by the simplest thing that keeps memory bounded:

    pass 1  every batch → plan_totals → merge_plan_totals (the SumTotals combine) → plan_layouts
            (bucket bounds, and the fine bucket bounds of cut buckets)
    pass 2  every batch, regenerated → place_batch: pieces of whole (fine) buckets are tallied
            per shard at once; pieces of cut fine buckets are spilled to disk by range (the
            shuffle of GroupCutBuckets)
    pass 3  each spilled range → its fine buckets → place_cut_bucket → tallied per shard

Records are synthetic: sizes from a log-normal law (JPEG-like: median ~0.84 of the mean, a long
tail), order keys of the shape order_key() makes (8 hash bytes, then a unique key) drawn with
numpy rather than blake2b, which would double the run time for no difference in distribution.
Batch b is generated from (seed, b) alone, so pass 2 sees exactly the records pass 1 summed.

Checked at the end (a failed check is reported and makes the exit status 1): every record is
placed exactly once (count, bytes and a 64-bit fingerprint of the order keys agree between the
records generated and those placed), every planned shard is non-empty and none other exists,
every shard is within one record of the planner's mean (T/n ± the largest record), and no more
buckets are cut than there are shard boundaries. The element sizes that cross Beam's shuffles
are measured on the final layouts by benchmarks/elements.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pickle
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
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
from recordforge.transforms.core.planning.sharding import (
    BUCKET_BITS,
    FINE_BITS,
    MIB,
    ShardingConfig,
    SplitLayout,
    fine_buckets_of,
    human_size,
)
from recordforge.transforms.core.records import REF_SCHEMA, RefPiece, concat_batches, piece_rows
from recordforge.transforms.discover import IMAGE_BATCH

SPLIT = "train"
GENERATE_CHUNK = 1 << 16  # records drawn from one numpy generator at a time
SPILL_RANGE_BITS = 8  # cut records spill into 2^8 files, each a range of 2^12 fine buckets
SPILL_FLUSH = 2048  # records buffered per spill file before they are appended to it
SPILL_COMPACT = 64  # buffered pieces joined into one batch
TALLY_GROUP = 4096  # placed pieces tallied at once
ORDER_BYTES = 13  # 8 hash bytes, then a 5-byte unique key


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. Record sizes include TFRecord framing, as the planner's do."""

    records: int
    mean_record_bytes: int = 100_000  # 10 TB / 100 M images
    sigma: float = 0.6  # log-normal spread of record sizes
    min_record_bytes: int = 2_000
    max_record_bytes: int = 50 * MIB
    batch: int = IMAGE_BATCH
    seed: int = 0
    sharding: ShardingConfig = field(default_factory=ShardingConfig)

    def __post_init__(self) -> None:
        if self.records < 1:
            raise ValueError("simulate at least one record")
        if not 0 < self.min_record_bytes <= self.mean_record_bytes <= self.max_record_bytes:
            raise ValueError("record sizes must satisfy 0 < min <= mean <= max")


def generate_batches(config: SimConfig) -> Iterator[pa.RecordBatch]:
    """The records as the pipeline's PlanShards receives them: RecordBatches of RecordRefs."""
    mu = math.log(config.mean_record_bytes) - config.sigma**2 / 2  # so that the mean is right
    for start in range(0, config.records, GENERATE_CHUNK):
        count = min(GENERATE_CHUNK, config.records - start)
        rng = np.random.default_rng([config.seed, start // GENERATE_CHUNK])
        hashes = np.frombuffer(rng.bytes(8 * count), dtype=np.uint8).reshape(count, 8)
        sizes = rng.lognormal(mu, config.sigma, count)
        sizes = np.clip(sizes, config.min_record_bytes, config.max_record_bytes).astype(np.int64)
        unique = np.arange(start, start + count, dtype=">u8").view(np.uint8).reshape(count, 8)
        orders = np.concatenate([hashes, unique[:, 8 - (ORDER_BYTES - 8) :]], axis=1)
        chunk = _ref_columns(count, orders, sizes)
        for offset in range(0, count, config.batch):
            yield chunk.slice(offset, config.batch)


def _ref_columns(count: int, orders: np.ndarray, sizes: np.ndarray) -> pa.RecordBatch:
    """A REF_SCHEMA batch; only split, order and size matter to planning and assignment."""

    def fixed(width: int, data: bytes, kind) -> pa.Array:
        offsets = np.arange(count + 1, dtype=np.int32) * width
        return pa.Array.from_buffers(kind, count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    empty = fixed(0, b"", pa.binary())
    columns = {
        "split": fixed(len(SPLIT), SPLIT.encode() * count, pa.string()),
        "order": fixed(ORDER_BYTES, orders.tobytes(), pa.binary()),
        "size": pa.array(sizes, pa.int64()),
        "example": empty,
        "payload_path": pa.nulls(count, pa.string()),
        "payload_size": pa.array(sizes, pa.int64()),
        "path": empty.cast(pa.string()),
        "row": pa.nulls(count, pa.int64()),
        "label": pa.nulls(count, pa.int64()),
        "payload_offset": pa.array(np.zeros(count, np.int64)),
        "payload_version": pa.array(np.full(count, -1, np.int64)),
    }
    return pa.RecordBatch.from_arrays(
        [columns[name] for name in REF_SCHEMA.names], schema=REF_SCHEMA
    )


def order_keys(batch: pa.RecordBatch) -> np.ndarray:
    """The batch's order keys as a (records, ORDER_BYTES) uint8 array (all are that long)."""
    column = batch.column("order")
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)
    first = offsets[column.offset]
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)
    return data[first : first + ORDER_BYTES * len(column)].reshape(len(column), ORDER_BYTES)


class _Ledger:
    """Records counted in and out: count, bytes and a fingerprint of the order keys."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.fingerprint = np.uint64(0)

    def add(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self.records += batch.num_rows
            self.bytes += int(batch.column("size").to_numpy(zero_copy_only=False).sum())
            # A sum over the order keys (hash and unique key, mixed; mod 2^64): a record lost
            # and another doubled would have to have keys whose terms cancel out.
            keys = order_keys(batch)
            hashes = np.ascontiguousarray(keys[:, :8]).view(">u8").ravel().astype(np.uint64)
            unique = np.zeros((len(keys), 8), np.uint8)
            unique[:, 8 - (ORDER_BYTES - 8) :] = keys[:, 8:]
            unique = unique.view(">u8").ravel().astype(np.uint64)
            with np.errstate(over="ignore"):
                values = hashes * np.uint64(0x9E3779B97F4A7C15) + unique
                self.fingerprint = np.uint64(self.fingerprint + values.sum(dtype=np.uint64))

    def to_dict(self) -> dict:
        return {"records": self.records, "bytes": self.bytes, "fingerprint": int(self.fingerprint)}


class _ShardTally:
    """Bytes and records per (split, shard), as the shard writers would find them.

    Pieces are tallied in groups (TALLY_GROUP at a time, their columns concatenated): at scale
    a batch falls into about one piece per record, and array calls per piece would dominate.
    """

    def __init__(self, layouts: dict[str, SplitLayout]) -> None:
        self.bytes = {
            s: np.zeros(max(1, lay.plan.num_shards), np.int64) for s, lay in layouts.items()
        }
        self.records = {s: np.zeros_like(b) for s, b in self.bytes.items()}
        self.unplanned: list[tuple[str, int]] = []
        self._ledger = _Ledger()
        self._num_shards = {s: lay.plan.num_shards for s, lay in layouts.items()}
        self._pending: dict[str, list[tuple[int, pa.RecordBatch]]] = collections.defaultdict(list)
        self._pending_count = 0

    def add(self, pieces: Iterable[tuple[tuple[str, int], RefPiece]]) -> None:
        for (split, shard), records in pieces:
            if not 0 <= shard < self._num_shards.get(split, 0):
                self.unplanned.append((split, shard))
                continue
            self._pending[split].append((shard, records))
            self._pending_count += 1
        if self._pending_count >= TALLY_GROUP:
            self._flush()

    def _flush(self) -> None:
        for split, pending in self._pending.items():
            if not pending:
                continue
            shards = np.array([shard for shard, _ in pending], np.int64)
            lengths = np.array([piece_rows(records) for _, records in pending], np.int64)
            joined = concat_batches([records for _, records in pending])
            sizes = joined.column("size").to_numpy(zero_copy_only=False)
            np.add.at(self.bytes[split], np.repeat(shards, lengths), sizes)
            np.add.at(self.records[split], shards, lengths)
            self._ledger.add([joined])
            pending.clear()
        self._pending_count = 0

    @property
    def ledger(self) -> _Ledger:
        self._flush()
        return self._ledger


class _Spill:
    """Pieces of cut buckets, on disk in files by bucket range: a shuffle, in miniature."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._buffers: dict[tuple[str, int], list] = collections.defaultdict(list)
        self._counts: collections.Counter = collections.Counter()
        self._files: set[tuple[str, int]] = set()
        self.buffered = 0
        self.max_buffered = 0

    def _path(self, key: tuple[str, int]) -> str:
        return os.path.join(self._folder, f"{key[0]}-{key[1]:03d}.pickle")

    def add(self, split: str, fine_bucket: int, piece: pa.RecordBatch) -> None:
        key = (split, fine_bucket >> (BUCKET_BITS + FINE_BITS - SPILL_RANGE_BITS))
        buffer = self._buffers[key]
        buffer.append(piece)
        if len(buffer) >= SPILL_COMPACT:
            # Pieces are about a record each at scale, and a RecordBatch object costs ~KBs:
            # held as one batch they cost their bytes.
            buffer[:] = [concat_batches(buffer)]
        self._counts[key] += piece_rows(piece)
        self.buffered += piece_rows(piece)
        self.max_buffered = max(self.max_buffered, self.buffered)
        if self._counts[key] >= SPILL_FLUSH:
            self._flush(key)

    def _flush(self, key: tuple[str, int]) -> None:
        with open(self._path(key), "ab") as f:
            batch = concat_batches(self._buffers[key])
            pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)
        self._files.add(key)
        self.buffered -= self._counts[key]
        self._buffers[key], self._counts[key] = [], 0

    def ranges(self) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Each range's split and records, one range in memory at a time."""
        for key in list(self._buffers):
            if self._buffers[key]:
                self._flush(key)
        for key in sorted(self._files):
            batches = []
            with open(self._path(key), "rb") as f:
                while True:
                    try:
                        batches.append(pickle.load(f))
                    except EOFError:
                        break
            os.remove(self._path(key))
            yield key[0], concat_batches(batches)


def simulate(config: SimConfig, spill_folder: str | None = None, keep_assignment: bool = False):
    """Plan and assign N synthetic records; returns (report dict, layouts, assignment or None).

    `keep_assignment` also returns {order key: shard} (small runs only: it holds every record).
    """
    started = time.perf_counter()
    summed: tuple = ({}, FineTotals())
    generated = _Ledger()
    for batch in generate_batches(config):
        merge_plan_totals(summed, plan_totals(batch))
        generated.add([batch])
    layouts = plan_layouts(summed, config.sharding, [SPLIT])
    whole = whole_shards_of(layouts)
    planned = time.perf_counter()
    totals, fine_totals = summed
    in_cut_buckets = sum(
        int(totals[s][0][layouts[s].cut_buckets].sum()) for s in totals if s in layouts
    )

    tally = _ShardTally(layouts)
    assignment: dict[bytes, int] | None = {} if keep_assignment else None
    regenerated = _Ledger()
    cut_records = 0
    with tempfile.TemporaryDirectory(dir=spill_folder, prefix="recordforge-scale-") as folder:
        spill = _Spill(folder)
        for batch in generate_batches(config):
            regenerated.add([batch])
            pieces, cut = place_batch(batch, whole)
            tally.add(pieces)
            _remember(assignment, pieces)
            for (split, fine_bucket), piece in cut:
                spill.add(split, fine_bucket, piece)
                cut_records += piece_rows(piece)
        placed = time.perf_counter()
        cut_buckets, largest_cut_bucket, largest_range = 0, 0, 0
        for split, records in spill.ranges():
            largest_range = max(largest_range, records.num_rows)
            # The group of each cut fine bucket, as GroupCutBuckets would give it.
            buckets = fine_buckets_of(records.column("order"))
            order = np.argsort(buckets, kind="stable")
            bounds = np.flatnonzero(np.diff(buckets[order])) + 1
            for members in np.split(order, bounds):
                bucket = int(buckets[members[0]])
                cut_buckets += 1
                largest_cut_bucket = max(largest_cut_bucket, len(members))
                group = [records.take(pa.array(members))]
                pieces = list(place_cut_bucket(split, bucket, group, layouts))
                tally.add(pieces)
                _remember(assignment, pieces)
    finished = time.perf_counter()

    placed_ledger = tally.ledger  # also tallies the last pieces
    report = {
        "config": _config_dict(config),
        "records": config.records,
        "seconds": {
            "plan (pass 1)": round(planned - started, 1),
            "place batches (pass 2)": round(placed - planned, 1),
            "place cut buckets (pass 3)": round(finished - placed, 1),
            "total": round(finished - started, 1),
        },
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "held": {
            "buckets_with_totals": int(sum(np.count_nonzero(t[0]) for t in totals.values())),
            "fine_buckets_with_totals": int(sum(len(f) for f, _ in fine_totals.sparse().values())),
            "max_spill_buffered_records": spill.max_buffered,
            "largest_cut_range_records": largest_range,
            "largest_cut_bucket_records": largest_cut_bucket,
        },
        "cut": {
            "buckets": int(sum(len(layout.cut_buckets) for layout in layouts.values())),
            "records_in_cut_buckets": in_cut_buckets,
            "fine_buckets": cut_buckets,
            "records": cut_records,
            "record_share": round(cut_records / config.records, 4),
        },
        "splits": {s: _balance(layouts[s], tally, s) for s in layouts},
        "ledger": {"generated": generated.to_dict(), "placed": placed_ledger.to_dict()},
    }
    report["checks"] = _checks(report, generated, regenerated, tally, cut_buckets)
    return report, layouts, assignment


def _remember(assignment, pieces) -> None:
    if assignment is not None:
        for (_, shard), records in pieces:
            for order in concat_batches([records]).column("order").to_pylist():
                assignment[order] = shard


def _balance(layout: SplitLayout, tally: _ShardTally, split: str) -> dict:
    plan = layout.plan
    shard_bytes = tally.bytes[split][: plan.num_shards].tolist()
    shard_records = tally.records[split][: plan.num_shards].tolist()
    mean = plan.mean_shard_bytes
    balance = {
        "plan": plan.to_dict(),
        "planned_shards": plan.num_shards,
        "non_empty_shards": sum(1 for n in shard_records if n),
        "mean_shard_bytes": round(mean),
    }
    if plan.num_shards:
        balance["shard_bytes"] = {
            "min": min(shard_bytes),
            "median": statistics.median(shard_bytes),
            "max": max(shard_bytes),
        }
        balance["shard_records"] = {
            "min": min(shard_records),
            "median": statistics.median(shard_records),
            "max": max(shard_records),
        }
        balance["relative_spread"] = round((max(shard_bytes) - min(shard_bytes)) / mean, 6)
        balance["largest_deviation_in_records"] = round(
            max(abs(b - mean) for b in shard_bytes) / plan.stats.max_record_bytes, 4
        )
    return balance


def _checks(report, generated, regenerated, tally, cut_buckets) -> dict[str, bool]:
    splits = report["splits"].values()
    max_record = {s: b["plan"]["max_record_bytes"] for s, b in report["splits"].items()}
    return {
        "regenerated_records_are_the_planned_ones": generated.to_dict() == regenerated.to_dict(),
        "every_record_placed_exactly_once": generated.to_dict() == tally.ledger.to_dict(),
        "no_shard_outside_the_plan": not tally.unplanned,
        "every_planned_shard_non_empty": all(
            b["non_empty_shards"] == b["planned_shards"] for b in splits
        ),
        "shards_within_one_record_of_the_mean": all(
            abs(int(size) - b["mean_shard_bytes"]) <= max_record[s] + 1
            for s, b in report["splits"].items()
            for size in tally.bytes[s][: b["planned_shards"]].tolist()
        ),
        "cut_buckets_at_most_boundaries": cut_buckets
        <= sum(max(0, b["planned_shards"] - 1) for b in splits),
    }


def _config_dict(config: SimConfig) -> dict:
    data = asdict(config)
    data["sharding"] = config.sharding.to_dict()
    return data


def format_report(report: dict) -> str:
    """The report for people: timings, memory, balance, checks."""
    lines = [
        f"{report['records']:,} records, mean {human_size(report['config']['mean_record_bytes'])}"
        f", batches of {report['config']['batch']}",
        "time: "
        + ", ".join(f"{name} {seconds:,.1f} s" for name, seconds in report["seconds"].items()),
        f"peak RSS: {report['peak_rss_mb']:,.0f} MB; held at most: "
        + ", ".join(f"{k} {v:,}" for k, v in report["held"].items()),
        f"cut buckets: {report['cut']['buckets']:,}, holding "
        f"{report['cut']['records_in_cut_buckets']:,} records; of their fine buckets "
        f"{report['cut']['fine_buckets']:,} are cut, holding {report['cut']['records']:,} "
        f"records ({report['cut']['record_share']:.1%}), sorted and placed in pass 3",
    ]
    for split, b in report["splits"].items():
        lines.append(f"split {split}: {b['plan']['reason']}")
        if b["planned_shards"]:
            sizes, counts = b["shard_bytes"], b["shard_records"]
            lines.append(
                f"  shards: {b['non_empty_shards']:,} written of {b['planned_shards']:,} planned; "
                f"bytes min/median/max {human_size(sizes['min'])} / "
                f"{human_size(sizes['median'])} / {human_size(sizes['max'])} "
                f"(spread {b['relative_spread']:.4%} of the mean, worst "
                f"{b['largest_deviation_in_records']:.2f} × the largest record from it); "
                f"records {counts['min']:,} / {counts['median']:,} / {counts['max']:,}"
            )
    lines += [f"check {name}: {'ok' if ok else 'FAILED'}" for name, ok in report["checks"].items()]
    if "elements" in report:
        from benchmarks.elements import format_elements

        lines.append(format_elements(report["elements"]))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--mean-kb", type=float, default=100.0, help="mean record size, 1000 B")
    parser.add_argument("--sigma", type=float, default=0.6, help="log-normal spread of sizes")
    parser.add_argument("--hosts", type=int, default=1, help="the planner's --num-hosts")
    parser.add_argument("--max-shard-mb", type=int, default=200, help="MiB, as the CLI's")
    parser.add_argument("--workers", type=int, default=1000, help="conversion workers assumed")
    parser.add_argument("--classes", type=int, default=1000, help="labels, for the commit step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spill-dir", default=None, help="where cut records spill (tmp)")
    parser.add_argument("--no-elements", action="store_true", help="skip element sizes")
    parser.add_argument("--json", default=None, help="also write the report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = SimConfig(
        records=args.records,
        mean_record_bytes=round(args.mean_kb * 1000),
        sigma=args.sigma,
        seed=args.seed,
        sharding=ShardingConfig(num_hosts=args.hosts, max_shard_bytes=args.max_shard_mb * MIB),
    )
    if args.spill_dir:
        os.makedirs(args.spill_dir, exist_ok=True)  # a new folder is fine: it only holds temp files
    report, layouts, _ = simulate(config, args.spill_dir)
    if not args.no_elements:
        from benchmarks.elements import measure_elements

        report["elements"] = measure_elements(
            report, layouts, workers=args.workers, classes=args.classes
        )
    report["load_average"] = os.getloadavg()
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
