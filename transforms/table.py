"""Tables without images: CSV files read column-wise, encoded once, parked until the plan.

ReadTable reads each file once (after a pass over its labels when labels are texts): it sizes
the records for the plan, reports bad rows, and parks each encoded block of rows in a spill
file; once the plan exists, PlaceTable reads the blocks back and places their records into
shards. Encoded records never wait for the plan in the runner's memory, and cross the shuffle
as references to spill files (transforms/spill.py). A large file is first split into byte
ranges of whole records (core.tables.ranges), and its ranges are read by whichever workers
get them.
"""

from __future__ import annotations

import collections
import contextlib

import apache_beam as beam

from recordforge.schemas.csv.schema import CsvSchema
from recordforge.schemas.features import FeatureTally
from recordforge.transforms.combiners import TallyCombineFn
from recordforge.transforms.core.errors import InputChanged, InputError
from recordforge.transforms.core.files.paths import is_compressed_csv, relative_path
from recordforge.transforms.core.planning.labels import (
    LabelMap,
    LabelTally,
    UnknownLabel,
    resolve_labels,
)
from recordforge.transforms.core.planning.placement import place_batch
from recordforge.transforms.core.records import (
    CsvRoles,
    Source,
    SpilledPiece,
    concat_batches,
    is_small_piece,
    without_examples,
)
from recordforge.transforms.core.tables.background import ahead
from recordforge.transforms.core.tables.fingerprint import FileFingerprint, FingerprintingStream
from recordforge.transforms.core.tables.ranges import WHOLE, CsvRange, split_csv
from recordforge.transforms.core.tables.receipts import CsvReceipt
from recordforge.transforms.core.tables.records import TableRecords
from recordforge.transforms.core.tables.rows import CsvEnd, RowError, read_csv_batches
from recordforge.transforms.core.tables.stream import CsvReadFailure
from recordforge.transforms.discover import (
    RECEIPTS,
    incomplete,
    read_error,
    receipt_of,
)
from recordforge.transforms.internals import in_global_window
from recordforge.transforms.progress import INPUTS_LISTED, Progress
from recordforge.transforms.remote_reads import open_csv, open_csv_range
from recordforge.transforms.shard import CUT, SettleCutBuckets, WholeShards
from recordforge.transforms.spill import SpillWriter, unspilled
from recordforge.transforms.storage_errors import STORAGE_ERRORS, storage_reason

ERRORS = "errors"
TALLY = "tally"
BLOCKS = "blocks"
READ_FILES = "read_files"
# pyarrow parses this much CSV at a time: each batch of rows is encoded by a few dozen array
# operations, so larger batches spread their fixed cost thinner. It must hold the longest row.
_BLOCK_BYTES = 4 << 20


class ReadTable(beam.PTransform):
    """(Source, CSV path) of tables without images → columnar batches of RecordRefs.

    Reading and building in one step, a batch of rows at a time: rows never cross a stage
    boundary one by one, and no Python code runs per cell. Input: PCollection[(Source, str)].
    Outputs (tagged):
        records: PCollection[pyarrow.RecordBatch] of RecordRefs (records.REF_SCHEMA), sized;
            with Example bytes only when `with_examples` and no `spill_dir`.
        errors: PCollection[ErrorRecord] for bad rows and files.
        tally: PCollection[FeatureTally], partial counts of which features records hold.
        blocks: with `spill_dir`, PCollection[SpilledPiece]: each batch of records, encoded
            (Example bytes included), parked in a spill file there (for PlaceTable).
    Also has `labels`: the run's LabelMap (one element). Text labels are numbered by the
    sorted class names of every good row, so those take a first pass over the files (read and
    validated, not encoded), and the second read of a file must see what the first saw (else
    InputChanged names it); without text labels each file is read once.

    With `range_bytes`, each uncompressed file larger than that is first split into ranges of
    about that size (SplitCsvFiles: one sequential pass over the file's bytes, see
    core.tables.ranges), and each range is a task of its own; else each file is one task.
    `range_multiple`: a split file's ranges come in a multiple of this many (the local runner's
    worker processes, which it deals tasks to in turn).
    """

    def __init__(
        self,
        schema: CsvSchema,
        roles: CsvRoles,
        *,
        splits,
        salt: str,
        label_mode: str,
        source_indices,
        with_examples: bool = True,
        spill_dir: str | None = None,
        range_bytes: int | None = None,
        range_multiple: int = 1,
    ) -> None:
        super().__init__()
        self._args = (schema, roles, tuple(splits), salt)
        self._label_args = (tuple(source_indices), label_mode, bool(roles.label_column))
        self._with_examples = with_examples or spill_dir is not None
        self._spill_dir = spill_dir
        self._range_bytes = range_bytes
        self._range_multiple = range_multiple

    def expand(self, csv_files):
        schema, roles, splits, salt = self._args
        source_indices, mode, labelled = self._label_args
        # One CSV file per task: spread files over workers before reading.
        files = csv_files | "SpreadCsvFiles" >> beam.Reshuffle()
        if self._range_bytes:
            # Then one range per task: the ranges of a large file spread over workers.
            files = (
                files
                | "SplitCsvFiles"
                >> beam.ParDo(_SplitCsvFn(schema, self._range_bytes, self._range_multiple))
                | "SpreadCsvRanges" >> beam.Reshuffle()
            )
        else:
            files = files | "WholeCsvFiles" >> beam.Map(lambda file: (*file, WHOLE))
        if TableRecords(schema, roles, splits, salt).text_labels:
            read_labels = files | "ReadLabels" >> beam.ParDo(
                _ReadTableFn(*self._args, collect_labels=True)
            ).with_outputs(READ_FILES, main="labels")
            labels = (
                read_labels.labels
                | "TallyLabels"
                >> beam.CombineGlobally(TallyCombineFn(LabelTally, _add_label_texts))
                | "ResolveLabels" >> beam.Map(resolve_labels, [], source_indices, mode, labelled)
            )
            files = read_labels[READ_FILES]  # (Source, path, CsvRange, FileFingerprint)
        else:
            label_map = resolve_labels(LabelTally(), [], source_indices, mode, labelled)
            labels = csv_files.pipeline | "Labels" >> beam.Create([label_map])
        built = files | "ReadAndBuild" >> beam.ParDo(
            _ReadTableFn(*self._args, with_examples=self._with_examples, spill_dir=self._spill_dir),
            beam.pvalue.AsSingleton(labels),
        ).with_outputs(ERRORS, TALLY, BLOCKS, RECEIPTS, main="records")
        return {
            "records": built.records,
            ERRORS: built[ERRORS],
            TALLY: built[TALLY],
            BLOCKS: built[BLOCKS],
            RECEIPTS: built[RECEIPTS],
            "labels": labels,
        }


def _add_label_texts(tally: LabelTally, source_and_texts) -> None:
    source, texts = source_and_texts
    for text in texts:
        tally.add(source, None, text)


class _SplitCsvFn(beam.DoFn):
    """(Source, CSV path) → (Source, path, CsvRange) for each range of the file (one, WHOLE,
    for a file not split: see core.tables.ranges)."""

    def __init__(self, schema: CsvSchema, range_bytes: int, range_multiple: int = 1) -> None:
        self._delimiter = schema.delimiter
        self._header = schema.expected_header
        self._range_bytes = range_bytes
        self._range_multiple = range_multiple

    def process(self, file: tuple):
        source, path = file
        for part in self._ranges(path):
            yield source, path, part

    def _ranges(self, path: str) -> tuple[CsvRange, ...]:
        if is_compressed_csv(path):
            return (WHOLE,)
        try:
            with open_csv(path) as opened:
                if opened.compressed or opened.stored_size <= self._range_bytes:
                    return (WHOLE,)
                return split_csv(
                    opened.stream,
                    delimiter=self._delimiter,
                    header=self._header,
                    range_bytes=self._range_bytes,
                    count_multiple=self._range_multiple,
                    stored_size=opened.stored_size,
                )
        except (InputError, *STORAGE_ERRORS):
            return (WHOLE,)  # read whole, its reading reports what is wrong


class _ReadTableFn(beam.DoFn):
    """(Source, CSV path, CsvRange[, FileFingerprint of an earlier read]) → RecordRef batches;
    bad rows and files → ERRORS; TALLY per bundle; with a spill folder, encoded batches →
    BLOCKS.

    With `collect_labels`, it yields (source index, text labels of the good rows) instead, and
    (Source, path, CsvRange, FileFingerprint) per range → READ_FILES.
    """

    def __init__(
        self,
        schema: CsvSchema,
        roles: CsvRoles,
        splits,
        salt: str,
        *,
        with_examples: bool = True,
        collect_labels: bool = False,
        spill_dir: str | None = None,
    ) -> None:
        self._args = (schema, roles, splits, salt)
        self._with_examples = with_examples
        self._collect_labels = collect_labels
        self._spill_dir = spill_dir

    def setup(self):
        self._records = TableRecords(*self._args)
        self._shapes: collections.Counter = collections.Counter()
        if self._collect_labels:
            self._progress = Progress("csv_label_rows_read", "read labels of", "CSV rows")
        else:
            self._progress = Progress("csv_rows_read", "read", "CSV rows", phase=INPUTS_LISTED)

    def process(self, file: tuple, label_map: LabelMap | None = None):
        source, path, part = file[:3]
        first_read = file[3] if len(file) > 3 else None
        try:
            yield from self._read(source, path, part, first_read, label_map)
        except UnknownLabel as error:
            if first_read is None:
                raise
            raise InputChanged(
                f"{path} changed during the conversion (a row has the class name "
                f"{error.args[0][:40]!r}, which its first read did not); nothing was written: "
                "convert it again once it no longer changes"
            ) from None

    def _read(
        self, source: Source, path: str, part: CsvRange, first_read, label_map: LabelMap | None
    ):
        labels: set[str] = set()
        chunks = _read_chunks(
            self._records,
            source,
            path,
            part,
            None if self._collect_labels else label_map,
            with_examples=self._with_examples,
            fingerprint=self._collect_labels or first_read is not None,
        )
        with contextlib.ExitStack() as stack:
            spill = None
            if self._spill_dir and not self._collect_labels:
                spill = stack.enter_context(SpillWriter(self._spill_dir))
            for item in chunks:
                if isinstance(item, beam.pvalue.TaggedOutput):  # a row or the file failed
                    if not self._collect_labels:
                        yield item
                    continue
                if isinstance(item, CsvReceipt):
                    if not self._collect_labels:
                        yield beam.pvalue.TaggedOutput(RECEIPTS, item)
                    continue
                if isinstance(item, FileFingerprint):
                    if self._collect_labels:
                        yield beam.pvalue.TaggedOutput(READ_FILES, (source, path, part, item))
                    elif first_read is not None:
                        _check_unchanged(path, first_read, item)
                    continue
                num_rows, chunk = item
                self._progress.add(num_rows)
                if self._collect_labels:
                    labels.update(chunk.labels)
                    continue
                for error in chunk.errors:
                    yield beam.pvalue.TaggedOutput(ERRORS, error)
                if chunk.refs is not None:
                    refs = chunk.refs
                    if spill is not None:
                        # The bytes wait in the spill file; the plan needs only the sizes.
                        yield beam.pvalue.TaggedOutput(BLOCKS, spill.add(refs))
                        refs = without_examples(refs)
                    yield refs
                self._shapes.update(dict(chunk.shapes))
        if self._collect_labels:
            yield (source.index, sorted(labels))

    def finish_bundle(self):
        if self._collect_labels:
            return
        tally = FeatureTally()
        for counts, times in self._shapes.items():
            tally.add(counts, times)
        self._shapes.clear()
        # One tally per bundle, not an element per record.
        yield beam.pvalue.TaggedOutput(TALLY, in_global_window(tally))


def _read_chunks(
    records: TableRecords,
    source: Source,
    path: str,
    part: CsvRange,
    label_map: LabelMap | None,
    *,
    with_examples: bool,
    fingerprint: bool = False,
):
    """The batches of rows of one CSV file (or of one range of it, `part`) as (rows in the
    batch, TableChunk), in file order, and the rows and the file that could not be read as
    ERRORS outputs (ErrorRecords); then the file's (or range's) CsvReceipt; last, with
    `fingerprint`, the read's FileFingerprint.

    Raises:
        InputIncomplete: the file cannot be read to its end (for a range: to the range's end).
        InputChanged: a range does not hold what the splitting found there.
    """
    relative = relative_path(path, source.root)
    last_row = None
    rows = 0  # rows parsed (good or not)
    opener = open_csv(path) if part.whole else open_csv_range(path, part.start, part.end)
    try:
        with opener as opened:
            if not part.whole and opened.stored_size != part.stored_size:
                raise _range_changed(path, part, f"its size is now {opened.stored_size:,} bytes")
            stream = FingerprintingStream(opened.stream) if fingerprint else opened.stream
            # The next block is parsed on a thread (pyarrow releases the GIL) while this one
            # is encoded.
            batches = ahead(
                read_csv_batches(
                    stream,
                    records.schema,
                    source_name=relative,
                    block_size=_BLOCK_BYTES,
                    part=part,
                )
            )
            for item in batches:
                if isinstance(item, CsvEnd):
                    if not part.whole and item.rows != part.rows:
                        raise _range_changed(path, part, f"it now holds {item.rows:,} rows")
                    yield receipt_of(path, item, opened, part)
                    continue
                if isinstance(item, RowError):
                    last_row = item.row
                    yield read_error(path, item.row, item.error)
                    continue
                if item.num_rows:
                    last_row = int(item.rows[-1])
                elif item.skipped:
                    last_row = item.skipped[-1].row
                chunk = records.make(
                    item,
                    source.index,
                    path,
                    relative,
                    label_map,
                    with_examples=with_examples,
                    split=source.split,
                )
                rows += item.num_rows
                yield item.num_rows, chunk
    except CsvReadFailure as failure:
        raise incomplete(path, failure, last_row) from None
    except InputError as error:
        if not part.whole:  # the other ranges' rows are records: this one cannot be an error
            raise _range_failed(path, part, error.message, last_row) from None
        yield read_error(path, None, error, after_row=last_row)
    except STORAGE_ERRORS as error:  # the file cannot be opened
        error = InputError("UnreadableCsv", f"cannot open it: {storage_reason(error)}")
        if not part.whole:
            raise _range_failed(path, part, error.message, last_row) from None
        yield read_error(path, None, error, after_row=last_row)
    else:
        if fingerprint:
            yield stream.fingerprint(rows)
        return
    yield CsvReceipt(path, quarantined=True)
    if fingerprint:  # the file is one error record: its fingerprint is its row count only
        yield FileFingerprint(-1, -1, rows)


class PlaceTable(beam.PTransform):
    """Spilled blocks of a table's encoded records → the records in pieces by shard.

    Once the plan exists, each block ReadTable parked is read back (one ranged read) and its
    records placed: each shard's piece of the block is parked again, in a spill file of
    `spill_dir`, and only its reference (SpilledPiece) travels on; small pieces and the
    records of cut buckets travel as they are.

    Input: PCollection[SpilledPiece], the `blocks` output of ReadTable. Output:
    PCollection[((split, shard), RefPiece | SpilledPiece)], for WriteShards.
    """

    def __init__(self, *, layouts, spill_dir: str) -> None:
        super().__init__()
        self._fn = _PlaceTableFn(spill_dir)
        self._layouts = layouts

    def expand(self, blocks):
        placed = blocks | "Place" >> beam.ParDo(
            self._fn, beam.pvalue.AsSingleton(self._layouts)
        ).with_outputs(CUT, main="pieces")
        settled = placed[CUT] | SettleCutBuckets(self._layouts)
        return (placed.pieces, settled) | "AllTablePieces" >> beam.Flatten()


class _PlaceTableFn(beam.DoFn):
    """SpilledPiece of a block → ((split, shard), piece); pieces of cut buckets → CUT."""

    def __init__(self, spill_dir: str) -> None:
        self._spill_dir = spill_dir

    def setup(self):
        self._whole = WholeShards()
        self._progress = Progress("csv_rows_placed", "placed", "CSV rows")

    def start_bundle(self):
        self._spill = SpillWriter(self._spill_dir)

    def process(self, block: SpilledPiece, layouts):
        whole = self._whole.of(layouts)
        for batch in unspilled([block]):
            self._progress.add(batch.num_rows)
            pieces, cut = place_batch(batch, whole)
            for piece in cut:
                yield beam.pvalue.TaggedOutput(CUT, piece)
            for key, piece in pieces:
                if not is_small_piece(piece):
                    piece = self._spill.add(concat_batches([piece]))
                yield key, piece

    def finish_bundle(self):
        # Pieces are read back in a later stage, after this bundle is done.
        self._spill.close()

    def teardown(self):
        # After a failed bundle (a finished one's file is closed already: nothing to do).
        if getattr(self, "_spill", None) is not None:
            self._spill.discard()


def _range_changed(path: str, part: CsvRange, now: str) -> InputChanged:
    return InputChanged(
        f"{path} changed during the conversion ({part.describe()} held {part.rows:,} rows of a "
        f"{part.stored_size:,}-byte file when it was split; {now}); nothing was written: "
        "convert it again once it no longer changes"
    )


def _range_failed(path: str, part: CsvRange, reason: str, last_row: int | None):
    """The run-ending error of a range of a file that could not be read (the file's other
    ranges may have become records: it cannot be one error record, as a whole file can)."""
    return incomplete(path, CsvReadFailure(reason, part.start, part.first_row - 1), last_row)


def _check_unchanged(path: str, first: FileFingerprint, second: FileFingerprint) -> None:
    if second.differs_from(first):
        seen = f"read first as {first.describe()}, then as {second.describe()}"
        if first.describe() == second.describe():  # the same size and rows: other bytes
            seen = f"read twice as {first.describe()}, with other bytes the second time"
        raise InputChanged(
            f"{path} changed during the conversion ({seen}); nothing was written: convert it "
            "again once it no longer changes"
        )
