"""Datasets of records that arrive serialized: WriteDataset's and reshard's one graph.

Both paths start with tf.train.Example records that exist already: WriteDataset's in a user's
PCollection, reshard's in TFRecord files. Their first step parks them: each record is checked,
keyed by its bytes, given a split and sized (core/tfrecord/serialized.py), and each block of
records is appended to a spill file in the run's temporary folder (transforms/spill.py), as the
CSV table path parks its encoded rows. What goes on is what planning needs (sizes and order
keys), the blocks' references, the bad records and the features' tally. From there on the
graph is the conversion's: the same planner (PlanShards), the same placement of spilled blocks
(PlaceTable), writer (WriteShards), quarantine (WriteErrors) and commit (Commit). Record bytes
never cross a shuffle: blocks and pieces of them travel as references (SpilledPiece).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from recordforge.schemas.features import FeatureTally, FeatureType, InferredFeatures
from recordforge.transforms.combiners import CombineTogether, TallyCombineFn
from recordforge.transforms.commit import Commit, CommitConfig
from recordforge.transforms.convert import within_error_rate
from recordforge.transforms.core.errors import InputError, InputIncomplete
from recordforge.transforms.core.files import skipped
from recordforge.transforms.core.files.filenames import display
from recordforge.transforms.core.planning.labels import LabelMap
from recordforge.transforms.core.planning.sharding import ShardingConfig
from recordforge.transforms.core.records import (
    STAGE_DISCOVER,
    STAGE_READ,
    STAGE_RECORD,
    ErrorRecord,
    InputCounts,
    without_examples,
)
from recordforge.transforms.core.tfrecord.files import Problem, read_file_records
from recordforge.transforms.core.tfrecord.inputs import TFRecordInput
from recordforge.transforms.core.tfrecord.serialized import SerializedRecords, serialized_element
from recordforge.transforms.internals import in_global_window
from recordforge.transforms.progress import Progress
from recordforge.transforms.remote_reads import open_file
from recordforge.transforms.shard import PlanShards
from recordforge.transforms.spill import SpillWriter
from recordforge.transforms.staging import Staging, default_staging
from recordforge.transforms.storage_errors import (
    STORAGE_ERRORS,
    raise_process_limit,
    storage_reason,
)
from recordforge.transforms.table import PlaceTable
from recordforge.transforms.write import WriteErrors, WriteShards

ERRORS = "errors"
TALLY = "tally"
BLOCKS = "blocks"
# Where a WriteDataset record came from, in its error record: it has no file of its own.
WRITE_DATASET_INPUT = "WriteDataset input"


@dataclass(frozen=True)
class ExamplesConfig:
    """Everything that shapes a dataset of serialized records, resolved and validated.

    Attributes:
        output: the dataset folder.
        name: the prefix of shard file names.
        splits: (name, fraction) pairs for records that come without a split.
        configured_splits: the splits listed first in the manifest, in this order (the hashed
            ones); splits that records name are listed after them, sorted.
        salt: salts the split and order hashes.
        types: {key: FeatureType} from a feature schema (None: typed by the records alone).
        sharding: the planner's thresholds.
        compression: "none" or "gzip".
        write_index: write a record index file for each (uncompressed) shard.
        tfds: also write TensorFlow Datasets' metadata.
        max_error_rate: fail when more than this fraction of the records fail (None: never).
        run_id: the run's id (in its lock and commit journal).
        tool_version: recorded in the manifest.
        options: the options that shaped the output, recorded in the manifest.
        source: the inputs as the manifest records them.
        ignored: files skipped as not holding records (hidden files, a dataset's metadata).
        folder_links: links to folders met in the inputs' folders, not followed.
        staging: where the run stages its files and how it commits them (default: a JOURNAL
            staging inside `output`; the callers choose, see pipelines/output.py).
    """

    output: str
    name: str
    splits: tuple[tuple[str, float], ...] = (("train", 1.0),)
    configured_splits: tuple[str, ...] = ("train",)
    salt: str = "recordforge"
    types: Mapping[str, FeatureType] = field(default_factory=dict)
    sharding: ShardingConfig = ShardingConfig()
    compression: str = "none"
    write_index: bool = False
    tfds: bool = False
    max_error_rate: float | None = None
    run_id: str = "run"
    tool_version: str = "0"
    options: Mapping = field(default_factory=dict)
    source: Mapping = field(default_factory=dict)
    ignored: int = 0
    folder_links: int = 0
    staging: Staging | None = None
    overwrite: bool = False

    @property
    def staged(self) -> Staging:
        """The staging: the one given, or the default for the output folder."""
        return self.staging or default_staging(self.output)

    @property
    def spill_dir(self) -> str:
        return self.staged.spill

    def records(self) -> SerializedRecords:
        """A fresh builder of blocks, for one DoFn instance."""
        return SerializedRecords(self.splits, self.salt, self.types)

    def commit_config(self) -> CommitConfig:
        return CommitConfig(
            staging=self.staged,
            name=self.name,
            run_id=self.run_id,
            tool_version=self.tool_version,
            compression=self.compression,
            tfds=self.tfds,
            configured_splits=self.configured_splits,
            declared=InferredFeatures(self.types),
            max_error_rate=self.max_error_rate,
            plan_config=self.sharding.to_dict(),
            options=self.options,
            source=self.source,
            overwrite=self.overwrite,
        )


class WriteExamples(beam.PTransform):
    """Records that arrive serialized → the dataset: shards, errors files and the manifest.

    `park` is the path's first step: it turns its input (a user's PCollection, or the TFRecord
    files to read) into the four parked streams below. Output: PCollection holding the manifest
    as a dict. Every branch feeds the commit, so runners that run only the last branch of a
    pipeline (Dask) still do all the work.
    """

    def __init__(self, config: ExamplesConfig, park: beam.PTransform) -> None:
        super().__init__()
        self._config = config
        self._park = park

    def expand(self, pvalue):
        config = self._config
        pipeline = pvalue.pipeline
        # → records: RecordBatch of RecordRefs (REF_SCHEMA) without their Example bytes;
        #   blocks: SpilledPiece, the same RecordRefs whole, parked in a spill file;
        #   errors: ErrorRecord; tally: FeatureTally, one per file or bundle.
        parked = pvalue | "Park" >> self._park
        # → {split: SplitLayout}, one element.
        layouts = (
            parked["records"]
            | "PlanShards" >> PlanShards(config.sharding, config.configured_splits, assign=False)
        )["layouts"]
        # → ((split, shard), RefPiece | SpilledPiece): a shard's records, a piece per block.
        assigned = parked[BLOCKS] | "PlaceRecords" >> PlaceTable(
            layouts=layouts, spill_dir=config.spill_dir
        )
        # One global combine for both tallies below (a combine costs a stage or two).
        combined = pipeline | "Tallies" >> CombineTogether(
            {
                "Features": (parked[TALLY], TallyCombineFn(FeatureTally, FeatureTally.merge)),
                "Inputs": (
                    (
                        parked["records"]
                        | "CountRecords" >> beam.Map(lambda batch: (batch.num_rows, 0)),
                        parked[ERRORS] | "CountErrors" >> beam.Map(lambda _: (0, 1)),
                    ),
                    beam.combiners.TupleCombineFn(sum, sum),
                ),
            }
        )
        # → FeatureTally, one element; a key whose records hold two dtypes stops the run here.
        tally = combined["Features"] | "CheckFeatureTypes" >> beam.Map(
            _checked_tally, InferredFeatures(config.types)
        )
        # → InputCounts, one element: every record read or given, and every one that failed.
        counts = combined["Inputs"] | "InputCounts" >> beam.Map(
            lambda totals: InputCounts(sum(totals), totals[1])
        )
        # → bool, one element: False when more records failed than --max-error-rate allows.
        proceed = counts | "WithinErrorRate" >> beam.Map(within_error_rate, config.max_error_rate)
        # → shards: ShardResult, one per shard written under a temporary name; errors:
        #   ErrorRecord (none: complete records have no payload to fail at write time).
        written = assigned | "WriteShards" >> WriteShards(
            config.staged.parts,
            config.name,
            config.compression,
            layouts=layouts,
            proceed=proceed,
            write_index=config.write_index,
        )
        # → ErrorFileResult, one per stage with errors.
        error_files = (
            (parked[ERRORS], written[ERRORS])
            | "AllErrors" >> beam.Flatten()
            | "WriteErrors" >> WriteErrors(config.staged.parts)
        )
        # → the manifest, as a dict, once every file is in place.
        return (
            (written.shards, error_files)
            | "Results" >> beam.Flatten()
            | "Commit"
            >> Commit(
                config.commit_config(),
                layouts=layouts,
                labels=pipeline | "NoLabels" >> beam.Create([LabelMap()]),
                tally=tally,
                counts=counts,
                ignored=pipeline
                | "IgnoredFiles"
                >> beam.Create(
                    [{skipped.HIDDEN: config.ignored, skipped.FOLDER_LINKS: config.folder_links}]
                ),
            )
        )


def _checked_tally(tally: FeatureTally, inferred: InferredFeatures) -> FeatureTally:
    inferred.declare(tally)  # raises MixedFeatureTypes
    return tally


class ParkElements(beam.PTransform):
    """WriteDataset's first step: a user's records → parked blocks (see WriteExamples).

    Input: PCollection of serialized tf.train.Example bytes, tf.train.Example objects, dicts of
    feature values, or (split, one of those) pairs; in any windows (the dataset is one).
    """

    def __init__(self, config: ExamplesConfig) -> None:
        super().__init__()
        self._config = config

    def expand(self, elements):
        return (
            elements
            | "OneWindow" >> beam.WindowInto(GlobalWindows())
            | "ParkRecords"
            >> beam.ParDo(_ParkElementsFn(self._config)).with_outputs(
                ERRORS, TALLY, BLOCKS, main="records"
            )
        )


class ReadTFRecordFiles(beam.PTransform):
    """Reshard's first step: TFRecord files → parked blocks (see WriteExamples).

    Input: PBegin; the files are `inputs` (TFRecordInputs), one task each.
    """

    def __init__(self, config: ExamplesConfig, inputs: tuple[TFRecordInput, ...]) -> None:
        super().__init__()
        self._config = config
        self._inputs = tuple(inputs)

    def expand(self, pbegin):
        return (
            pbegin
            | "Files" >> beam.Create(self._inputs)
            # One file per task: spread the files over workers before reading.
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadRecords"
            >> beam.ParDo(_ReadTFRecordFilesFn(self._config)).with_outputs(
                ERRORS, TALLY, BLOCKS, main="records"
            )
        )


class _Parking:
    """Inside a DoFn: records in, blocks parked in a spill file, the four streams out.

    `add` and `flush` yield the main output (RecordBatch without Example bytes) and tagged
    BLOCKS and ERRORS outputs; `failed(origin, error)` makes an error's ErrorRecord.
    """

    def __init__(
        self, config: ExamplesConfig, failed: Callable[[Hashable, InputError], ErrorRecord]
    ) -> None:
        self._records = config.records()
        self._spill = SpillWriter(config.spill_dir)
        self._failed = failed
        self.taken = 0  # records in the block flushed last

    def add(self, data: bytes, split: str | None, origin: Hashable) -> tuple:
        """Add a record; the outputs of its block when that is full now, else ()."""
        self._records.add(data, split, origin)
        return tuple(self.flush()) if self._records.full else ()

    def flush(self):
        self.taken = len(self._records)
        batch, failed = self._records.take()
        for origin, error in failed:
            yield beam.pvalue.TaggedOutput(ERRORS, self._failed(origin, error))
        if batch is not None:
            # The Example bytes wait in the spill file; the plan needs only sizes and orders.
            yield beam.pvalue.TaggedOutput(BLOCKS, self._spill.add(batch))
            yield without_examples(batch)

    def close(self):
        """Close the spill file (its pieces can be read once it is closed); yield the tally."""
        self._spill.close()
        yield beam.pvalue.TaggedOutput(TALLY, self._records.take_tally())

    def discard(self) -> None:
        """The bundle failed: its spill file goes (SpillWriter.discard)."""
        self._spill.discard()


def _in_global_window(output):
    """A finish_bundle output: a WindowedValue in the global window (tags kept)."""
    if isinstance(output, beam.pvalue.TaggedOutput):
        return beam.pvalue.TaggedOutput(output.tag, _in_global_window(output.value))
    return in_global_window(output)


class _ParkElementsFn(beam.DoFn):
    """Elements → parked blocks, one spill file per bundle."""

    def __init__(self, config: ExamplesConfig) -> None:
        self._config = config

    def setup(self):
        self._progress = Progress("records_parked", "parked", "records")

    def start_bundle(self):
        self._parking = _Parking(self._config, _element_error)

    def process(self, element):
        self._progress.add()
        try:
            split, data = serialized_element(element, self._config.types)
        except InputError as error:
            yield beam.pvalue.TaggedOutput(ERRORS, _element_error(None, error))
            return
        yield from self._parking.add(data, split, None)  # the block's outputs, when it is full

    def finish_bundle(self):
        # Outputs of finish_bundle carry their window: the global one (ParkElements puts every
        # element there).
        for output in (*self._parking.flush(), *self._parking.close()):
            yield _in_global_window(output)

    def teardown(self):
        # After a failed bundle (a finished one's file is closed already: nothing to do).
        if getattr(self, "_parking", None) is not None:
            self._parking.discard()


def _element_error(_, error: InputError) -> ErrorRecord:
    return ErrorRecord(WRITE_DATASET_INPUT, None, STAGE_RECORD, error.kind, error.message)


class _ReadTFRecordFilesFn(beam.DoFn):
    """TFRecordInput → its records parked in blocks; a part that is not a usable record →
    ERRORS, with its file and offset; TALLY per file."""

    def __init__(self, config: ExamplesConfig) -> None:
        self._config = config

    def setup(self):
        self._progress = Progress("tfrecord_records_read", "read", "records")

    def process(self, file: TFRecordInput):
        if file.problem:
            kind, message = file.problem
            yield beam.pvalue.TaggedOutput(
                ERRORS, ErrorRecord(file.path, None, STAGE_DISCOVER, kind, message)
            )
            return
        try:
            raw = open_file(file.path)
        except STORAGE_ERRORS as error:  # nothing was read: the file is one quarantined input
            raise_process_limit(error)
            problem = Problem(0, "UnreadableFile", f"cannot open it: {storage_reason(error)}")
            yield beam.pvalue.TaggedOutput(ERRORS, _problem_error(file.path, problem))
            return
        parking = _Parking(self._config, _record_error)
        try:
            yield from self._park(file, raw, parking)
        except BaseException:
            parking.discard()
            raise

    def _park(self, file: TFRecordInput, raw, parking: _Parking):
        read = 0  # records and problems met so far
        try:
            with raw:
                for item in read_file_records(raw):
                    read += 1
                    if isinstance(item, Problem):
                        yield beam.pvalue.TaggedOutput(ERRORS, _problem_error(file.path, item))
                        continue
                    offset, data = item
                    outputs = parking.add(data, file.split, (file.path, offset))
                    if outputs:
                        self._progress.add(parking.taken)
                        yield from outputs
        except STORAGE_ERRORS as error:
            # How many records follow is unknown, so none can be counted: the run fails, as
            # for a CSV file that cannot be read to its end.
            raise _incomplete(file.path, read, error) from None
        outputs = tuple(parking.flush())
        self._progress.add(parking.taken)
        yield from outputs
        yield from parking.close()


def _incomplete(path: str, read: int, error: BaseException) -> InputIncomplete:
    """The run-ending error of a TFRecord file that cannot be read to its end."""
    return InputIncomplete(
        f"{display(path)} cannot be read to its end: {storage_reason(error)}, after its first "
        f"{read:,} records, and how many follow is unknown. No dataset was written: make the "
        "file readable and run again"
    )


def _problem_error(path: str, problem: Problem) -> ErrorRecord:
    where = "the decompressed stream" if problem.compressed else "the file"
    message = f"at byte {problem.offset:,} of {where}: {problem.message}"
    return ErrorRecord(path, None, STAGE_READ, problem.kind, message, problem.offset)


def _record_error(origin: tuple[str, int], error: InputError) -> ErrorRecord:
    path, offset = origin
    return ErrorRecord(path, None, STAGE_RECORD, error.kind, error.message, offset)
