"""The elements that flow between pipeline stages: small, picklable named tuples of primitives."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from recordforge.transforms.core.files.filenames import display
from recordforge.transforms.core.tfrecord.framing import FRAMING_BYTES


def pack(records: Iterable[tuple]) -> list[tuple]:
    """NamedTuples as plain tuples, for a batch crossing a Beam stage boundary.

    Beam's default coder encodes lists and plain tuples of primitives natively, but pickles each
    NamedTuple on its own (about 10 µs apiece, more than the rest of a record's work). Batches
    therefore travel as lists of plain tuples; consumers rebuild them with `Type._make`.
    """
    return [tuple(record) for record in records]


class Source(NamedTuple):
    """One input the user named, resolved before the pipeline runs.

    Attributes:
        index: position on the command line; part of every record key, so two sources holding
            the same relative path stay distinct.
        kind: "images" (a folder, glob or image file) or "csv" (a CSV file or a glob of them).
        pattern: what to match with Beam FileSystems (`root/**` for a folder).
        root: the folder that relative paths (record keys, class folders) are taken from.
        given: the source as typed, for messages.
        references: the folder that relative image paths in a CSV source's cells are resolved
            against; empty: the CSV file's own folder. (A table given to the Python API is
            staged as a CSV file elsewhere; its paths are relative to the caller's folder.)
        split: the split of every input of this source (SOURCE=SPLIT, or a source named like
            a split: data/test, test.csv), or None.
        split_folders: (folder, split) pairs when the source's first-level folders are splits
            (root/<split>/<class>/<file>, see core.planning.splits); empty otherwise.
    """

    index: int
    kind: str
    pattern: str
    root: str
    given: str
    references: str = ""
    split: str | None = None
    split_folders: tuple[tuple[str, str], ...] = ()


class CsvRoles(NamedTuple):
    """Which CSV columns play a special part; every other kept column becomes a feature."""

    image_column: str | None = None
    label_column: str | None = None
    split_column: str | None = None


class Candidate(NamedTuple):
    """An input that may become one record: an image file, or a CSV row (maybe naming an image).

    Attributes:
        key: unique and stable across runs: source index, relative path, and CSV row number.
        path: the file the input came from (the image, or the CSV file), for error records.
        row: the CSV data row number (1-based, header not counted), or None for image files.
        features: the CSV columns' features as a serialized Example (one bytes object crosses
            a stage boundary far cheaper than a tuple per cell); empty for image files.
        feature_counts: how many values each CSV feature column has (-1: absent), in the order
            of `declare.csv_feature_columns`; plain ints, cheap to carry, for the tally.
        image_path: the image file whose bytes become `image/encoded`, or None.
        image_name: the value of `image/filename`.
        label: class folder name or CSV label (text or int), or None.
        depth: for files of a folder source, how many folders deep below the root (0 = in it).
        split: the split named by a split column, or None (chosen by hash later).
    """

    key: str
    path: str
    row: int | None
    features: bytes = b""
    feature_counts: tuple = ()
    image_path: str | None = None
    image_name: str | None = None
    label: str | int | None = None
    depth: int = 0
    split: str | None = None


class ImageInfo(NamedTuple):
    """What probing an image file found: its size in bytes and header facts.

    `version` tells a rewritten file from the one probed: a local file's modification time
    (nanoseconds), a gs:// object's generation; -1 when the filesystem has neither.
    """

    size: int
    format: str
    width: int
    height: int
    channels: int
    version: int = -1
    # When the writer preprocesses the image: the facts above are the stored image's (its size
    # an estimate), this the file's own size; -1 otherwise.
    source_size: int = -1
    # The EXIF orientation preprocessing turns the pixels by (read only when the run
    # preprocesses; 1 otherwise): width and height above are the file's.
    orientation: int = 1


class RecordRef(NamedTuple):
    """A record planned but not yet written: everything except the image bytes.

    Attributes:
        split: the split it belongs to.
        order: its order key (salted hash + key): position within the split.
        size: exact size of the final framed record in bytes.
        example: the serialized Example; when `payload_path` is set, without the image bytes:
            they go at `payload_offset` (see schemas.spliced).
        payload_path: the image file to read at write time, or None.
        payload_size: the image's size when probed; a different size at write time is an error.
        path, row: where it came from, for error records.
        label: its class id (the label feature's value), or None; the writers count them.
        payload_offset: where in `example` the image bytes go.
        payload_version: the image's ImageInfo.version when probed; another at write time is
            an error (FileChanged).
    """

    split: str
    order: bytes
    size: int
    example: bytes
    payload_path: str | None
    payload_size: int
    path: str
    row: int | None
    label: int | None = None
    payload_offset: int = 0
    payload_version: int = -1


# RecordRefs travel between stages as columns (a pyarrow RecordBatch with these fields): a
# batch of thousands costs Beam one buffer copy per column instead of work per record.
REF_SCHEMA = pa.schema(
    [
        ("split", pa.string()),
        ("order", pa.binary()),
        ("size", pa.int64()),
        ("example", pa.binary()),
        ("payload_path", pa.string()),
        ("payload_size", pa.int64()),
        ("path", pa.string()),
        ("row", pa.int64()),
        ("label", pa.int64()),
        ("payload_offset", pa.int64()),
        ("payload_version", pa.int64()),
    ]
)


def ref_batch(refs: Iterable[RecordRef]) -> pa.RecordBatch:
    """RecordRefs as one columnar batch (REF_SCHEMA)."""
    refs = list(refs)
    columns = list(zip(*refs, strict=True)) if refs else [()] * len(REF_SCHEMA)
    return pa.record_batch(
        [pa.array(values, f.type) for values, f in zip(columns, REF_SCHEMA, strict=True)],
        schema=REF_SCHEMA,
    )


def complete_batch(
    splits: Sequence[str], orders: Sequence[bytes], examples: pa.Array
) -> pa.RecordBatch:
    """RecordRefs of records that are complete already (no payload to read at write time): the
    serialized Examples `examples` (binary), sized with their framing; other columns null."""
    lengths = pa.compute.binary_length(examples).to_numpy(zero_copy_only=False)
    given = {
        "split": pa.array(splits, pa.string()),
        "order": pa.array(orders, pa.binary()),
        "size": pa.array(lengths.astype(np.int64) + FRAMING_BYTES, pa.int64()),
        "example": examples,
    }
    columns = [given.get(f.name, pa.nulls(len(examples), f.type)) for f in REF_SCHEMA]
    return pa.record_batch(columns, schema=REF_SCHEMA)


def without_examples(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its `example` column emptied: what planning needs (sizes, orders) only."""
    index = batch.schema.get_field_index("example")
    return batch.set_column(index, batch.schema.field(index), pa.nulls(batch.num_rows, pa.binary()))


# A piece of a few records crosses a shuffle as plain column lists, not as a RecordBatch: Beam
# pickles a RecordBatch with its schema (~1.3 KB however few its rows), while lists of plain
# values take its native coder. With thousands of shards a 256-record batch falls apart into
# pieces of a record or two, so this halves the shuffle bytes per record there.
SMALL_PIECE_ROWS = 32
# REF_SCHEMA's columns as Python lists, one value per record.
RefColumns = tuple[list, ...]
RefPiece = pa.RecordBatch | RefColumns
# A piece of fewer records still holding this many bytes of Examples is parked in a spill file
# by the steps that park pieces (transforms/table.py PlaceTable): large Examples (images inside
# TFRecord inputs) make pieces of a record or two, and those would carry megabytes through a
# shuffle. Below it, a piece costs the shuffle less than a spill file's Arrow stream would.
SMALL_PIECE_BYTES = 8192
_EXAMPLE_COLUMN = REF_SCHEMA.get_field_index("example")


def is_small_piece(piece: RefPiece) -> bool:
    """Whether a piece travels as it is rather than parked: few records and few bytes."""
    if isinstance(piece, pa.RecordBatch):
        return False
    return sum(len(example) for example in piece[_EXAMPLE_COLUMN] if example) < SMALL_PIECE_BYTES


def take_piece(batch: pa.RecordBatch, positions: Sequence[int], lists: list) -> RefPiece:
    """The records of `batch` at `positions`, as a RefPiece.

    `lists` caches the batch's columns as Python lists between calls: pass the same list, empty
    at first, for every piece of one batch.
    """
    if len(positions) >= SMALL_PIECE_ROWS:
        return batch.take(pa.array(positions, pa.int64()))
    if not lists:
        lists.extend(column.to_pylist() for column in batch.columns)
    rows = [int(i) for i in positions]
    return tuple([column[i] for i in rows] for column in lists)


def take_pieces(batch: pa.RecordBatch, groups: Sequence[np.ndarray]) -> list[RefPiece]:
    """`take_piece` of each group of positions, with the rows of all small pieces turned into
    Python values at once: only those rows, however large the batch."""
    small = [positions for positions in groups if len(positions) < SMALL_PIECE_ROWS]
    values: list[list] = []
    if small:
        gathered = batch.take(pa.array(np.concatenate(small), pa.int64()))
        values = [column.to_pylist() for column in gathered.columns]
    pieces: list[RefPiece] = []
    start = 0
    for positions in groups:
        if len(positions) >= SMALL_PIECE_ROWS:
            pieces.append(batch.take(pa.array(positions, pa.int64())))
            continue
        end = start + len(positions)
        pieces.append(tuple(column[start:end] for column in values))
        start = end
    return pieces


class SpilledPiece(NamedTuple):
    """A RefPiece parked in a spill file (transforms/spill.py): an Arrow IPC stream of one
    RecordBatch at bytes [offset, offset + length) of `path`, holding `rows` records."""

    path: str
    offset: int
    length: int
    rows: int


def piece_rows(piece: RefPiece) -> int:
    """How many records a RefPiece holds."""
    return piece.num_rows if isinstance(piece, pa.RecordBatch) else len(piece[0])


def concat_batches(pieces: Iterable[RefPiece]) -> pa.RecordBatch:
    """One columnar batch of RecordRefs holding those of `pieces` (RefPieces), in order."""
    return _one_batch(ref_table(pieces))


def ordered_batch(pieces: Iterable[RefPiece]) -> pa.RecordBatch:
    """The records of `pieces` in one batch, in order-key order."""
    return in_order(ref_table(pieces))


def in_order(table: pa.Table, order: np.ndarray | None = None) -> pa.RecordBatch:
    """A table's records in one batch, in order-key order (bytewise, as Python sorts bytes):
    each column is copied once, by the take that sorts. `order`: the table's `sort_order`,
    when it is known already."""
    return _one_batch(table.take(sort_order(table) if order is None else order))


def sort_order(table: pa.Table) -> np.ndarray:
    """The positions of a table's records in order-key order (bytewise, as Python sorts
    bytes)."""
    return pa.compute.sort_indices(table.column("order")).to_numpy()


def ref_table(pieces: Iterable[RefPiece]) -> pa.Table:
    """The records of `pieces` (RefPieces) as a Table whose chunks are their batches, not
    copied; pieces of plain columns are gathered into batches between them."""
    batches: list[pa.RecordBatch] = []
    pending: list[list] = [[] for _ in REF_SCHEMA]
    for piece in pieces:
        if isinstance(piece, pa.RecordBatch):
            batches.append(_columns_batch(pending))
            batches.append(piece)
        else:
            for mine, theirs in zip(pending, piece, strict=True):
                mine.extend(theirs)
    batches.append(_columns_batch(pending))
    return pa.Table.from_batches([b for b in batches if b.num_rows], schema=REF_SCHEMA)


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    """A table's records as one RecordBatch (a column already in one chunk is not copied)."""
    columns = []
    for column in table.columns:
        if column.num_chunks == 1:
            columns.append(column.chunk(0))
        elif column.num_chunks:
            columns.append(column.combine_chunks())
        else:
            columns.append(pa.array([], column.type))
    return pa.RecordBatch.from_arrays(columns, schema=table.schema)


def _columns_batch(pending: list[list]) -> pa.RecordBatch:
    """The records gathered in `pending` (column lists) as a RecordBatch; `pending` emptied."""
    batch = pa.record_batch(
        [pa.array(values, f.type) for values, f in zip(pending, REF_SCHEMA, strict=True)],
        schema=REF_SCHEMA,
    )
    for values in pending:
        values.clear()
    return batch


def refs_of(piece: RefPiece | pa.Table) -> list[RecordRef]:
    """The RecordRefs of a columnar batch (or RefPiece), in its order."""
    if isinstance(piece, tuple):
        columns = piece
    else:
        columns = [piece.column(name).to_pylist() for name in REF_SCHEMA.names]
    return [RecordRef._make(values) for values in zip(*columns, strict=True)]


class ErrorRecord(NamedTuple):
    """One quarantined input: where it came from, at which stage it failed, and why.

    `offset`: for a record of a TFRecord file, the byte offset of its frame (in the
    decompressed stream of a gzip file).
    """

    path: str
    row: int | None
    stage: str
    error: str
    message: str
    offset: int | None = None

    def to_json_line(self) -> str:
        # A file name that is not UTF-8 appears escaped (core.files.filenames), in the path and in
        # the message alike.
        source = {"path": display(self.path)}
        if self.row is not None:
            source["row"] = self.row
        if self.offset is not None:
            source["offset"] = self.offset
        message = display(self.message)
        line = {"source": source, "stage": self.stage, "error": self.error, "message": message}
        return json.dumps(line, ensure_ascii=False, sort_keys=True)

    def sort_key(self) -> tuple:
        row = self.row if self.row is not None else -1
        return (
            self.path,
            row,
            self.offset if self.offset is not None else -1,
            self.error,
            self.message,
        )


class ShardResult(NamedTuple):
    """A shard file, written; `label_counts` is ((class id, records), ...) by id.

    `staged` pairs each temporary file with its final path (the shard, and its index file): the
    commit renames them all into place, so an interrupted run leaves nothing under final names.
    """

    split: str
    index: int
    num_shards: int
    file: str
    num_records: int
    num_bytes: int
    index_file: str | None = None  # its record index, with --write-index
    label_counts: tuple[tuple[int, int], ...] = ()
    staged: tuple[tuple[str, str], ...] = ()


class ErrorFileResult(NamedTuple):
    """An errors file, written, with its line count per error kind; `staged` as in ShardResult."""

    file: str
    stage: str
    count: int
    by_kind: tuple[tuple[str, int], ...]
    staged: tuple[tuple[str, str], ...] = ()


# Stages named in error records (and the errors files they go to).
STAGE_DISCOVER = "discover"
STAGE_READ = "read"
STAGE_PROBE = "probe"
STAGE_RECORD = "record"
STAGE_WRITE = "write"


class InputCounts(NamedTuple):
    """How many inputs a run found, and how many failed before writing began."""

    num_inputs: int
    early_errors: int
