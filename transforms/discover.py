"""Discovery: list image files and read CSV rows into candidates, one per potential record."""

from __future__ import annotations

import apache_beam as beam

from recordforge.schemas import codec
from recordforge.schemas.csv.schema import CsvSchema
from recordforge.transforms.core.errors import InputError, InputIncomplete
from recordforge.transforms.core.files import skipped
from recordforge.transforms.core.files.confine import local_path_of_uri
from recordforge.transforms.core.files.filenames import MARK, display
from recordforge.transforms.core.files.naming import SPLIT_NAME_RULE, is_valid_split_name
from recordforge.transforms.core.files.overlap import Owners
from recordforge.transforms.core.files.paths import (
    is_hidden,
    parent_folder,
    relative_path,
    resolve_reference,
)
from recordforge.transforms.core.files.walk import FILE, FOLDER_LINK, HIDDEN, PROBLEM
from recordforge.transforms.core.planning.declare import csv_feature_columns
from recordforge.transforms.core.records import (
    STAGE_DISCOVER,
    STAGE_READ,
    Candidate,
    CsvRoles,
    ErrorRecord,
    Source,
    pack,
)
from recordforge.transforms.core.tables.ranges import WHOLE, CsvRange
from recordforge.transforms.core.tables.receipts import CsvReceipt
from recordforge.transforms.core.tables.rows import (
    CsvEnd,
    RowError,
    missing_label,
    read_csv_rows,
)
from recordforge.transforms.core.tables.stream import CsvReadFailure
from recordforge.transforms.listing import list_entries
from recordforge.transforms.progress import INPUTS_LISTED, Progress, counter
from recordforge.transforms.remote_reads import OpenedCsv, open_csv
from recordforge.transforms.storage_errors import STORAGE_ERRORS, storage_reason

ERRORS = "errors"
IGNORED = "ignored"
CSV_FILES = "csv_files"
LINKED = "linked"
RECEIPTS = "receipts"
# Candidates travel in batches: Beam's cost is per element, and a batch pays it once. Image
# batches are smaller so that probing them spreads over workers even for modest folders.
IMAGE_BATCH = 256
CSV_BATCH = 2048


class ListInputs(beam.PTransform):
    """Sources → batches of candidates.

    Input: PCollection[Source]. Outputs (tagged):
        main: PCollection[list[tuple]]: packed Candidates (see records.pack), one per image file
            or CSV data row.
        errors: PCollection[ErrorRecord] for what was listed but cannot be an input (a FIFO, an
            unreadable folder, ...), and CSV rows and files that cannot be read.
        ignored: PCollection[(reason, path)] of what is not an input, for the manifest's counts
            (see core.files.skipped): hidden files (.DS_Store, .git/...), files reached a second
            time, links to folders not followed.
        csv_files: with a CSV schema and read_csv=False only: PCollection[(Source, path)] of the
            CSV files, whose rows are then not read here (transforms.table.ReadTable reads them).
        receipts: PCollection[CsvReceipt], one per CSV file read here (see core.tables.receipts).
    """

    def __init__(
        self,
        csv_schema: CsvSchema | None,
        roles: CsvRoles,
        read_csv: bool = True,
        *,
        sources=(),
        follow_symlinks: bool = False,
        allowed_roots=(),
    ) -> None:
        super().__init__()
        self._csv_schema = csv_schema
        self._roles = roles
        self._read_csv = read_csv
        self._match = _MatchFilesFn(tuple(sources), follow_symlinks, tuple(allowed_roots))
        # Files reached only through links are ranked across sources by one shuffle; with one
        # source the worker listing it decides alone.
        self._across_sources = len(sources) > 1

    def expand(self, sources):
        # Batches of image candidates; (Source, path) of CSV files; what is skipped `ignored`.
        # Image folders (no CSV schema) have no CSV files: no stages to read them.
        csv_files = (CSV_FILES,) if self._csv_schema is not None else ()
        # Files reached only through links are ranked across sources (LINKED); with one source
        # the listing decides alone, and the output would be left unused (which runners that run
        # only the last branch of a graph, as Dask's, must not meet).
        linked = (LINKED,) if self._across_sources else ()
        files = sources | "MatchFiles" >> beam.ParDo(self._match).with_outputs(
            ERRORS, IGNORED, *linked, *csv_files, main="images"
        )
        images, csv_paths, ignored = files.images, files[CSV_FILES] if csv_files else None, None
        ignored = files[IGNORED]
        if self._across_sources:
            linked = files[LINKED] | "RankLinkedFiles" >> _RankLinkedFiles()
            images = (images, linked.images) | "WithLinkedImages" >> beam.Flatten()
            ignored = (ignored, linked[IGNORED]) | "WithLinkedDuplicates" >> beam.Flatten()
            if csv_files:
                csv_paths = (csv_paths, linked[CSV_FILES]) | "WithLinkedCsv" >> beam.Flatten()
        if not csv_files or not self._read_csv:  # none, or the caller reads them (ReadTable)
            listed = {"candidates": images, ERRORS: files[ERRORS], IGNORED: ignored}
            return {**listed, CSV_FILES: csv_paths} if csv_files else listed
        rows = (
            csv_paths
            # One CSV file per task: spread files over workers before reading.
            | "SpreadCsvFiles" >> beam.Reshuffle()
            | "ReadCsvRows"
            >> beam.ParDo(_ReadCsvFn(self._csv_schema, self._roles)).with_outputs(
                ERRORS, RECEIPTS, main="rows"
            )
        )
        candidates = (images, rows.rows) | "AllCandidates" >> beam.Flatten()
        errors = (files[ERRORS], rows[ERRORS]) | "ListAndReadErrors" >> beam.Flatten()
        return {
            "candidates": candidates,
            ERRORS: errors,
            IGNORED: ignored,
            RECEIPTS: rows[RECEIPTS],
            CSV_FILES: csv_paths,
        }


class _MatchFilesFn(beam.DoFn):
    """Source → batches of image candidates, or (Source, path) of each CSV file (CSV_FILES).

    What cannot be an input → ERRORS; what is skipped (hidden, reached again, folder links not
    followed) → IGNORED; with several sources, files reached only through links → LINKED.
    """

    def __init__(
        self, sources: tuple[Source, ...], follow_symlinks: bool, allowed_roots: tuple[str, ...]
    ) -> None:
        self._sources = sources
        self._follow = follow_symlinks
        self._allowed = allowed_roots

    def setup(self):
        # Real paths of the roots, resolved where the files are listed.
        self._owners = Owners(self._sources) if self._sources else None
        self._listed = counter(INPUTS_LISTED)

    def process(self, source: Source):
        owners = self._owners or Owners((source,))
        reach = owners.reach(source.index)
        rivals = owners.rivals(source.index)
        root = source.root.rstrip("/")
        across_sources = len(self._sources) > 1
        targets = set()  # where this source's links lead, to count a second link as such
        batch = []
        for entry in list_entries(
            source.pattern, follow_symlinks=self._follow, allowed_roots=self._allowed
        ):
            path = entry.path
            if rivals and entry.kind != FILE and entry.real is None:
                real = reach.root if reach.kind == "file" else reach.root + path[len(root) :]
                if any(rival.covers(real) for rival in rivals):
                    continue  # reported by the source that ranks first
            if entry.kind == PROBLEM:
                kind, message = entry.error
                yield _tagged(ERRORS, ErrorRecord(path, None, STAGE_DISCOVER, kind, message))
                continue
            if entry.kind == FOLDER_LINK:
                yield _tagged(IGNORED, (skipped.FOLDER_LINKS, path))
                continue
            relative = relative_path(path, source.root)
            # A file named on its own is an input even when its name is hidden: only what a
            # folder or glob finds is skipped so.
            if entry.kind == HIDDEN or (path != source.pattern and is_hidden(relative)):
                yield _tagged(IGNORED, (skipped.HIDDEN, path))
                continue
            if entry.real is None:  # reached directly
                if rivals:
                    real = reach.root if reach.kind == "file" else reach.root + path[len(root) :]
                    if any(rival.reaches(real) for rival in rivals):
                        yield _tagged(IGNORED, (skipped.DUPLICATES, path))
                        continue
            elif owners.reached_directly(entry.real) or entry.real in targets:
                yield _tagged(IGNORED, (skipped.DUPLICATES, path))
                continue
            else:
                targets.add(entry.real)
                if across_sources:
                    if source.kind == "csv":
                        payload = (source, path)
                    else:
                        try:
                            payload = tuple(_image_candidate(source, path, relative))
                        except InputError as error:
                            yield _listing_error(path, error)
                            continue
                    yield _tagged(LINKED, (entry.real, (reach.rank, path, source.kind, payload)))
                    continue
            if source.kind == "csv":
                yield _tagged(CSV_FILES, (source, path))
                continue
            try:
                batch.append(tuple(_image_candidate(source, path, relative)))
            except InputError as error:
                yield _listing_error(path, error)
                continue
            if len(batch) == IMAGE_BATCH:
                self._listed.inc(len(batch))
                yield batch
                batch = []
        if batch:
            self._listed.inc(len(batch))
            yield batch


class _RankLinkedFiles(beam.PTransform):
    """(real path, (rank, path, kind, payload)) of files reached through links → the first
    way to each (image candidates as one-candidate batches, or CSV_FILES); the others IGNORED
    as duplicates."""

    def expand(self, linked):
        return (
            linked
            | "ByRealPath" >> beam.GroupByKey()
            | "FirstWay" >> beam.FlatMap(_first_way).with_outputs(IGNORED, CSV_FILES, main="images")
        )


def _first_way(real_and_ways):
    _, ways = real_and_ways
    first, *others = sorted(ways, key=lambda way: (way[0], way[1]))
    for _, path, _, _ in others:
        yield _tagged(IGNORED, (skipped.DUPLICATES, path))
    _, _, kind, payload = first
    if kind == "csv":
        yield _tagged(CSV_FILES, payload)
    else:
        counter(INPUTS_LISTED).inc()
        yield [payload]


def _listing_error(path: str, error: InputError) -> beam.pvalue.TaggedOutput:
    return _tagged(ERRORS, ErrorRecord(path, None, STAGE_DISCOVER, error.kind, error.message))


def _tagged(tag: str, value) -> beam.pvalue.TaggedOutput:
    return beam.pvalue.TaggedOutput(tag, value)


def _image_candidate(source: Source, path: str, relative: str | None = None) -> Candidate:
    """The candidate of an image file; below split folders, the split is its first folder and
    the class its second (root/<split>/<class>/<file>).

    Raises:
        InputError: `NoSplitFolder`, a file beside the split folders (root/<file>).
    """
    if relative is None:
        relative = relative_path(path, source.root)
    split, within = source.split, relative
    if source.split_folders:
        folder, _, within = relative.partition("/")
        if not within:
            raise InputError(
                "NoSplitFolder",
                "the file is beside the split folders (root/<split>/<class>/<file>), not in "
                "one, so it belongs to no split",
            )
        split = dict(source.split_folders).get(folder)
        if split is None:  # a folder that appeared after the split folders were listed
            raise InputError(
                "NoSplitFolder",
                f"the folder {display(folder)!r} is not one of the split folders found "
                f"({', '.join(name for name, _ in source.split_folders)})",
            )
    depth = within.count("/")
    return Candidate(
        # The key is the path below the source's root, split folder included: stable, and
        # the same whether the split is detected or named.
        key=f"{source.index}:{relative}",
        path=path,
        row=None,
        image_path=path,
        image_name=relative,
        # Shown as a class name: a folder name that is not UTF-8 appears escaped.
        label=display(within.split("/", 1)[0]) if depth else None,
        depth=depth,
        split=split,
    )


class _ReadCsvFn(beam.DoFn):
    """(Source, CSV path) → batches of Candidates, one per good row; bad rows/files → `errors`.

    For CSVs that name images (or have list label/split columns); tables without images are
    read column-wise by transforms.table.ReadTable.
    """

    def __init__(self, schema: CsvSchema | None, roles: CsvRoles) -> None:
        self._schema = schema
        self._roles = roles
        self._feature_columns = csv_feature_columns(schema, roles)

    def setup(self):
        self._progress = Progress("csv_rows_read", "read", "CSV rows", phase=INPUTS_LISTED)
        self._encoder = codec.ExampleEncoder((c.feature, c.dtype) for c in self._feature_columns)

    def process(self, source_and_path: tuple[Source, str]):
        batch = []
        for item in self._read(*source_and_path):
            if not isinstance(item, Candidate):
                yield item  # a tagged error
                continue
            batch.append(item)
            if len(batch) == CSV_BATCH:
                self._progress.add(len(batch))
                yield pack(batch)
                batch = []
        # Rows read before a failure still count: the error names where reading stopped.
        if batch:
            self._progress.add(len(batch))
            yield pack(batch)

    def _read(self, source: Source, path: str):
        """Candidates, tagged ErrorRecords for bad rows and a file that cannot be read, and the
        file's CsvReceipt (RECEIPTS)."""
        relative = relative_path(path, source.root)
        row = None
        try:
            with open_csv(path) as opened:
                for item in read_csv_rows(opened.stream, self._schema, source_name=relative):
                    if isinstance(item, CsvEnd):
                        yield _tagged(RECEIPTS, receipt_of(path, item, opened))
                        continue
                    row = item.row
                    if isinstance(item, RowError):
                        yield read_error(path, item.row, item.error)
                        continue
                    try:
                        yield self._candidate(source, path, relative, row, item.values)
                    except InputError as error:
                        yield read_error(path, item.row, error)
        except CsvReadFailure as failure:
            raise incomplete(path, failure, row) from None
        except InputError as error:
            yield read_error(path, None, error, after_row=row)
            yield _tagged(RECEIPTS, CsvReceipt(path, quarantined=True))
        except STORAGE_ERRORS as error:
            error = InputError("UnreadableCsv", f"cannot open it: {storage_reason(error)}")
            yield read_error(path, None, error, after_row=row)
            yield _tagged(RECEIPTS, CsvReceipt(path, quarantined=True))

    def _candidate(self, source, path, relative, row, values) -> Candidate:
        roles = self._roles
        image_path = image_name = label = None
        if roles.image_column:
            image_name = _text(values, roles.image_column, "MissingImagePath")
            image_path = image_reference(image_name, path, source.references)
        if roles.label_column:
            label = _label(values, roles.label_column)
        split = source.split
        if roles.split_column:
            split = _text(values, roles.split_column, "MissingSplit")
            if not is_valid_split_name(split):
                raise InputError(
                    "BadSplit",
                    f"column {roles.split_column!r}: {split[:40]!r} is not a valid split name "
                    f"({SPLIT_NAME_RULE})",
                )
        cells = [values.get(spec.column) for spec in self._feature_columns]
        features = self._encoder.encode(cells)
        counts = tuple(-1 if v is None else len(v) for v in cells)
        return Candidate(
            key=f"{source.index}:{relative}#{row}",
            path=path,
            row=row,
            features=features,
            feature_counts=counts,
            image_path=image_path,
            image_name=image_name,
            label=label,
            split=split,
        )


def image_reference(cell: str, csv_path: str, references: str = "") -> str:
    """The image a CSV cell names: relative to the CSV's folder (or to `references` when
    given), absolute, a URL, or a `file://` URI (a local path).

    Raises:
        InputError: `BadCell` for a path holding a NUL character (no file has one; the pipeline
            marks undecodable name bytes with it, see core.files.filenames); `UnsupportedPath` for a
            `file://` URI of another host.
    """
    if MARK in cell:
        raise InputError("BadCell", "the image path holds a NUL character: no file is named so")
    return resolve_reference(local_path_of_uri(cell), references or parent_folder(csv_path))


def _text(values: dict, column: str, missing_kind: str) -> str:
    if column not in values or not values[column]:
        raise InputError(missing_kind, f"column {column!r} is empty")
    raw = values[column][0]
    try:
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError as error:
        raise InputError("BadCell", f"column {column!r} is not valid UTF-8 text") from error


def _label(values: dict, column: str) -> str | int:
    if column not in values or not values[column]:
        raise missing_label(column)
    raw = values[column][0]
    if isinstance(raw, int):
        return raw
    return _text(values, column, "MissingLabel")


def receipt_of(path: str, end: CsvEnd, opened: OpenedCsv, part: CsvRange = WHOLE) -> CsvReceipt:
    """The receipt of a CSV file (or of a range of it, `part`) read to its end."""
    return CsvReceipt(
        path,
        end.rows,
        end.num_bytes,
        opened.stored_bytes,
        opened.stored_size,
        compressed=opened.compressed,
        start=part.start,
        end=part.end,
    )


def incomplete(path: str, failure: CsvReadFailure, last_row: int | None) -> InputIncomplete:
    """The run-ending error of a CSV file that cannot be read to its end."""
    last = max(last_row or 0, failure.rows)
    read = f"the last row read is row {last:,}" if last else "no row could be read"
    return InputIncomplete(
        f"{display(path)} cannot be read to its end: {failure.reason}, at byte "
        f"{failure.offset:,}; {read}, and how many rows follow is unknown. No dataset was "
        "written: repair or replace the file and convert again"
    )


def read_error(path: str, row: int | None, error: InputError, after_row: int | None = None):
    """A CSV row or file that could not be read, as an ERRORS output naming the file and row."""
    message = error.message
    if row is None and after_row is not None:
        message = f"{message} (after row {after_row}; later rows were not read)"
    record = ErrorRecord(path, row, STAGE_READ, error.kind, message)
    return beam.pvalue.TaggedOutput(ERRORS, record)
