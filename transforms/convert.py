"""The whole conversion as one composite: sources in, a committed dataset (or a plan) out."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from recordforge.schemas.csv.schema import CsvSchema
from recordforge.schemas.features import FeatureTally
from recordforge.transforms.build import TALLY, BuildRecords, CollectLabels
from recordforge.transforms.combiners import CombineTogether, TallyCombineFn
from recordforge.transforms.commit import Commit, CommitConfig
from recordforge.transforms.core.errors import InputIncomplete
from recordforge.transforms.core.files import skipped
from recordforge.transforms.core.images.preprocess import Preprocessing
from recordforge.transforms.core.images.probe import DEFAULT_MAX_PIXELS
from recordforge.transforms.core.planning.assemble import split_order
from recordforge.transforms.core.planning.declare import csv_feature_columns, declare_features
from recordforge.transforms.core.planning.sharding import ShardingConfig
from recordforge.transforms.core.records import CsvRoles, InputCounts, Source
from recordforge.transforms.core.reports.statistics import ErrorSample
from recordforge.transforms.core.tables.receipts import CsvLedger
from recordforge.transforms.discover import CSV_FILES, IGNORED, RECEIPTS, ListInputs
from recordforge.transforms.probe import ProbeImages
from recordforge.transforms.shard import PlanShards, plan_totals_of
from recordforge.transforms.staging import Staging, default_staging
from recordforge.transforms.table import BLOCKS, PlaceTable, ReadTable
from recordforge.transforms.write import ImageChecks, WriteErrors, WriteShards, write_atomically

ERRORS = "errors"


@dataclass(frozen=True)
class ConvertConfig:
    """Everything that shapes a conversion, resolved and validated before the pipeline is built.

    Attributes:
        sources: the inputs, all of one kind ("images" or "csv").
        output: the dataset folder (None when only planning).
        name: the prefix of shard file names.
        splits: (name, fraction) pairs for hash-based splits; ignored with a split column.
            When the inputs name their splits (Source.split, Source.split_folders), those
            splits in manifest order (the fractions then unused).
        split_note: how the inputs named their splits, for the summary and the manifest.
        salt: salts the split and order hashes.
        label_mode: "auto", "folder" or "none" (image folders).
        roles: the CSV columns that name the image, the label and the split.
        csv_schema: the columns of CSV sources (None for image folders).
        sharding: the planner's thresholds.
        compression: "none" or "gzip".
        write_index: write a record index file beside each (uncompressed) shard.
        tfds: also write TensorFlow Datasets' metadata (the manifest becomes recordforge.json).
        max_error_rate: fail when more than this fraction of inputs fail (None: never).
        max_image_pixels: larger images are rejected as decompression bombs.
        check_pixels: the writer decodes every image in full (else it checks their structure).
        preprocessing: what the writer does to every image before storing it (resize,
            re-encode, channels); the default stores image files as they are.
        follow_symlinks: follow symbolic links to folders, also out of a source.
        allowed_roots: when not empty, the only folders (local or URL prefixes) files may be
            opened under, symbolic links resolved (transforms.core.files.confine).
        stray_files: "error" or "unlabeled": what becomes of an image outside the class
            folders of a labelled folder source.
        run_id: the run's id (in its lock and commit journal).
        tool_version: recorded in the manifest.
        options: the options that shaped the output, recorded in the manifest.
        shown_as: input paths that error records name otherwise (a table given to the Python
            API, staged as a CSV file for the run: the errors name the table).
        staging: where the run stages its files and how it commits them (default: a JOURNAL
            staging inside `output`; the CLI chooses, see transforms/staging.py).
        run_key: the digest of everything that shapes output bytes, in each staged shard's
            fingerprint.
        resume: keep shards an earlier run staged from the same inputs and options.
        detached: the launcher does not wait for the run; its commit releases the lock.
        overwrite: the commit may replace a dataset in the output folder; without it, a dataset
            that appeared there during the run is left as it is (OutputTaken).
        csv_range_bytes: uncompressed CSV files (tables without images) larger than this are
            split into ranges of about this size, each read by whichever worker gets it; None
            reads each file whole, in one task. It changes no output byte.
        csv_range_multiple: a split file's ranges come in a multiple of this many: the local
            runner's worker processes, each then given an even share (FnApiRunner deals a
            stage's tasks out in turn). It changes no output byte either.
    """

    sources: tuple[Source, ...]
    output: str | None
    name: str
    splits: tuple[tuple[str, float], ...] = (("train", 1.0),)
    split_note: str = ""
    salt: str = "recordforge"
    label_mode: str = "auto"
    roles: CsvRoles = CsvRoles()
    csv_schema: CsvSchema | None = None
    sharding: ShardingConfig = ShardingConfig()
    compression: str = "none"
    write_index: bool = False
    tfds: bool = False
    max_error_rate: float | None = None
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    check_pixels: bool = False
    preprocessing: Preprocessing = Preprocessing()
    follow_symlinks: bool = False
    allowed_roots: tuple[str, ...] = ()
    stray_files: str = "error"
    run_id: str = "run"
    tool_version: str = "0"
    options: Mapping = field(default_factory=dict)
    shown_as: Mapping[str, str] = field(default_factory=dict)
    staging: Staging | None = None
    run_key: str = ""
    resume: bool = False
    detached: bool = False
    overwrite: bool = False
    csv_range_bytes: int | None = None
    csv_range_multiple: int = 1

    @property
    def staged(self) -> Staging:
        """The staging: the one given, or the default for the output folder."""
        if self.output is None:
            raise ValueError("planning stages nothing")
        return self.staging or default_staging(self.output)

    @property
    def has_images(self) -> bool:
        return any(s.kind == "images" for s in self.sources) or bool(self.roles.image_column)

    @property
    def configured_splits(self) -> tuple[str, ...]:
        return () if self.roles.split_column else tuple(name for name, _ in self.splits)

    def source_record(self) -> dict:
        """The inputs as the manifest records them."""
        record = {"inputs": [s.given for s in self.sources], "kind": self.sources[0].kind}
        if self.csv_schema is not None:
            record["csv_schema"] = self.csv_schema.to_dict()
        if self.split_note:
            record["splits"] = self.split_note
        return record


class _Planned(beam.PTransform):
    """The stages shared by `convert` and `plan`: discover, probe, label, build, plan."""

    def __init__(self, config: ConvertConfig, assign: bool) -> None:
        super().__init__()
        self._config = config
        self._assign = assign

    def expand(self, pbegin):
        config = self._config
        sources = pbegin | "Sources" >> beam.Create(config.sources)
        tabular = _is_plain_table(config)
        listed = sources | "ListInputs" >> ListInputs(
            config.csv_schema,
            config.roles,
            read_csv=not tabular,
            sources=config.sources,
            follow_symlinks=config.follow_symlinks,
            allowed_roots=config.allowed_roots,
        )
        if tabular:
            built, labels = self._read_table(pbegin, listed)
            # Inputs are the records plus the rows and files that failed, and what was listed
            # but cannot be an input.
            read_errors = (listed[ERRORS], built[ERRORS])
            counted, early_errors, receipts = built["records"], read_errors, built[RECEIPTS]
        else:
            built, labels, early_errors = self._probe_and_build(pbegin, listed)
            counted, read_errors = listed["candidates"], (listed[ERRORS],)
            receipts = listed.get(RECEIPTS)
        tallies = {
            "Inputs": _input_tallies(counted, read_errors, early_errors, listed[IGNORED]),
            "Features": (built[TALLY], TallyCombineFn(FeatureTally, FeatureTally.merge)),
        }
        if not tabular:
            # A file's totals are a few bytes: they share the tallies' combine (two stages
            # fewer). A table's fill up to 8 MiB per split, which the shared combine's Flatten
            # would move between runner and workers once more than PlanShards' own combine.
            tallies["PlanTotals"] = plan_totals_of(built["records"])
        if config.csv_schema is not None:
            tallies["CsvFiles"] = _csv_ledger_inputs(listed[CSV_FILES], receipts)
        combined = pbegin | "Tallies" >> CombineTogether(tallies)
        counts, ignored = _input_counts(combined["Inputs"])
        if config.csv_schema is not None:
            # Nothing is written or committed before every CSV file is known to be read whole.
            counts = counts | "EveryCsvFileRead" >> beam.Map(
                _checked, beam.pvalue.AsSingleton(combined["CsvFiles"])
            )
        tally = combined["Features"]
        planned = built["records"] | "PlanShards" >> PlanShards(
            config.sharding,
            config.configured_splits,
            assign=self._assign and not tabular,
            summed_totals=combined.get("PlanTotals"),
        )
        assigned = planned.get("assigned")
        if tabular and self._assign:
            assigned = self._place_table(built[BLOCKS], planned["layouts"])
        return {
            "assigned": assigned,
            "layouts": planned["layouts"],
            "labels": labels,
            "tally": tally,
            "counts": counts,
            "ignored": ignored,
            "early_errors": early_errors,  # a tuple of PCollections of ErrorRecords
        }

    def _probe_and_build(self, pbegin, listed):
        """Candidates → probed (images) → labelled → built records."""
        config = self._config
        candidates = listed["candidates"]
        if config.has_images:
            probed = candidates | "ProbeImages" >> ProbeImages(
                config.max_image_pixels,
                config.allowed_roots,
                # Preprocessing turns photos as EXIF says: their stored size depends on it.
                orientation=config.preprocessing.active,
            )
        else:  # text-labelled rows: nothing to open, but labels to collect first
            probed = {
                "probed": candidates
                | "NoImages" >> beam.Map(lambda batch: [(candidate, None) for candidate in batch]),
                ERRORS: pbegin | "NoProbeErrors" >> beam.Create([]),
            }
        labels = probed["probed"] | "CollectLabels" >> CollectLabels(
            folder_sources=[s.index for s in config.sources if s.kind == "images"],
            csv_sources=[s.index for s in config.sources if s.kind == "csv"],
            mode=config.label_mode,
            csv_labelled=bool(config.roles.label_column),
            stray_files=config.stray_files,
        )
        built = probed["probed"] | "BuildRecords" >> BuildRecords(
            labels,
            splits=config.splits,
            salt=config.salt,
            csv_keys=[c.feature for c in csv_feature_columns(config.csv_schema, config.roles)],
            # Planning needs each record's size, not its bytes.
            with_examples=self._assign,
            preprocessing=config.preprocessing,
            max_pixels=config.max_image_pixels,
        )
        early_errors = (listed[ERRORS], probed[ERRORS], built[ERRORS])
        return built, labels, early_errors

    def _read_table(self, pbegin, listed):
        """CSV files → built records in one step (after a label pass for text labels)."""
        config = self._config
        built = listed[CSV_FILES] | "ReadTable" >> ReadTable(
            config.csv_schema,
            config.roles,
            splits=config.splits,
            salt=config.salt,
            label_mode=config.label_mode,
            source_indices=[s.index for s in config.sources],
            # Planning needs each record's size, not its bytes: a conversion parks the
            # encoded records in spill files until PlaceTable places them.
            with_examples=False,
            spill_dir=config.staged.spill if self._assign else None,
            range_bytes=config.csv_range_bytes,
            range_multiple=config.csv_range_multiple,
        )
        return built, built["labels"]

    def _place_table(self, blocks, layouts):
        """Spilled blocks of encoded records, once the plan exists → pieces by shard."""
        config = self._config
        return blocks | "PlaceTable" >> PlaceTable(layouts=layouts, spill_dir=config.staged.spill)


def _csv_ledger_inputs(listed, receipts):
    """(the CSV files listed and the receipts of their reads, the CombineFn of their ledger), as
    CombineTogether takes them: `_checked` then fails the run (InputIncomplete) unless every
    CSV file listed has a receipt of being read to its end (or quarantined whole)."""
    return (
        (
            listed | "ListedCsv" >> beam.Map(lambda source_path: ("listed", source_path[1])),
            receipts | "ReadCsv" >> beam.Map(lambda receipt: ("read", receipt)),
        ),
        TallyCombineFn(CsvLedger, CsvLedger.add),
    )


def _checked(counts: InputCounts, ledger: CsvLedger) -> InputCounts:
    problems = ledger.problems()
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InputIncomplete(
            "not every CSV file was read to its end, so rows may be missing: "
            + "; ".join(problems[:3])
            + more
        )
    return counts


def _is_plain_table(config: ConvertConfig) -> bool:
    """CSV rows without images, whose label and split columns (if any) are scalars: built a
    batch of rows at a time (transforms/table.py). Others go row by row."""
    if config.has_images or config.csv_schema is None:
        return False
    roles = config.roles
    return not any(
        c.is_list
        for c in config.csv_schema.columns
        if c.column in (roles.label_column, roles.split_column)
    )


def _input_tallies(batches, read_errors, early_errors, ignored):
    """(tuples, their CombineFn): one count of several streams, as CombineTogether takes it.

    Inputs are the records in `batches` (lists) plus the rows and files that never became one
    (`read_errors`); a tuple is (records in batches, read errors, early errors, skipped paths
    by reason). `read_errors` and `early_errors` are tuples of PCollections, counted without
    being flattened first (a Flatten a runner cannot fuse away is a stage of its own).
    """
    reasons = skipped.REASONS
    width = 3 + len(reasons)

    def one_skipped(reason_and_path):
        counts = [0] * width
        counts[3 + reasons.index(reason_and_path[0])] = 1
        return tuple(counts)

    tallies = (
        batches | "TallyBatch" >> beam.Map(lambda batch: (len(batch), 0, 0, *[0] * len(reasons))),
        *(
            errors | f"TallyReadError{index}" >> beam.Map(lambda _: (0, 1, 0, *[0] * len(reasons)))
            for index, errors in enumerate(read_errors)
        ),
        *(
            errors | f"TallyEarlyError{index}" >> beam.Map(lambda _: (0, 0, 1, *[0] * len(reasons)))
            for index, errors in enumerate(early_errors)
        ),
        ignored | "TallyIgnored" >> beam.Map(one_skipped),
    )
    return tallies, beam.combiners.TupleCombineFn(*[sum] * width)


def _input_counts(totals):
    """(InputCounts, {skip reason: paths skipped}) from the totals of `_input_tallies`."""
    counts = totals | "InputCounts" >> beam.Map(lambda t: InputCounts(t[0] + t[1], t[2]))
    return counts, totals | "SkippedPaths" >> beam.Map(
        lambda t: dict(zip(skipped.REASONS, t[3:], strict=True))
    )


class ConvertToTFRecords(beam.PTransform):
    """PBegin → the dataset: shards, errors files and, last, the manifest.

    Output: PCollection holding the manifest as a dict. Every branch of the pipeline feeds the
    final commit, so runners that only execute the last branch (Dask) still do all the work.
    """

    def __init__(self, config: ConvertConfig) -> None:
        super().__init__()
        if config.output is None:
            raise ValueError("ConvertToTFRecords needs an output folder")
        self._config = config

    def expand(self, pbegin):
        config = self._config
        planned = pbegin | "Plan" >> _Planned(config, assign=True)
        proceed = planned["counts"] | "WithinErrorRate" >> beam.Map(
            within_error_rate, config.max_error_rate
        )
        staging = config.staged
        written = planned["assigned"] | "WriteShards" >> WriteShards(
            staging.parts,
            config.name,
            config.compression,
            layouts=planned["layouts"],
            proceed=proceed,
            write_index=config.write_index,
            run_key=config.run_key,
            resume=config.resume,
            image_checks=ImageChecks(
                config.check_pixels,
                config.max_image_pixels,
                config.allowed_roots,
                config.preprocessing,
            ),
        )
        all_errors = (*planned["early_errors"], written[ERRORS]) | "AllErrors" >> beam.Flatten()
        all_errors = _shown_as(all_errors, config.shown_as)
        error_files = all_errors | "WriteErrors" >> WriteErrors(staging.parts)
        commit_config = CommitConfig(
            staging=staging,
            name=config.name,
            run_id=config.run_id,
            tool_version=config.tool_version,
            compression=config.compression,
            tfds=config.tfds,
            configured_splits=config.configured_splits,
            declared=declare_features(
                has_images=config.has_images,
                schema=config.csv_schema,
                roles=config.roles,
                preprocessed=config.preprocessing.active,
            ),
            max_error_rate=config.max_error_rate,
            plan_config=config.sharding.to_dict(),
            options=config.options,
            source=config.source_record(),
            run_key=config.run_key,
            detached=config.detached,
            overwrite=config.overwrite,
        )
        return (
            (written.shards, error_files)
            | "Results" >> beam.Flatten()
            | "Commit"
            >> Commit(
                commit_config,
                layouts=planned["layouts"],
                labels=planned["labels"],
                tally=planned["tally"],
                counts=planned["counts"],
                ignored=planned["ignored"],
            )
        )


def _shown_as(errors, shown_as: Mapping[str, str]):
    """ErrorRecords with the paths in `shown_as` replaced by the names given there."""
    if not shown_as:
        return errors
    names = dict(shown_as)
    return errors | "ShownAs" >> beam.Map(
        lambda error: error._replace(path=names.get(error.path, error.path))
    )


def within_error_rate(counts: InputCounts, limit: float | None) -> bool:
    """Whether few enough inputs failed before writing for the run to write its shards."""
    return limit is None or counts.early_errors <= limit * counts.num_inputs


class PlanDataset(beam.PTransform):
    """PBegin → a JSON report of the plan, written to `report_path`; converts nothing."""

    def __init__(self, config: ConvertConfig, report_path: str) -> None:
        super().__init__()
        self._config = config
        self._report_path = report_path

    def expand(self, pbegin):
        planned = pbegin | "Plan" >> _Planned(self._config, assign=False)
        # The first few unusable inputs of each kind, to name them.
        early_errors = _shown_as(
            planned["early_errors"] | "EarlyErrors" >> beam.Flatten(), self._config.shown_as
        )
        unusable = early_errors | "SampleErrors" >> beam.CombineGlobally(
            TallyCombineFn(ErrorSample, ErrorSample.add)
        )
        side = beam.pvalue.AsSingleton
        return planned["layouts"] | "ReportPlan" >> beam.Map(
            _write_plan_report,
            self._config,
            self._report_path,
            side(planned["labels"]),
            side(planned["counts"]),
            side(planned["ignored"]),
            side(unusable),
        )


def _write_plan_report(
    layouts, config: ConvertConfig, path: str, labels, counts, ignored, unusable: ErrorSample
) -> dict:
    report = {
        "num_inputs": counts.num_inputs,
        "failed_inputs": counts.early_errors,
        "unusable": unusable.to_dict(),
        **skipped.source_fields(ignored),
        "labels": list(labels.names) or None,
        "labels_note": labels.note,
        "splits_note": config.split_note,
        "config": config.sharding.to_dict(),
        "splits": {
            split: layouts[split].plan.to_dict()
            for split in split_order(layouts, config.configured_splits)
        },
    }
    folder = FileSystems.split(path)[0]
    write_atomically(path, folder, lambda f: f.write(json.dumps(report, indent=2).encode()))
    return report
