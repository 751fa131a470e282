"""Tables without images: CSV files read and built into records in one step, column-wise."""

from __future__ import annotations

import collections

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from schemas.csv_schema import CsvSchema
from schemas.features import FeatureTally
from transforms.combiners import TallyCombineFn
from transforms.core.csv_rows import RowError, read_csv_batches
from transforms.core.errors import InputError
from transforms.core.labels import LabelMap, LabelTally, resolve_labels
from transforms.core.paths import relative_path
from transforms.core.records import CsvRoles, Source
from transforms.core.table_records import TableRecords
from transforms.discover import read_error
from transforms.progress import Progress

ERRORS = "errors"
TALLY = "tally"
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
    Also has `labels`: the run's LabelMap (one element). Text labels are numbered by the sorted
    class names of every good row, so those take a first pass over the files (read and
    validated, not encoded); without text labels no pass is needed.
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
        ).with_outputs(ERRORS, TALLY, main="records")
        return {
            "records": built.records,
            ERRORS: built[ERRORS],
            TALLY: built[TALLY],
            "labels": labels,
        }


def _add_label_texts(tally: LabelTally, source_and_texts) -> None:
    source, texts = source_and_texts
    for text in texts:
        tally.add(source, None, text)


class _ReadTableFn(beam.DoFn):
    """(Source, CSV path) → RecordRef batches; bad rows and files → `errors`; TALLY per bundle.

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
        relative = relative_path(path, source.root)
        labels: set[str] = set()
        last_row = None
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as stream:
                batches = read_csv_batches(
                    stream, self._args[0], source_name=relative, block_size=_BLOCK_BYTES
                )
                for item in batches:
                    if isinstance(item, RowError):
                        last_row = item.row
                        if not self._collect_labels:
                            yield read_error(path, item.row, item.error)
                        continue
                    if item.num_rows:
                        last_row = int(item.rows[-1])
                    elif item.skipped:
                        last_row = item.skipped[-1].row
                    chunk = self._records.make(
                        item,
                        source.index,
                        path,
                        relative,
                        None if self._collect_labels else label_map,
                        with_examples=self._with_examples,
                    )
                    self._progress.add(item.num_rows)
                    if self._collect_labels:
                        labels.update(chunk.labels)
                        continue
                    for error in chunk.errors:
                        yield beam.pvalue.TaggedOutput(ERRORS, error)
                    if chunk.refs is not None:
                        yield chunk.refs
                    self._shapes.update(dict(chunk.shapes))
        except InputError as error:
            if not self._collect_labels:
                yield read_error(path, None, error, after_row=last_row)
        except OSError as error:
            if not self._collect_labels:
                error = InputError("UnreadableCsv", str(error))
                yield read_error(path, None, error, after_row=last_row)
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
