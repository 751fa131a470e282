"""Staged shards and what `--resume` needs to trust one: its record and its fingerprint.

Every shard a run writes is staged with a small record beside it (size, records, CRC32C of the
file and of its index, label counts) and a fingerprint of what made it: the options that
shape bytes, the shard's place in the plan, its records' order keys and sizes, and the files
they came from (path, size and, for local files, modification time). A resumed run with the
same inputs computes the same fingerprint for the same shard and keeps the staged file after
checking its size and CRC32C; a different fingerprint means the inputs changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PART_FORMAT = 1
PART_RECORD_SUFFIX = ".part.json"

# The columns of a shard's RecordRefs that decide its bytes, besides the files' contents.
_PLAN_COLUMNS = ("order", "size", "payload_path", "payload_size", "payload_offset")


@dataclass(frozen=True)
class PartRecord:
    """A staged shard: where its file is, what it holds, and what made it."""

    file: str  # the final name
    split: str
    index: int
    num_shards: int
    num_records: int
    num_bytes: int
    crc32c: int
    fingerprint: str
    staged: str  # the staged file's name in the parts folder
    index_file: str | None = None
    index_staged: str | None = None
    index_bytes: int = 0
    index_crc32c: int = 0
    label_counts: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> str:
        document = {"format_version": PART_FORMAT, **asdict(self)}
        document["label_counts"] = [list(pair) for pair in self.label_counts]
        return json.dumps(document, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PartRecord:
        data = json.loads(text)
        if data.pop("format_version", None) != PART_FORMAT:
            raise ValueError("not a part record of this version")
        data["label_counts"] = tuple(tuple(pair) for pair in data["label_counts"])
        return cls(**data)


def shard_fingerprint(
    records: pa.Table,
    order: np.ndarray,
    *,
    run_key: str,
    split: str,
    index: int,
    num_shards: int,
    sources: Mapping[str, tuple],
) -> str:
    """The fingerprint of a shard about to be written.

    Args:
        records: the shard's RecordRefs (records.REF_SCHEMA), in any order.
        order: their positions in order-key order.
        run_key: the digest of the options that shape output bytes.
        split, index, num_shards: the shard's place in the plan.
        sources: {file: identity} of every file its records come from (`source_identity`).
    """
    digest = hashlib.blake2b(digest_size=16)
    header = {"run": run_key, "split": split, "index": index, "of": num_shards, "n": len(order)}
    digest.update(json.dumps(header, sort_keys=True).encode())
    columns = list(_PLAN_COLUMNS)
    if records.num_rows and records.column("payload_path").null_count < records.num_rows:
        # Image records: their Example (everything but the image bytes) is small; a table's
        # rows are their CSV file's, whose identity below stands for them.
        columns.append("example")
    taken = records.select(columns).take(pa.array(order, pa.int64()))
    for name in columns:
        digest.update(name.encode())
        _update_with_column(digest, taken.column(name).combine_chunks())
    for path in sorted(sources):
        digest.update(json.dumps([path, *sources[path]]).encode())
    return digest.hexdigest()


def _update_with_column(digest, array: pa.Array) -> None:
    if pa.types.is_integer(array.type):
        digest.update(pc.fill_null(array, -1).to_numpy().astype("<i8").tobytes())
        return
    nulls = array.is_null().to_numpy(zero_copy_only=False)
    digest.update(np.packbits(nulls).tobytes())
    filled = pc.fill_null(array, pa.scalar("", array.type))
    lengths = pc.binary_length(filled).to_numpy().astype("<i8")
    digest.update(lengths.tobytes())
    offsets = np.frombuffer(filled.buffers()[1], dtype="<i4")[filled.offset :]
    start, end = int(offsets[0]), int(offsets[len(filled)])
    if end > start:
        digest.update(filled.buffers()[2].slice(start, end - start))


def source_files(records: pa.Table) -> list[str]:
    """Every file the records come from: their CSV files or images, and the images they name."""
    paths = set(pc.unique(records.column("path")).to_pylist())
    paths |= set(pc.unique(records.column("payload_path")).drop_null().to_pylist())
    paths.discard(None)
    return sorted(paths)
