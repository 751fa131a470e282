"""Statistics for the reports, as plain data: no Beam, no file access.

`SampleStats` sums up records read one by one (the first records of a split, for
`inspect --html`): the images' width, height, format and channels as their features record
them, and per other feature how many records lack it, the range and mean of its numbers and its
most frequent values. `ErrorSample` counts errors by kind and keeps the first few of each (for
`plan` and `inspect --html`).
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable, Mapping, Sequence

from recordforge.schemas import features as keys
from recordforge.transforms.core.files.filenames import display
from recordforge.transforms.core.records import ErrorRecord
from recordforge.transforms.core.reports.summary import HISTOGRAM_BINS, LABEL_KEYS, format_bytes

TOP_VALUES = 5  # most frequent values shown per column
VALUE_PREFIX = 100  # bytes values are counted by their first this many bytes
ERRORS_PER_KIND = 5  # errors shown per kind

IMAGE_KEYS = frozenset(
    {
        keys.IMAGE_ENCODED,
        keys.IMAGE_FORMAT,
        keys.IMAGE_HEIGHT,
        keys.IMAGE_WIDTH,
        keys.IMAGE_CHANNELS,
        keys.IMAGE_FILENAME,
    }
)


def column_keys(feature_keys: Iterable[str], labelled: bool) -> list[str]:
    """The features shown as columns: all but the image's own and, with labels, the label's
    (the report shows those in their own sections)."""
    feature_keys = list(feature_keys)
    skip = set(IMAGE_KEYS) if keys.IMAGE_ENCODED in feature_keys else set()
    if labelled:
        skip.update(key for pair in LABEL_KEYS for key in pair)
    return [key for key in feature_keys if key not in skip]


class _Column:
    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.present = 0  # records with at least one value
        self.values = 0
        self.low = self.high = None
        self.total = 0.0
        self.counts: collections.Counter = collections.Counter()
        self.cut = False  # some bytes values were counted by their prefix

    def add(self, dtype: str, values: Sequence) -> None:
        if not values:
            return
        self.present += 1
        self.values += len(values)
        if dtype == "bytes":
            for value in values:
                if len(value) > VALUE_PREFIX:
                    value = value[:VALUE_PREFIX]
                    self.cut = True
                self.counts[value] += 1
            return
        self.counts.update(values)
        low, high = min(values), max(values)
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)
        self.total += sum(values)

    def to_dict(self, key: str, records: int) -> dict:
        numeric = self.dtype in ("int64", "float") and self.values
        top = sorted(self.counts.items(), key=lambda item: (-item[1], _order(item[0])))
        return {
            "key": key,
            "dtype": self.dtype,
            "present": self.present,
            "missing": records - self.present,
            "values": self.values,
            "min": self.low if numeric else None,
            "max": self.high if numeric else None,
            "mean": self.total / self.values if numeric else None,
            "distinct": len(self.counts),
            "top": [
                {"value": _text(self.dtype, value), "count": count}
                for value, count in top[:TOP_VALUES]
            ],
            "prefix_counted": self.cut,
        }


def _order(value):
    # Ties in count: smaller values first; NaN (which compares false) last.
    return (value != value, value if value == value else 0)


def _text(dtype: str, value) -> str:
    if dtype == "bytes":
        return format_bytes(value)
    if dtype == "float":
        return f"{value:.7g}"
    return str(value)


class SampleStats:
    """Statistics of records added one by one.

    Args:
        features: {key: dtype} of the dataset's features.
        columns: the keys to keep column statistics for (see `column_keys`).
    """

    def __init__(self, features: Mapping[str, str], columns: Sequence[str]) -> None:
        self.records = 0
        self._columns = {key: _Column(features[key]) for key in columns}
        self._widths: list[int] = []
        self._heights: list[int] = []
        self._formats: collections.Counter = collections.Counter()
        self._channels: collections.Counter = collections.Counter()

    def add(self, record: Mapping[str, tuple[str, Sequence]]) -> None:
        """Count one record, given as {key: (dtype, values)} (codec.to_python)."""
        self.records += 1
        for key, column in self._columns.items():
            if key in record:
                column.add(*record[key])
        width, height = _first(record, keys.IMAGE_WIDTH), _first(record, keys.IMAGE_HEIGHT)
        if width is not None and height is not None:
            self._widths.append(width)
            self._heights.append(height)
        image_format = _first(record, keys.IMAGE_FORMAT)
        if image_format is not None:
            self._formats[image_format.decode("utf-8", errors="replace")] += 1
        channels = _first(record, keys.IMAGE_CHANNELS)
        if channels is not None:
            self._channels[channels] += 1

    def to_dict(self) -> dict:
        """{"records", "images": {...} or None, "columns": [...]}, JSON-able."""
        images = None
        if self._widths or self._formats or self._channels:
            images = {
                "count": max(len(self._widths), sum(self._formats.values())),
                "width": _distribution(self._widths),
                "height": _distribution(self._heights),
                "formats": dict(_ranked(self._formats)),
                "channels": {str(c): n for c, n in _ranked(self._channels)},
            }
        return {
            "records": self.records,
            "images": images,
            "columns": [column.to_dict(key, self.records) for key, column in self._columns.items()],
        }


def _first(record: Mapping, key: str):
    entry = record.get(key)
    return entry[1][0] if entry and entry[1] else None


def _ranked(counts: collections.Counter) -> list:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _distribution(values: Sequence[int]) -> dict:
    return {
        "min": min(values, default=None),
        "max": max(values, default=None),
        "histogram": int_histogram(values),
    }


def int_histogram(values: Sequence[int], bins: int = HISTOGRAM_BINS) -> list[dict]:
    """Bins of whole numbers that do not overlap, `low`..`high` inclusive, all as wide (the
    last may be narrower), from the smallest value to the largest: [{low, high, count}]."""
    if not values:
        return []
    low, high = min(values), max(values)
    span = high - low + 1
    width = -(-span // min(bins, span))
    counts = [0] * -(-span // width)
    for value in values:
        counts[(value - low) // width] += 1
    return [
        {"low": low + i * width, "high": min(low + (i + 1) * width - 1, high), "count": count}
        for i, count in enumerate(counts)
    ]


class ErrorSample:
    """Errors counted by kind, with the first `per_kind` of each kind (in the errors files'
    order: by input path and row). Mergeable, as a Beam combiner accumulator."""

    def __init__(self, per_kind: int = ERRORS_PER_KIND) -> None:
        self.per_kind = per_kind
        self.counts: collections.Counter = collections.Counter()
        self.first: dict[str, list[ErrorRecord]] = {}

    def add(self, error: ErrorRecord) -> None:
        self.counts[error.error] += 1
        kept = self.first.setdefault(error.error, [])
        if len(kept) < self.per_kind or error.sort_key() < kept[-1].sort_key():
            bisect.insort(kept, error, key=ErrorRecord.sort_key)
            del kept[self.per_kind :]

    def merge(self, other: ErrorSample) -> ErrorSample:
        self.counts.update(other.counts)
        for kept in other.first.values():
            for error in kept:
                self.counts[error.error] -= 1  # add() counts it again
                self.add(error)
        return self

    def full(self, kinds: Iterable[str]) -> bool:
        """Whether every one of `kinds` has its `per_kind` errors kept."""
        return all(len(self.first.get(kind, ())) >= self.per_kind for kind in kinds)

    def to_dict(self, counts: Mapping[str, int] | None = None) -> dict[str, dict]:
        """{kind: {"count", "first": [{"path", "row", "stage", "message"}]}} by kind.

        `counts`: the true counts by kind when not every error was added (the manifest's).
        """
        counts = self.counts if counts is None else counts
        return {
            kind: {
                "count": counts[kind],
                "first": [
                    # Escaped as the errors files show them (core.files.filenames).
                    {
                        "path": display(e.path),
                        "row": e.row,
                        "stage": e.stage,
                        "message": display(e.message),
                    }
                    for e in self.first.get(kind, ())
                ],
            }
            for kind in sorted(counts)
            if counts[kind]
        }
