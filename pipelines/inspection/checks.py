"""Verifying a dataset against its manifest: the checks alone, with no file access of their own.

The caller (pipelines/verify.py) lists the folder and opens the files; here each check turns what
it is given (a shard's stream, a file listing, the manifest) into Findings.
"""

from __future__ import annotations

import collections
import gzip
import math
import operator
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass

from google.protobuf.message import DecodeError

from recordforge.schemas import codec
from recordforge.schemas.features import (
    IMAGE_CHANNELS,
    IMAGE_ENCODED,
    IMAGE_FORMAT,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    FeatureSpec,
)
from recordforge.schemas.manifest import Manifest, ShardInfo
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.files.naming import (
    STAGING_DIR,
    TEMP_DIR_PREFIX,
    indexed_shard,
    shard_file_pattern,
)
from recordforge.transforms.core.images.integrity import check_image
from recordforge.transforms.core.images.probe import DEFAULT_MAX_PIXELS
from recordforge.transforms.core.tfrecord.framing import (
    DATA_CRC,
    FRAMING_BYTES,
    LENGTH_CRC,
    TRUNCATED,
    scan_records,
)

ERROR = "error"
WARNING = "warning"

# The checks, by the name a Finding carries (stable: scripts match on them).
CHECKS: dict[str, str] = {
    "missing_file": "a file the manifest lists does not exist",
    "size_mismatch": "a shard's size differs from the manifest's num_bytes",
    "read_error": "a file could not be read (the filesystem failed)",
    "gzip": "a gzip shard does not decompress (corrupt or truncated compressed stream)",
    LENGTH_CRC: "a record's length field fails its CRC; the rest of the shard is not checked",
    DATA_CRC: "a record's payload fails its CRC; later records are still checked",
    TRUNCATED: "the shard ends inside a record; the rest of the shard is not checked",
    "not_example": "a payload does not parse as a tf.train.Example",
    "unknown_feature": "a record has a feature the manifest does not list",
    "missing_feature": "a record lacks a feature the manifest says every record has",
    "wrong_dtype": "a feature holds another type than the manifest's dtype",
    "wrong_length": "a fixed-shape feature holds another number of values than its shape",
    "image_decode": "(--deep) image/encoded does not decode",
    "image_facts": "(--deep) the decoded image disagrees with its size, format or channel features",
    "index": "a shard's index file disagrees with the records read",
    "record_count": "a shard holds another number of records than the manifest lists",
    "label_counts": "a split's label_counts differ from the labels its records hold",
    "split_totals": "a split's num_records, num_bytes or num_shards is not the sum of its shards",
    "dataset_totals": "num_records, num_inputs or errors.count do not add up",
    "stray_file": "a file named like one of the dataset's shards (or indexes) is not listed",
    "temp_folder": "(warning) a conversion's temporary folder was left behind",
}

# The dtype each Example oneof holds.
_KIND_DTYPE = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}
_DTYPE_KIND = {dtype: kind for kind, dtype in _KIND_DTYPE.items()}
# What reading a decompressing stream raises on bad compressed data (BadGzipFile is an OSError:
# the caller's stream may raise other OSErrors, which are read errors, not gzip ones).
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)
_STREAM_ERRORS = (OSError, EOFError, zlib.error)


@dataclass(frozen=True)
class Finding:
    """One problem: which check found it, in which file, where, and what is wrong.

    Attributes:
        check: a key of CHECKS.
        file: the file, relative to the dataset folder (the manifest's name for manifest totals).
        record: the record's index in its shard (from 0), or None for a problem of a whole file.
        offset: the byte offset of the record's frame (in the uncompressed stream of a gzip
            shard), or None.
        message: what is wrong, in words.
        severity: ERROR (verification fails) or WARNING (reported; verification still passes).
    """

    check: str
    file: str
    record: int | None
    offset: int | None
    message: str
    severity: str = ERROR

    def to_dict(self) -> dict:
        return asdict(self)


class Findings:
    """Collects findings: all of them counted, at most `max_per_file` per file kept in detail.

    Memory stays bounded whatever a corrupt shard holds; the counts still cover everything.
    """

    def __init__(self, max_per_file: int | None = 20) -> None:
        self.max_per_file = max_per_file
        self.listed: list[Finding] = []
        self.omitted: dict[str, int] = {}
        self.by_check: collections.Counter[str] = collections.Counter()
        self.failing_checks: collections.Counter[str] = collections.Counter()  # errors only
        self.errors = 0
        self.warnings = 0
        self._per_file: collections.Counter[str] = collections.Counter()

    def add(self, finding: Finding) -> None:
        self.by_check[finding.check] += 1
        if finding.severity == ERROR:
            self.errors += 1
            self.failing_checks[finding.check] += 1
        else:
            self.warnings += 1
        self._per_file[finding.file] += 1
        if self.max_per_file is None or self._per_file[finding.file] <= self.max_per_file:
            self.listed.append(finding)
        else:
            self.omitted[finding.file] = self.omitted.get(finding.file, 0) + 1

    def extend(self, findings: Iterable[Finding]) -> None:
        for finding in findings:
            self.add(finding)

    @property
    def ok(self) -> bool:
        """Whether nothing fails verification (warnings allowed)."""
        return self.errors == 0


class ExampleChecker:
    """Checks parsed Examples against a feature spec; built once per dataset, cheap per record.

    Most records fit, so `problems` first runs a test with one map lookup and one length per
    spec key; only a record that fails it is examined feature by feature to say what is wrong.
    """

    def __init__(self, features: Mapping[str, FeatureSpec]) -> None:
        self._specs = dict(features)
        # key -> (the Example oneof its dtype uses, the exact value count or None for any).
        self._expected = {
            key: (_DTYPE_KIND[spec.dtype], _fixed_count(spec.shape))
            for key, spec in features.items()
        }
        self._required = tuple(sorted(k for k, spec in features.items() if not spec.optional))
        # (key, values of the expected list, exact count or None, required), for the quick test.
        self._plan = tuple(
            (key, operator.attrgetter(f"{kind}.value"), count, not self._specs[key].optional)
            for key, (kind, count) in sorted(self._expected.items())
        )

    def problems(self, example: codec.Example) -> list[tuple[str, str]]:
        """(check, message) for each way the Example departs from the spec; [] when it fits."""
        feature_map = example.features.feature
        present = 0
        for key, values, count, required in self._plan:
            feature = feature_map.get(key)
            if feature is None:
                if required:
                    return self._diagnose(feature_map)
                continue
            present += 1
            # A oneof: a non-empty list of the expected kind proves the kind too.
            n = len(values(feature))
            if count is None:
                if n == 0 and feature.WhichOneof("kind") not in (None, self._expected[key][0]):
                    return self._diagnose(feature_map)
            elif n != count or (n == 0 and feature.WhichOneof("kind") is None):
                return self._diagnose(feature_map)
        if present != len(feature_map):  # keys the spec does not have
            return self._diagnose(feature_map)
        return []

    def _diagnose(self, feature_map) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        expected = self._expected
        for key in sorted(feature_map):
            feature = feature_map[key]
            if key not in expected:
                found.append(("unknown_feature", f"feature {key!r} is not in the manifest"))
                continue
            kind, count = expected[key]
            actual = feature.WhichOneof("kind")
            if actual is None:  # a Feature with no list set reads as an empty list of any type
                values = 0
                if count == 0:  # ... where TensorFlow takes it for a missing key: no FixedLen
                    shape = list(self._specs[key].shape)
                    found.append(
                        (
                            "missing_feature",
                            f"feature {key!r} has no list set, which TensorFlow parses as a "
                            f"missing key; its shape {shape} needs one",
                        )
                    )
                    continue
            elif actual != kind:
                found.append(
                    (
                        "wrong_dtype",
                        f"feature {key!r} holds {_KIND_DTYPE[actual]} values; "
                        f"the manifest says {self._specs[key].dtype}",
                    )
                )
                continue
            else:
                values = len(getattr(feature, kind).value)
            if count is not None and values != count:
                shape = list(self._specs[key].shape)
                found.append(
                    (
                        "wrong_length",
                        f"feature {key!r} has {values} value{'s' if values != 1 else ''}; "
                        f"its shape {shape} needs exactly {count}",
                    )
                )
        for key in self._required:
            if key not in feature_map:
                found.append(("missing_feature", f"required feature {key!r} is missing"))
        return found


def _fixed_count(shape: tuple[int, ...]) -> int | None:
    """The exact number of values a shape needs: () is 1, (k,) is k; None if variable (-1)."""
    if any(dim < 0 for dim in shape):
        return None
    return math.prod(shape)


class ShardVerifier:
    """Checks one shard's record stream: framing and CRCs, Examples, images, its index.

    After `findings(...)` is exhausted, `records` is the number of records framed (sound or with
    a bad payload CRC), `end_offset` the offset just after the last of them, and `complete`
    whether the stream was read to its end (False when framing or decompression stopped it).
    """

    def __init__(
        self,
        shard: ShardInfo,
        checker: ExampleChecker,
        *,
        compressed: bool = False,
        deep: bool = False,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        label_key: str | None = None,
    ) -> None:
        self.shard = shard
        self.label_key = label_key
        self.label_ids: collections.Counter[int] = collections.Counter()  # id -> records
        self.checker = checker
        self.compressed = compressed
        self.deep = deep
        self.max_pixels = max_pixels
        self.records = 0
        self.end_offset = 0
        self.complete = False

    def findings(
        self, stream, index_lines: Iterable[bytes] | None = None, index_file: str | None = None
    ) -> Iterator[Finding]:
        """Read `stream` (the shard's uncompressed TFRecord stream) and yield what is wrong.

        Args:
            stream: a binary stream of the shard's records, decompressed for gzip shards.
            index_lines: the lines of the shard's index file ("offset length" per record), to
                compare with the records read; None when the shard has no index.
            index_file: the index file's name, for its findings.
        """
        file = self.shard.file
        index = _IndexComparison(index_lines, index_file or "") if index_lines is not None else None
        frames = scan_records(stream)
        while True:
            try:
                offset, data, problem = next(frames)
            except StopIteration:
                self.complete = True
                break
            except _STREAM_ERRORS as error:
                yield self._stream_failure(error)
                break
            if problem is not None and problem.kind != DATA_CRC:
                yield Finding(
                    problem.kind, file, self.records, offset, f"{problem.message}; {self._rest()}"
                )
                break
            record = self.records
            self.records += 1
            self.end_offset = offset + FRAMING_BYTES + len(data)
            if index is not None:
                yield from index.check(record, offset, FRAMING_BYTES + len(data))
            if problem is not None:  # a bad payload CRC: the bytes are wrong, do not parse them
                yield Finding(problem.kind, file, record, offset, problem.message)
                continue
            try:
                example = codec.parse(data)
            except DecodeError as error:
                message = f"the payload does not parse as a tf.train.Example ({error})"
                yield Finding("not_example", file, record, offset, message)
                continue
            for check, message in self.checker.problems(example):
                yield Finding(check, file, record, offset, message)
            if self.label_key is not None:
                label = _single_value(example.features.feature, self.label_key)
                if isinstance(label, int):
                    self.label_ids[label] += 1
            if self.deep:
                for check, message in self._image_problems(example):
                    yield Finding(check, file, record, offset, message)
        if self.complete:
            if self.records != self.shard.num_records:
                yield Finding(
                    "record_count",
                    file,
                    None,
                    None,
                    f"the shard holds {self.records:,} records; "
                    f"the manifest lists {self.shard.num_records:,}",
                )
            if index is not None:
                yield from index.finish(self.records, self.end_offset)

    def _rest(self) -> str:
        """How much of the shard a stop leaves unchecked."""
        listed = self.shard.num_records
        if self.records >= listed:
            return (
                f"{self.records:,} records were checked before it (the manifest lists {listed:,})"
            )
        return f"{listed - self.records:,} of the {listed:,} listed records not checked"

    def _stream_failure(self, error: BaseException) -> Finding:
        where = self.end_offset
        detail = str(error).strip() or type(error).__name__
        if self.compressed and isinstance(error, _GZIP_ERRORS):
            check = "gzip"
            what = (
                "the gzip stream ends before its end marker"
                if isinstance(error, EOFError)
                else f"the gzip stream is corrupt ({detail})"
            )
        else:
            check = "read_error"
            what = f"reading failed ({type(error).__name__}: {detail})"
        message = f"{what}; {self._rest()}"
        return Finding(check, self.shard.file, self.records, where, message)

    def _image_problems(self, example: codec.Example) -> list[tuple[str, str]]:
        feature_map = example.features.feature
        if IMAGE_ENCODED not in feature_map:
            return []
        encoded = feature_map[IMAGE_ENCODED].bytes_list.value
        if len(encoded) != 1:
            return []  # the spec check reports it
        try:
            # As the converter judges an image before writing it (--check-pixels), whose checks
            # follow TensorFlow's decoders: not merely whether Pillow decodes it.
            facts = check_image(encoded[0], max_pixels=self.max_pixels)
        except InputError as error:
            return [("image_decode", f"image/encoded does not decode: {error.kind}: {error}")]
        decoded = {
            IMAGE_WIDTH: facts.width,
            IMAGE_HEIGHT: facts.height,
            IMAGE_CHANNELS: facts.channels,
            IMAGE_FORMAT: facts.format.encode(),
        }
        wrong = []
        for key, value in decoded.items():
            stored = _single_value(feature_map, key)
            if stored is not None and stored != value:
                wrong.append(f"{key} is {_show(stored)} but the image decodes as {_show(value)}")
        return [("image_facts", "; ".join(wrong))] if wrong else []


def _single_value(feature_map, key: str):
    if key not in feature_map:
        return None
    feature = feature_map[key]
    kind = feature.WhichOneof("kind")
    if kind is None:
        return None
    values = getattr(feature, kind).value
    return values[0] if len(values) == 1 else None


def _show(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _IndexComparison:
    """Compares a shard's index lines ("offset length", length = the whole frame) with records."""

    def __init__(self, lines: Iterable[bytes], file: str) -> None:
        self._lines = iter(lines)
        self._file = file
        self._ended = False  # the index ran out of lines (reported once)

    def check(self, record: int, offset: int, length: int) -> Iterator[Finding]:
        if self._ended:
            return
        line = next(self._lines, None)
        if line is None:
            self._ended = True
            yield Finding(
                "index",
                self._file,
                record,
                offset,
                f"the index ends after {record:,} lines; the shard has more records",
            )
            return
        parsed = _parse_index_line(line)
        if parsed is None:
            text = line.decode("utf-8", "replace").rstrip("\n")
            yield Finding(
                "index",
                self._file,
                record,
                offset,
                f"line {record + 1} is not 'offset length': {text[:60]!r}",
            )
        elif parsed != (offset, length):
            yield Finding(
                "index",
                self._file,
                record,
                offset,
                f"line {record + 1} says offset {parsed[0]} length {parsed[1]}; "
                f"the record is at {offset} and {length} bytes long",
            )

    def finish(self, records: int, end_offset: int) -> Iterator[Finding]:
        if self._ended:
            return
        extra = sum(1 for line in self._lines if line.strip())
        if extra:
            yield Finding(
                "index",
                self._file,
                records,
                end_offset,
                f"the index has {extra:,} more line{'s' if extra != 1 else ''} than the "
                f"shard's {records:,} records",
            )


def _parse_index_line(line: bytes) -> tuple[int, int] | None:
    parts = line.split()
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    return int(parts[0]), int(parts[1])


# The FLG bits RFC 1952 reserves: "a compliant decompressor must give an error indication if
# any reserved bit is non-zero", and zlib (TensorFlow's and Beam's gzip readers) does, whereas
# Python's gzip module ignores them.
_GZIP_RESERVED_FLAGS = 0xE0


def check_gzip_header(relative: str, head: bytes) -> list[Finding]:
    """The first bytes of a gzip shard: what zlib refuses there that Python's gzip reads."""
    if len(head) < 4 or head[:2] != b"\x1f\x8b" or not head[3] & _GZIP_RESERVED_FLAGS:
        return []  # no gzip header at all is the stream's own finding
    message = (
        f"the gzip header sets reserved flag bits ({head[3] & _GZIP_RESERVED_FLAGS:#04x}), "
        "which zlib refuses: TensorFlow cannot read the shard"
    )
    return [Finding("gzip", relative, None, None, message)]


def check_file(relative: str, listed_size: int | None, actual_size: int | None) -> list[Finding]:
    """A listed file: it must exist and, when the manifest gives its size, have that size."""
    if actual_size is None:
        return [Finding("missing_file", relative, None, None, "listed in the manifest, not found")]
    if listed_size is not None and actual_size != listed_size:
        return [
            Finding(
                "size_mismatch",
                relative,
                None,
                None,
                f"the file has {actual_size:,} bytes; the manifest lists {listed_size:,}",
            )
        ]
    return []


def check_totals(raw: Mapping, manifest: Manifest, manifest_file: str) -> list[Finding]:
    """The manifest's own sums: each split's totals over its shards, and the dataset's counts.

    `raw` is the manifest as parsed JSON (the Manifest model recomputes totals, so it cannot
    tell a stated total from a computed one).
    """
    found = []

    def add(check: str, message: str) -> None:
        found.append(Finding(check, manifest_file, None, None, message))

    for name, split in manifest.splits.items():
        stated = raw["splits"][name]
        actual = {
            "num_records": split.num_records,
            "num_bytes": split.num_bytes,
            "num_shards": len(split.shards),
        }
        for field, value in actual.items():
            if stated.get(field) != value:
                add(
                    "split_totals",
                    f"split {name!r}: {field} is {stated.get(field)!r}; "
                    f"its shards add up to {value:,}",
                )
    if raw.get("num_records") != manifest.num_records:
        add(
            "dataset_totals",
            f"num_records is {raw.get('num_records')!r}; the splits add up to "
            f"{manifest.num_records:,}",
        )
    if not manifest.counts_add_up():
        add(
            "dataset_totals",
            f"num_inputs is {manifest.num_inputs:,}, not num_records + errors.count = "
            f"{manifest.num_records:,} + {manifest.errors.count:,}",
        )
    return found


def check_label_counts(
    split: str, stated: Mapping[str, int], held: Mapping[str, int], manifest_file: str
) -> list[Finding]:
    """A split's label_counts against the counts of the labels its records hold."""
    if dict(stated) == dict(held):
        return []
    differ = [
        f"{name!r}: {stated[name]:,}" if name in stated else f"no {name!r}"
        for name in [*stated, *(name for name in held if name not in stated)]
        if stated.get(name, 0) != held.get(name, 0) or (name in stated) != (name in held)
    ]
    shown = "; ".join(differ[:5]) + ("; ..." if len(differ) > 5 else "")
    held_shown = ", ".join(f"{name!r}: {count:,}" for name, count in held.items())
    message = f"split {split!r}: label_counts say {shown}; the records hold {held_shown}"
    return [Finding("label_counts", manifest_file, None, None, message)]


def check_error_lines(manifest: Manifest, manifest_file: str, lines: int) -> list[Finding]:
    """errors.count against the lines the errors files actually hold."""
    if lines == manifest.errors.count:
        return []
    return [
        Finding(
            "dataset_totals",
            manifest_file,
            None,
            None,
            f"errors.count is {manifest.errors.count:,}; the errors files hold {lines:,} lines",
        )
    ]


def listed_files(manifest: Manifest) -> set[str]:
    """Every file the manifest names: shards, their index files and the errors files."""
    names = set(manifest.errors.files)
    for split in manifest.splits.values():
        for shard in split.shards:
            names.add(shard.file)
            if shard.index is not None:
                names.add(shard.index)
    return names


def check_unlisted(files: Mapping[str, int], manifest: Manifest) -> list[Finding]:
    """Stray files and leftover temporary folders in a listing of the dataset folder.

    Args:
        files: every file under the folder (relative path -> size), subfolders included.
        manifest: the dataset's manifest.

    Stray: a top-level file named like a shard of this dataset, or a file in `index/` (or at the
    top, where indexes once were) named like the index of one, that the manifest does not list
    (say, from an older conversion with other shard counts). Files of other names are left alone.
    A run's working folder (or an earlier version's temporary one) is a warning: the dataset is
    complete (its manifest is in place), but a run left it.
    """
    pattern = shard_file_pattern(manifest.name)
    listed = listed_files(manifest)
    found = []
    temp: dict[str, list[int]] = {}
    for relative, size in sorted(files.items()):
        top, _, rest = relative.partition("/")
        if top.startswith(TEMP_DIR_PREFIX) or top == STAGING_DIR:
            entry = temp.setdefault(top, [0, 0])
            entry[0] += 1
            entry[1] += size
            continue
        if relative in listed:
            continue
        shard = indexed_shard(relative)
        if rest and shard is None:
            continue
        if pattern.match(shard or relative):
            what = "an index" if shard is not None else "a shard"
            found.append(
                Finding(
                    "stray_file",
                    relative,
                    None,
                    None,
                    f"named like {what} of dataset {manifest.name!r} but not in the manifest "
                    f"({size:,} bytes)",
                )
            )
    for folder, (count, size) in temp.items():
        found.append(
            Finding(
                "temp_folder",
                folder,
                None,
                None,
                f"a conversion's temporary folder was left behind ({count:,} files, {size:,} "
                "bytes); the dataset does not need it",
                WARNING,
            )
        )
    return found
