"""Tables without images: CSV files read column-wise, twice in a conversion.

ReadTable sizes the records (for the plan) and reports bad rows; PlaceTable reads the files
again once the plan exists, encodes the records and places them into shards. Encoded records
are never held waiting for the plan, and cross the shuffle as references to spill files.
"""

from __future__ import annotations

import collections
import contextlib

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from schemas.csv_schema import CsvSchema
from schemas.features import FeatureTally
from transforms.combiners import TallyCombineFn
from transforms.core.background import ahead
from transforms.core.csv_rows import RowError, read_csv_batches
from transforms.core.errors import InputChanged, InputError
from transforms.core.fingerprint import FileFingerprint, FingerprintingStream
from transforms.core.labels import LabelMap, LabelTally, resolve_labels
from transforms.core.paths import relative_path
from transforms.core.placement import place_batch
from transforms.core.records import CsvRoles, Source
from transforms.core.table_records import TableRecords
from transforms.discover import read_error
from transforms.progress import Progress
from transforms.shard import CUT, SettleCutBuckets, WholeShards
from transforms.spill import SpillWriter

ERRORS = "errors"
TALLY = "tally"
READ_FILES = "read_files"
# pyarrow parses this much CSV at a time: each batch of rows is encoded by a few dozen array
# operations, so larger batches spread their fixed cost thinner. It must hold the longest row.
_BLOCK_BYTES = 4 << 20


class ReadTable(beam.PTransform):
    """(Source, CSV path) of tables without images → columnar batches of finished RecordRefs.

    Reading and building in one step, a batch of rows at a time: rows never cross a stage
    boundary one by one, and no Python code runs per cell. Input: PCollection[(Source, str)].
    Outputs (tagged):
        main: PCollection[pyarrow.RecordBatch] of RecordRefs (records.REF_SCHEMA).
        errors: PCollection[ErrorRecord] for bad rows and files.
        tally: PCollection[FeatureTally], partial counts of which features records hold.
    Also has `labels`: the run's LabelMap (one element), and `files`: (Source, path,
    FileFingerprint) of each file read (for PlaceTable's second read, which must see the same
    file). Text labels are numbered by the sorted class names of every good row, so those take
    a first pass over the files (read and validated, not encoded); without text labels no
    pass is needed. With `with_examples=False` the records
    are sized but carry no Example bytes (planning, and the first pass of a conversion).
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
    ) -> None:
        super().__init__()
        self._args = (schema, roles, tuple(splits), salt)
        self._label_args = (tuple(source_indices), label_mode, bool(roles.label_column))
        self._with_examples = with_examples

    def expand(self, csv_files):
        schema, roles, splits, salt = self._args
        source_indices, mode, labelled = self._label_args
        # One CSV file per task: spread files over workers before reading.
        files = csv_files | "SpreadCsvFiles" >> beam.Reshuffle()
        if TableRecords(schema, roles, splits, salt).text_labels:
            labels = (
                files
                | "ReadLabels" >> beam.ParDo(_ReadTableFn(*self._args, collect_labels=True))
                | "TallyLabels"
                >> beam.CombineGlobally(TallyCombineFn(LabelTally, _add_label_texts))
                | "ResolveLabels" >> beam.Map(resolve_labels, [], source_indices, mode, labelled)
            )
        else:
            label_map = resolve_labels(LabelTally(), [], source_indices, mode, labelled)
            labels = csv_files.pipeline | "Labels" >> beam.Create([label_map])
        built = files | "ReadAndBuild" >> beam.ParDo(
            _ReadTableFn(*self._args, with_examples=self._with_examples),
            beam.pvalue.AsSingleton(labels),
        ).with_outputs(ERRORS, TALLY, READ_FILES, main="records")
        return {
            "records": built.records,
            ERRORS: built[ERRORS],
            TALLY: built[TALLY],
            "labels": labels,
            "files": built[READ_FILES],
        }


def _add_label_texts(tally: LabelTally, source_and_texts) -> None:
    source, texts = source_and_texts
    for text in texts:
        tally.add(source, None, text)


class _ReadTableFn(beam.DoFn):
    """(Source, CSV path) → RecordRef batches; bad rows and files → `errors`; TALLY per bundle;
    (Source, path, FileFingerprint) per file → READ_FILES.

    With `collect_labels`, it yields (source index, text labels of the good rows) instead.
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
    ) -> None:
        self._args = (schema, roles, splits, salt)
        self._with_examples = with_examples
        self._collect_labels = collect_labels

    def setup(self):
        self._records = TableRecords(*self._args)
        self._shapes: collections.Counter = collections.Counter()
        if self._collect_labels:
            self._progress = Progress("csv_label_rows_read", "read labels of", "CSV rows")
        else:
            self._progress = Progress("csv_rows_read", "read", "CSV rows")

    def process(self, source_and_path: tuple[Source, str], label_map: LabelMap | None = None):
        source, path = source_and_path
        labels: set[str] = set()
        chunks = _read_chunks(
            self._records,
            source,
            path,
            None if self._collect_labels else label_map,
            with_examples=self._with_examples,
        )
        for item in chunks:
            if isinstance(item, beam.pvalue.TaggedOutput):  # a row or the file failed
                if not self._collect_labels:
                    yield item
                continue
            if isinstance(item, FileFingerprint):
                if not self._collect_labels:
                    yield beam.pvalue.TaggedOutput(READ_FILES, (source, path, item))
                continue
            num_rows, chunk = item
            self._progress.add(num_rows)
            if self._collect_labels:
                labels.update(chunk.labels)
                continue
            for error in chunk.errors:
                yield beam.pvalue.TaggedOutput(ERRORS, error)
            if chunk.refs is not None:
                yield chunk.refs
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
        yield beam.pvalue.TaggedOutput(TALLY, WindowedValue(tally, MIN_TIMESTAMP, [GlobalWindow()]))


def _read_chunks(
    records: TableRecords,
    source: Source,
    path: str,
    label_map: LabelMap | None,
    *,
    with_examples: bool,
    with_shapes: bool = True,
):
    """One CSV file's batches of rows as (rows in the batch, TableChunk), in file order, and
    the rows and the file that could not be read as ERRORS outputs (ErrorRecords); last, the
    read's FileFingerprint."""
    relative = relative_path(path, source.root)
    last_row = None
    made = 0  # records
    stream = None
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as raw:
            stream = FingerprintingStream(raw)
            # The next block is parsed on a thread (pyarrow releases the GIL) while this one
            # is encoded.
            batches = ahead(
                read_csv_batches(
                    stream, records.schema, source_name=relative, block_size=_BLOCK_BYTES
                )
            )
            for item in batches:
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
                    with_shapes=with_shapes,
                )
                if chunk.refs is not None:
                    made += chunk.refs.num_rows
                yield item.num_rows, chunk
    except InputError as error:
        yield read_error(path, None, error, after_row=last_row)
    except OSError as error:
        error = InputError("UnreadableCsv", str(error))
        yield read_error(path, None, error, after_row=last_row)
    else:
        yield stream.fingerprint(made)
        return
    # How far a failed read got depends on pyarrow's read-ahead: compare its records only.
    yield FileFingerprint(-1, -1, made)


class PlaceTable(beam.PTransform):
    """(Source, CSV path) → the tables' records, encoded, in pieces by shard.

    The second read of the files, once the plan exists: ReadTable's pass sized the records
    (and reported every bad row and file), this one encodes them and places each straight into
    its shard, so encoded records never wait for the plan in the runner's memory. With
    `spill_dir`, pieces are parked in spill files there and only references (SpilledPiece)
    travel on (transforms/spill.py); small pieces travel as they are.

    A file whose second read differs from its first (FileFingerprint: bytes, CRC32C, records)
    changed during the run: the step raises InputChanged naming it, and the run ends without
    a manifest.

    Input: PCollection[(Source, str, FileFingerprint)], the `files` output of ReadTable. Output:
    PCollection[((split, shard), RefPiece | SpilledPiece)], for WriteShards.
    """

    def __init__(
        self,
        schema: CsvSchema,
        roles: CsvRoles,
        *,
        splits,
        salt: str,
        labels,
        layouts,
        spill_dir: str | None = None,
    ) -> None:
        super().__init__()
        self._fn = _PlaceTableFn(schema, roles, tuple(splits), salt, spill_dir)
        self._labels = labels
        self._layouts = layouts

    def expand(self, files):
        placed = files | "EncodeAndPlace" >> beam.ParDo(
            self._fn,
            beam.pvalue.AsSingleton(self._labels),
            beam.pvalue.AsSingleton(self._layouts),
        ).with_outputs(CUT, main="pieces")
        settled = placed[CUT] | SettleCutBuckets(self._layouts)
        return (placed.pieces, settled) | "AllTablePieces" >> beam.Flatten()


class _PlaceTableFn(beam.DoFn):
    """(Source, CSV path, FileFingerprint) → ((split, shard), piece); cut buckets' → CUT.

    Bad rows and files are skipped: ReadTable's pass reported them. A file that reads
    differently this time (it changed during the run) raises InputChanged.
    """

    def __init__(self, schema: CsvSchema, roles: CsvRoles, splits, salt: str, spill_dir) -> None:
        self._args = (schema, roles, splits, salt)
        self._spill_dir = spill_dir

    def setup(self):
        self._records = TableRecords(*self._args)
        self._whole = WholeShards()
        self._progress = Progress("csv_rows_encoded", "encoded", "CSV rows")

    def process(self, file_read: tuple[Source, str, FileFingerprint], label_map, layouts):
        source, path, first_read = file_read
        whole = self._whole.of(layouts)
        with contextlib.ExitStack() as stack:
            spill = stack.enter_context(SpillWriter(self._spill_dir)) if self._spill_dir else None
            chunks = _read_chunks(
                self._records, source, path, label_map, with_examples=True, with_shapes=False
            )
            for item in chunks:
                if isinstance(item, beam.pvalue.TaggedOutput):
                    continue  # reported by ReadTable
                if isinstance(item, FileFingerprint):
                    _check_unchanged(path, first_read, item)
                    continue
                num_rows, chunk = item
                self._progress.add(num_rows)
                if chunk.refs is None:
                    continue
                pieces, cut = place_batch(chunk.refs, whole)
                for piece in cut:
                    yield beam.pvalue.TaggedOutput(CUT, piece)
                for key, piece in pieces:
                    if spill is not None and isinstance(piece, pa.RecordBatch):
                        piece = spill.add(piece)
                    yield key, piece


def _check_unchanged(path: str, first: FileFingerprint, second: FileFingerprint) -> None:
    if second.differs_from(first):
        raise InputChanged(
            f"{path} changed during the conversion (read first as {first.describe()}, then "
            f"as {second.describe()}); nothing was written: convert it again once it no "
            "longer changes"
        )
