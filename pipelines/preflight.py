"""Preflight: resolve and check inputs, output and schema before any pipeline is built.

Every user mistake found here becomes a UsageError: one line, exit status 2, nothing written.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import logging
import os
import re
from collections.abc import Iterator, Sequence

from recordforge.schemas.csv.document import MAX_SCHEMA_BYTES
from recordforge.schemas.csv.schema import (
    CsvSchema,
    SchemaError,
    parse_schema_document,
    resolve_schema,
)
from recordforge.schemas.features import (
    IMAGE_CHANNELS,
    IMAGE_ENCODED,
    IMAGE_FILENAME,
    IMAGE_FORMAT,
    IMAGE_HEIGHT,
    IMAGE_LABEL,
    IMAGE_LABEL_TEXT,
    IMAGE_WIDTH,
    LABEL,
    LABEL_TEXT,
)
from recordforge.transforms.core.errors import (
    InputError,
    InputIncomplete,
    ListingFailed,
    UsageError,
)
from recordforge.transforms.core.files.confine import (
    is_within,
    local_path_of_uri,
    normalize_root,
    real_path,
)
from recordforge.transforms.core.files.filenames import absolute_local_path, display, from_os, to_os
from recordforge.transforms.core.files.naming import (
    MAX_FILE_NAME_BYTES,
    SPLIT_NAME_RULE,
    is_valid_dataset_name,
    is_valid_split_name,
    longest_shard_file_name,
)
from recordforge.transforms.core.files.paths import (
    glob_root,
    has_glob,
    has_scheme,
    is_csv,
    is_hidden,
    relative_path,
)
from recordforge.transforms.core.files.walk import FILE, PROBLEM, is_glob
from recordforge.transforms.core.records import CsvRoles, Source
from recordforge.transforms.core.tables.stream import (
    CsvReadFailure,
    read_sample,
    read_stream_piece,
)
from recordforge.transforms.listing import list_entries, list_files
from recordforge.transforms.remote_reads import open_csv, open_file
from recordforge.transforms.storage_errors import STORAGE_ERRORS

LOGGER = logging.getLogger("recordforge")


def path_argument(value, what: str) -> str:
    """A path the Python API was given (str, bytes or os.PathLike) as text, `~` expanded.

    Raises:
        UsageError: `value` is not a path (a number, None, ...).
    """
    if not isinstance(value, str | bytes | os.PathLike):
        raise UsageError(f"{what} is a path (a str or os.PathLike), not {value!r}")
    return os.path.expanduser(os.fsdecode(value))


def normalize_path(path: str) -> str:
    """Local paths become absolute (workers may run elsewhere), `file://` URIs local paths,
    names that are not UTF-8 pipeline text (transforms.core.files.filenames); URLs stay as they are.
    """
    try:
        path = local_path_of_uri(path)
    except InputError as error:
        raise UsageError(error.message) from None
    if has_scheme(path):
        stripped = path.rstrip("/")
        return stripped if not stripped.endswith(":/") else path
    return absolute_local_path(path)


_PATTERN_CHARACTERS = "*?["


def output_path(raw: str) -> str:
    """The output folder, normalized (`normalize_path`).

    Raises:
        UsageError: its path has a character Beam's file systems read as a pattern when they
            list and delete (`*`, `?`, `[`): a commit would match other folders' files, or miss
            its own, and a run without --overwrite could replace the dataset.
    """
    path = normalize_path(raw)
    used = sorted({c for c in path if c in _PATTERN_CHARACTERS})
    if used:
        raise UsageError(
            f"the output folder {path!r} has {' and '.join(map(repr, used))} in its path, which "
            "Beam's file systems read as a pattern when they list and delete files: choose a "
            "path without *, ? and ["
        )
    return path


def resolve_allowed_roots(given: Sequence[str], sources: Sequence[Source]) -> tuple[str, ...]:
    """The --allowed-root folders as compared (real paths, URLs), each input checked to lie
    under one of them.

    Raises:
        UsageError: an allowed root that is not a folder, or an input outside every root.
    """
    roots = []
    for raw in given:
        try:
            root = normalize_root(raw)
        except InputError as error:
            raise UsageError(f"--allowed-root {raw!r}: {error.message}") from None
        if not has_scheme(root) and not os.path.isdir(to_os(root)):
            raise UsageError(f"--allowed-root {display(from_os(raw))!r} is not a folder")
        roots.append(root)
    roots = tuple(sorted(set(roots)))
    for source in sources:
        if roots and not is_within(real_path(source.root), roots):
            raise UsageError(
                f"the input {source.given!r} is outside every --allowed-root "
                f"({', '.join(display(r) for r in roots)})"
            )
    return roots


def parse_splits(text: str) -> tuple[tuple[str, float], ...]:
    """`train=0.8,validation=0.1,test=0.1` → (("train", 0.8), ...), checked."""
    splits, seen = [], set()
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise UsageError(f"--splits: {part.strip()!r} is not NAME=FRACTION")
        name = name.strip()
        if not is_valid_split_name(name):
            raise UsageError(f"--splits: {name!r} is not a valid split name ({SPLIT_NAME_RULE})")
        if name in seen:
            raise UsageError(f"--splits: split {name!r} is named twice")
        try:
            fraction = float(value)
        except ValueError:
            raise UsageError(f"--splits: {value.strip()!r} is not a number") from None
        if not 0 < fraction <= 1:
            raise UsageError(f"--splits: the fraction of {name!r} must be in (0, 1], got {value}")
        seen.add(name)
        splits.append((name, fraction))
    total = sum(fraction for _, fraction in splits)
    if abs(total - 1.0) > 1e-6:
        raise UsageError(f"--splits: fractions must add up to 1, they add up to {total:g}")
    if abs(total - 1.0) > 1e-9:
        # Rounding in what users type (0.3333333 three times) stays harmless: scale to 1.
        splits = [(name, fraction / total) for name, fraction in splits]
    return tuple(splits)


def resolve_sources(given: Sequence[str], *, follow_symlinks: bool = False) -> tuple[Source, ...]:
    """Classify each input as image folder/glob/file or CSV file/glob, and check it has files."""
    sources = []
    for index, argument in enumerate(given):
        try:
            sources.append(_resolve_source(index, argument, follow_symlinks))
        except ListingFailed as error:  # not "not found": the store did not answer
            raise UsageError(f"input {display(from_os(argument))!r}: {error}") from None
    kinds = {s.kind for s in sources}
    if len(kinds) > 1:
        raise UsageError("image inputs and CSV inputs cannot be mixed in one run")
    return tuple(sources)


# A file named on its own with one of these suffixes was meant as a table, not as an image.
_TABLES_NOT_READ = (
    ".tsv",
    ".tab",
    ".txt",
    ".psv",
    ".json",
    ".jsonl",
    ".ndjson",
    ".parquet",
    ".xlsx",
    ".xls",
    ".csv.bz2",
    ".csv.xz",
    ".csv.zst",
    ".csv.zip",
    ".zip",
    ".tsv.gz",
    ".txt.gz",
)


# Of those, text that a delimiter splits: renamed .csv, it is read.
_DELIMITED_TEXT = (".tsv", ".tab", ".txt", ".psv")


def _resolve_source(index: int, argument: str, follow_symlinks: bool) -> Source:
    typed, split = split_source_argument(argument, follow_symlinks)
    path = normalize_path(typed)
    raw = display(from_os(typed))  # as typed, for messages and the manifest
    if is_glob(path):
        matched = list_files(path, follow_symlinks=follow_symlinks)
        if not matched:
            raise UsageError(f"no files match {raw!r}")
        csv_count = sum(is_csv(p) for p in matched)
        if 0 < csv_count < len(matched):
            raise UsageError(f"{raw!r} matches both CSV files and other files; name them apart")
        kind = "csv" if csv_count else "images"
        source = Source(index, kind, path, glob_root(path), raw)
    elif _is_file(path):
        kind = "csv" if is_csv(path) else "images"
        if kind == "images" and path.lower().endswith(_TABLES_NOT_READ):
            remedy = (
                "name it .csv (with --delimiter for another separator)"
                if path.lower().endswith(_DELIMITED_TEXT)
                else "convert it to CSV first"
            )
            raise UsageError(
                f"input {raw!r} is named as a table, and tables are read from CSV files only "
                f"(files named .csv or .csv.gz): {remedy}"
            )
        source = Source(index, kind, path, path.rsplit("/", 1)[0], raw)
    elif (look := _first_look(path.rstrip("/"), follow_symlinks))[0]:
        folder = path.rstrip("/")
        if look[1]:
            raise UsageError(
                f"input folder {raw!r} holds CSV files only, and a folder is read as images: "
                f"give the files, or a glob ({raw.rstrip('/')}/*.csv), to convert them as tables"
            )
        source = Source(index, "images", folder + "/**", folder, raw)
    elif _is_folder(path) or list_files(path.rstrip("/") + "/**", limit=1):
        links = "" if follow_symlinks else "; links to folders count with --follow-symlinks"
        raise UsageError(f"input folder {raw!r} is empty (hidden files do not count{links})")
    elif _is_special(path):
        raise UsageError(
            f"input {raw!r} is not a regular file or folder (a FIFO, socket or "
            "device); it is not opened"
        )
    else:
        raise UsageError(f"input not found: {raw!r}")
    return source if split is None else source._replace(split=split)


def split_source_argument(argument: str, follow_symlinks: bool) -> tuple[str, str | None]:
    """`SOURCE=SPLIT` → (SOURCE, SPLIT); a path that exists as typed (`a=b/`) is a path."""
    if "=" not in argument or _exists(normalize_path(argument), follow_symlinks):
        return argument, None
    typed, split = argument.rsplit("=", 1)
    if not is_valid_split_name(split) or not typed:
        return argument, None  # `a=b/*.jpg`: a path (not found, or a glob), said so later
    return typed, split


def _exists(path: str, follow_symlinks: bool) -> bool:
    if not has_scheme(path):
        return os.path.lexists(to_os(path))
    if has_glob(path):
        return bool(list_files(path, limit=1, follow_symlinks=follow_symlinks))
    return _is_file(path) or bool(list_files(path.rstrip("/") + "/**", limit=1))


_LOOK_ENTRIES = 1000  # a bounded look: enough to tell an empty folder from a dataset


def _first_look(folder: str, follow_symlinks: bool = False) -> tuple[bool, bool]:
    """(whether a folder holds a visible file, or something below it that is no file but must
    be reported: a FIFO, a folder it cannot read, an error record and not an "empty" folder;
    whether it holds CSV files only, all of it seen within the look)."""
    visible, problem, entries = [], False, 0
    for entry in list_entries(
        folder + "/**", follow_symlinks=follow_symlinks, limit=_LOOK_ENTRIES + 1
    ):
        entries += 1
        if entry.kind == PROBLEM and entry.path != folder:
            problem = True
        elif entry.kind == FILE and not is_hidden(relative_path(entry.path, folder)):
            visible.append(entry.path)
    whole = entries <= _LOOK_ENTRIES
    only_tables = whole and not problem and bool(visible) and all(map(is_csv, visible))
    return bool(visible) or problem, only_tables


def _is_file(path: str) -> bool:
    if has_scheme(path):
        return path in list_files(path)
    return os.path.isfile(to_os(path))


def _is_folder(path: str) -> bool:
    return not has_scheme(path) and os.path.isdir(to_os(path))


def _is_special(path: str) -> bool:
    """A local FIFO, socket or device (never opened)."""
    return not has_scheme(path) and os.path.exists(to_os(path)) and not _is_folder(path)


# How many header-only CSV files the schema's sample looks past for one with data rows.
_SAMPLE_FILES_TRIED = 100


def _csv_files(sources: Sequence[Source]) -> Iterator[str]:
    """The CSV files of `sources`, in the order the run reads them (each source's by name)."""
    for source in sources:
        yield from list_files(source.pattern)  # sorted by name


def schema_sample(sources: Sequence[Source], delimiter: str):
    """(file, header, sample) of the CSV file whose header and first rows define the schema: the
    first with data rows (a header-only file first would otherwise refuse files that convert in
    another order).

    Raises:
        UsageError: it cannot be read, or none of the first files has data rows.
    """
    tried = []
    unreadable = None  # (file, why) of the first file that is no CSV file (empty, say)
    for path in itertools.islice(_csv_files(sources), _SAMPLE_FILES_TRIED):
        tried.append(path)
        try:
            header, sample = _read_schema_sample(path, delimiter)
        except CsvReadFailure as failure:  # I/O error, damaged gzip: what any file's would be
            raise InputIncomplete(
                f"{display(path)} cannot be read: {failure.reason}, at byte "
                f"{failure.offset:,}; repair or replace the file and convert again"
            ) from None
        except InputError as error:
            # An empty file, a header that is not text: quarantined by the run like any file's
            # (UnreadableCsv); the schema comes from the next (the order must not matter).
            unreadable = unreadable or (path, error.message)
            continue
        except Exception as error:  # noqa: BLE001  (pyarrow raises several types for bad text)
            raise UsageError(f"cannot read CSV {path}: {_first_line(error)}") from None
        if sample.num_rows:
            return path, header, sample
    if unreadable is not None and len(tried) == 1:
        raise UsageError(f"cannot read CSV {unreadable[0]}: {unreadable[1]}")
    if len(tried) > 1:
        raise UsageError(f"none of the CSV files {tried[0]} … {tried[-1]} has data rows")
    raise UsageError(f"CSV {tried[0]} has no data rows")


def resolve_csv_schema(
    sources: Sequence[Source],
    *,
    schema_path: str | None,
    roles: CsvRoles,
    delimiter: str | None,
    null_values: Sequence[str] | None = None,
    drop_index: bool = False,
) -> CsvSchema:
    """The CSV schema: the schema file's columns; the rest inferred from the first rows of the
    first CSV file that has any (`schema_sample`).

    `null_values` (--null-values) replaces the schema file's and the default (pandas');
    `drop_index` (--drop-index) drops an unnamed first column, a DataFrame's index.
    """
    document = None
    if schema_path is not None:
        document = _load_schema_document(schema_path)
    if null_values is not None:
        document = {**(document or {}), "null_values": list(null_values)}
    if delimiter is None:
        delimiter = (document or {}).get("delimiter") or ","
    sample_file, header, sample = schema_sample(sources, delimiter)
    _warn_of_another_delimiter(header, delimiter, sample_file)
    document = _index_column(header, sample, document, drop_index, sample_file)
    for option, column in (
        ("--image-column", roles.image_column),
        ("--label-column", roles.label_column),
        ("--split-column", roles.split_column),
    ):
        if column is not None and column not in header:
            raise UsageError(
                f"{option} {column!r} is not a column of {sample_file} (columns: "
                f"{', '.join(header)[:200]})"
            )
    try:
        schema = resolve_schema(
            header,
            document=document,
            sample=sample,
            source_name=schema_path or sample_file,
            delimiter=delimiter,
        )
    except SchemaError as error:
        raise UsageError(str(error)) from None
    declared = set((document or {}).get("columns") or {})
    schema = _with_special_columns(schema, roles, declared)
    _check_feature_names(schema, roles)
    return schema


def _read_schema_sample(path: str, delimiter: str):
    """The header and type sample of the CSV file that defines the schema, read as the run
    reads its files (open_csv: Python's gzip, which checks a `.gz` file's CRC and length and
    takes the zero padding gzip(1) and pandas take after it; Beam's decompressor refused that
    padding and, at damaged data, lost what it had decompressed: "damaged (at byte 0)").

    A file that cannot be read to its end gives the sample of the rows before the place where
    its reading stopped; the run then fails on it, naming the file, the byte and the last row,
    as it does for any other file (where this one's sample was a usage error).

    Raises:
        CsvReadFailure: the file cannot be read to its end, and no row comes before that.
        InputError, OSError, ...: as read_sample and open_csv.
    """
    with open_csv(path) as opened:
        try:
            return read_sample(opened.stream, delimiter=delimiter)
        except CsvReadFailure as failure:
            stopped = failure
    with open_csv(path) as opened:
        before, _ = read_stream_piece(opened.stream, stopped.offset)
    if not before:  # it failed at its first byte: it is not empty
        raise stopped
    header, sample = read_sample(io.BytesIO(before), delimiter=delimiter)
    if sample.num_rows == 0:
        raise stopped
    return header, sample


def _warn_of_another_delimiter(header: Sequence[str], delimiter: str, sample_file: str) -> None:
    """A header holding another common delimiter more often than the one it was split on
    (a single column named `a;b;c`, or `a;b;c,d` in two): most likely a file separated by it
    (a semicolon-separated export), read with the wrong delimiter."""
    for other in ";\t|":
        found = sum(name.count(other) for name in header)
        if other != delimiter and found and found >= len(header):
            shown = "\\t" if other == "\t" else other
            columns = (
                f"a single column named {header[0][:60]!r}"
                if len(header) == 1
                else f"a header of {len(header)} columns holding {found} {shown!r}"
            )
            LOGGER.warning(
                "%s has %s: is it separated by %r? (--delimiter %r)",
                display(sample_file),
                columns,
                shown,
                shown,
            )
            return


# Column names pandas gives a DataFrame's index when it reads a CSV written with it and writes
# it again (`Unnamed: 0`), besides the empty name `df.to_csv()` writes.
_INDEX_NAMES = ("", "Unnamed: 0")


def _index_column(
    header: Sequence[str], sample, document: dict | None, drop_index: bool, sample_file: str
) -> dict | None:
    """The schema document, with the first column dropped for --drop-index.

    Raises:
        UsageError: --drop-index and a named first column; or an unnamed first column holding
            0, 1, 2, ... (a DataFrame index written by `df.to_csv()`) without --drop-index.
    """
    first = header[0] if header else None
    if drop_index:
        if first not in _INDEX_NAMES:
            raise UsageError(
                f"--drop-index: the first column of {display(sample_file)} is named "
                f"{first!r}, not an unnamed index column"
            )
        columns = dict((document or {}).get("columns") or {})
        columns[first] = {"drop": True}
        return {**(document or {}), "columns": columns}
    if first not in _INDEX_NAMES or first in ((document or {}).get("columns") or {}):
        return document
    if not _counts_from_zero(sample.column(0)):
        if first == "":
            raise UsageError(
                f"{display(sample_file)}: the first column has no name; give it a feature key "
                "in a schema file, or drop it (--drop-index drops an unnamed first column)"
            )
        return document
    advice = "write it with df.to_csv(..., index=False), or pass --drop-index"
    if first == "":
        raise UsageError(
            f"{display(sample_file)}: the first column has no name and holds 0, 1, 2, ...: a "
            f"pandas DataFrame index written by df.to_csv(); {advice}"
        )
    LOGGER.warning(
        "%s: the first column, %r, holds 0, 1, 2, ...: a pandas DataFrame index, converted as a "
        "feature; to leave it out, %s",
        display(sample_file),
        first,
        advice,
    )
    return document


def _counts_from_zero(column) -> bool:
    """Whether a sample column's texts are 0, 1, 2, ... in order."""
    texts = column.to_pylist()
    return bool(texts) and all(
        text is not None and text.strip() == str(i).encode() for i, text in enumerate(texts)
    )


def _check_feature_names(schema: CsvSchema, roles: CsvRoles) -> None:
    """A CSV column must not become a feature recordforge writes itself (label, image/...)."""
    written = set()
    if roles.image_column:
        written |= {IMAGE_ENCODED, IMAGE_FORMAT, IMAGE_HEIGHT, IMAGE_WIDTH, IMAGE_CHANNELS}
        written.add(IMAGE_FILENAME)
    if roles.label_column:
        written |= {IMAGE_LABEL, IMAGE_LABEL_TEXT} if roles.image_column else {LABEL, LABEL_TEXT}
    special = {roles.image_column, roles.label_column, roles.split_column}
    for spec in schema.columns:
        if spec.column not in special and spec.feature in written:
            raise UsageError(
                f"column {spec.column!r} would become feature {spec.feature!r}, which recordforge "
                "writes itself here; give it another name in a schema file "
                f"(columns: {{{spec.column}: {{feature: ...}}}}) or drop it"
            )


def _with_special_columns(schema: CsvSchema, roles: CsvRoles, declared: set[str]) -> CsvSchema:
    # Image paths and split names are text whatever they look like; labels are ids or names.
    columns = []
    for spec in schema.columns:
        if (
            spec.column in (roles.image_column, roles.label_column, roles.split_column)
            and spec.feature != spec.column
        ):
            # Their features are fixed (image/*, label and label/text, the split): a rename
            # in the schema was dropped without a word.
            raise UsageError(
                f"column {spec.column!r} names images, labels or splits, whose features have "
                f"names of their own: drop its `feature: {spec.feature}` from the schema"
            )
        wanted = None
        if spec.column in (roles.image_column, roles.split_column):
            wanted = "bytes"
        elif spec.column == roles.label_column and spec.dtype == "float":
            wanted = "bytes"
        if wanted and (spec.dtype != wanted or spec.is_list):
            if spec.column in declared:
                raise UsageError(
                    f"column {spec.column!r} names images, labels or splits: declare it as a "
                    f"scalar {'int64 or ' if spec.column == roles.label_column else ''}bytes column"
                )
            spec = dataclasses.replace(spec, dtype=wanted, is_list=False)
        columns.append(spec)
    return dataclasses.replace(schema, columns=tuple(columns))


def _load_schema_document(path: str) -> dict:
    text = read_schema_text(path)
    try:
        return parse_schema_document(text, source_name=path)
    except SchemaError as error:
        raise UsageError(str(error)) from None


def read_schema_text(path: str) -> str:
    """The text of a schema file (local or remote), refused with one line when it is not a
    regular file, cannot be read, is larger than a schema can be, or is not UTF-8."""
    resolved = normalize_path(path)
    if not has_scheme(resolved) and os.path.exists(resolved) and not os.path.isfile(resolved):
        # A folder, FIFO or device: never opened (a FIFO would wait for a writer forever).
        raise UsageError(f"schema file {path!r} is not a regular file")
    try:
        with open_file(resolved) as f:
            data = f.read(MAX_SCHEMA_BYTES + 1)
    except STORAGE_ERRORS as error:
        raise UsageError(f"cannot read schema file {path!r}: {_first_line(error)}") from None
    if len(data) > MAX_SCHEMA_BYTES:
        raise UsageError(
            f"schema file {path!r} is larger than {MAX_SCHEMA_BYTES >> 20} MiB; is it a schema?"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"schema file {path!r} is not UTF-8 text") from None


def default_name(output: str) -> str:
    """The dataset name when --name is not given: the output folder's name, made file-safe."""
    base = output.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.") or "dataset"
    return name if is_valid_dataset_name(name) else "dataset"


def check_name(name: str) -> None:
    if not is_valid_dataset_name(name):
        raise UsageError(
            f"--name {name!r}: use letters, digits, '_', '-' and '.' only, starting with a letter "
            "or digit"
        )


def check_file_name_lengths(
    output: str,
    name: str,
    splits,
    compression: str,
    write_index: bool,
    *,
    given_name: bool = True,
) -> None:
    """Refuses a dataset name and split names whose shard file names a local file system
    cannot hold (more than 255 bytes while staged): the run failed where it wrote its first
    shard, with a traceback. Object stores take longer names, and are not checked."""
    if has_scheme(output):
        return
    for split in splits:
        longest = longest_shard_file_name(name, split, compression, write_index)
        if longest > MAX_FILE_NAME_BYTES:
            whose = (
                "--name" if given_name else "the dataset name (the output folder's name; --name)"
            )
            raise UsageError(
                f"{whose} {_shown(name)} and split {_shown(split)} give shard file names of "
                f"{longest:,} bytes as they are written, more than the {MAX_FILE_NAME_BYTES} a "
                "file name may have: shorten them by "
                f"{longest - MAX_FILE_NAME_BYTES:,} bytes"
            )


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...") + f" ({len(text):,} chars)"


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
