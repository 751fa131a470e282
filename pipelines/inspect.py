"""`recordforge inspect OUT`: a dataset's summary, its first records, and an HTML contact sheet.

The glue between a dataset folder (read through Beam FileSystems, so gs:// works) and the pure
formatting in transforms.core.reports.summary and pipelines.inspection.contact_sheet.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from itertools import islice

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.pipelines import preflight
from recordforge.pipelines.dataset import DatasetFolder, open_dataset
from recordforge.pipelines.inspection.contact_sheet import (
    ContactSheet,
    Sample,
    SampleGroup,
    make_thumbnail,
    render_page,
)
from recordforge.pipelines.runner import beam_options
from recordforge.schemas import codec
from recordforge.schemas import features as keys
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files.filenames import display, from_os
from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.core.planning.labels import named_counts
from recordforge.transforms.core.records import ErrorRecord
from recordforge.transforms.core.reports.statistics import (
    ERRORS_PER_KIND,
    ErrorSample,
    SampleStats,
    column_keys,
)
from recordforge.transforms.core.reports.summary import (
    format_records,
    format_summary,
    label_key,
    preview_record,
    summarize,
)
from recordforge.transforms.core.tfrecord.framing import TFRecordCorruption
from recordforge.transforms.storage_errors import STORAGE_ERRORS, WRITE_ERRORS

EXIT_OK, EXIT_FAILED = 0, 1
# The contact sheet shows at most this many classes (the first, by id).
MAX_SHEET_CLASSES = 100
# Without labels, the sheet is one group of this many times --per-class images.
UNLABELLED_FACTOR = 4


def add_inspect_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="OUT", help="a dataset folder (local or gs://...)")
    parser.add_argument(
        "--split", help="the split whose records are shown (default: the first split)"
    )
    parser.add_argument(
        "--records",
        type=int,
        default=5,
        metavar="N",
        help="show the first N records of the split (default: 5; 0 shows none)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the summary and the records as JSON"
    )
    html = parser.add_argument_group("--html contact sheet")
    html.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML page: the summary, a contact sheet of sample "
        "images with their labels, and the first records (local or gs://...)",
    )
    html.add_argument(
        "--per-class",
        type=int,
        default=8,
        metavar="N",
        help=f"sample images per class on the contact sheet (default: 8; {UNLABELLED_FACTOR}× "
        "as many without labels)",
    )
    html.add_argument(
        "--scan-limit",
        type=int,
        default=10_000,
        metavar="N",
        help="read at most N records of the split for the sample images and the statistics "
        "(default: 10,000)",
    )


def inspect_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    # Beam options configure the filesystems (e.g. S3 or HDFS settings); none is needed locally.
    FileSystems.set_options(beam_options(beam_args))
    _check_numbers(args)
    html_path = preflight.normalize_path(args.html) if args.html else None
    if html_path and not has_scheme(html_path) and os.path.isdir(html_path):
        raise UsageError(f"--html {args.html}: is a folder, not a file name")
    dataset = open_dataset(preflight.normalize_path(args.folder))
    manifest = dataset.manifest
    if not manifest.splits:
        raise UsageError(f"{dataset.folder} has no splits")
    split = args.split if args.split is not None else next(iter(manifest.splits))
    dataset.split(split)  # a usage error naming the splits there are, if there is no such one
    try:
        counts, source = dataset_label_counts(dataset)
        summary = summarize(manifest, counts, source, dataset.folder)
        previews = preview_records(dataset, split, args.records)
        page = None
        if html_path:
            split_counts = counts.get(split) if counts else None
            stats = SampleStats(
                {key: spec.dtype for key, spec in manifest.features.items()},
                column_keys(manifest.features, labelled=counts is not None),
            )
            sheet = collect_samples(
                dataset, split, args.per_class, args.scan_limit, split_counts, stats
            )
            if keys.IMAGE_ENCODED not in manifest.features:
                sheet = None
            errors = error_sample(dataset)
            page = render_page(
                summary, sheet, previews, split, stats=stats.to_dict(), errors=errors
            )
    except (TFRecordCorruption, *STORAGE_ERRORS) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        print(f"recordforge: failed: cannot read {dataset.folder}: {message}", file=sys.stderr)
        return EXIT_FAILED
    if page is not None:
        write_text(html_path, page)
    # Labels and file names are user data; never fail on a terminal that cannot show them.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    if args.json:
        text = json.dumps({**summary, "records": {"split": split, "items": previews}}, indent=2)
    else:
        lines = format_summary(summary)
        if args.records:
            lines += ["", *format_records(previews, split, manifest.splits[split].num_records)]
        text = "\n".join(lines)
    print(text, flush=True)
    if page is not None:
        print(f"Contact sheet: {html_path}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def _check_numbers(args: argparse.Namespace) -> None:
    if args.records < 0:
        raise UsageError(f"--records must be 0 or more, got {args.records}")
    if args.per_class < 1:
        raise UsageError(f"--per-class must be at least 1, got {args.per_class}")
    if args.scan_limit < 1:
        raise UsageError(f"--scan-limit must be at least 1, got {args.scan_limit}")


def dataset_label_counts(
    dataset: DatasetFolder,
) -> tuple[dict[str, dict[str, int]] | None, str | None]:
    """({split: {class: records}}, "manifest" | "scan"), or (None, None) without labels.

    Manifests written before recordforge counted labels have none: then the label feature of
    every record is read.
    """
    manifest = dataset.manifest
    splits = manifest.splits
    if splits and all(split.label_counts is not None for split in splits.values()):
        return {name: dict(split.label_counts) for name, split in splits.items()}, "manifest"
    key = label_key(manifest.features)
    if key is None:
        return None, None
    counts = {}
    for name in splits:
        ids: collections.Counter = collections.Counter()
        with contextlib.closing(dataset.records(name)) as records:
            for record in records:
                label = _int_feature(codec.parse(record), key)
                if label is not None:
                    ids[label] += 1
        counts[name] = named_counts(ids, manifest.labels or ())
    return counts, "scan"


def preview_records(dataset: DatasetFolder, split: str, count: int) -> list[dict[str, str]]:
    """The first `count` records of `split` in readable form (reading no further)."""
    if count <= 0:
        return []
    expected = list(dataset.manifest.features)
    with contextlib.closing(dataset.records(split)) as records:
        return [
            preview_record(codec.to_python(codec.parse(record)), expected)
            for record in islice(records, count)
        ]


def collect_samples(
    dataset: DatasetFolder,
    split: str,
    per_class: int,
    scan_limit: int,
    label_counts: Mapping[str, int] | None,
    stats: SampleStats | None = None,
) -> ContactSheet:
    """Up to `per_class` thumbnails per class, from the first records of the split; with
    `stats`, the statistics of the first `scan_limit` records too.

    Records are in hash order, so classes are mixed: without `stats`, reading stops as soon as
    every class shown has its samples (or all its records), or after `scan_limit` records.
    """
    manifest = dataset.manifest
    key = label_key(manifest.features)
    names = manifest.labels or ()
    note = ""
    if key is None:
        groups = {None: _Group(None, None, per_class * UNLABELLED_FACTOR, None)}
    else:
        classes = list((label_counts or {}).items())
        if len(classes) > MAX_SHEET_CLASSES:
            note = f"Showing the first {MAX_SHEET_CLASSES} of {len(classes):,} classes."
            classes = classes[:MAX_SHEET_CLASSES]
        groups = {}
        for label, count in classes:
            label_id = names.index(label) if label in names else int(label)
            groups[label_id] = _Group(label, label_id, min(per_class, count), count)
    has_images = keys.IMAGE_ENCODED in manifest.features
    scanned = 0
    with contextlib.closing(dataset.records(split)) as records:
        for record in records:
            sheet_done = not has_images or (groups and all(g.full for g in groups.values()))
            if scanned >= scan_limit or (sheet_done and stats is None):
                break
            scanned += 1
            example = codec.parse(record)
            if stats is not None:
                stats.add(codec.to_python(example))
            if sheet_done:
                continue
            label = _int_feature(example, key) if key else None
            group = groups.get(label)
            if group is None and label is not None and label_counts is None:
                # Classes unknown up front (not from the command): group them as they come.
                text = names[label] if 0 <= label < len(names) else str(label)
                group = groups[label] = _Group(text, label, per_class, None)
            if group is None or group.full:
                continue
            encoded = _bytes_feature(example, keys.IMAGE_ENCODED)
            if encoded is None:
                continue
            filename = _bytes_feature(example, keys.IMAGE_FILENAME)
            text = _bytes_feature(example, keys.IMAGE_LABEL_TEXT)
            caption = _text(text) if text is not None else (group.label or "")
            group.samples.append(
                Sample(
                    label=caption,
                    filename=_text(filename) if filename is not None else f"record {scanned - 1}",
                    thumbnail=make_thumbnail(encoded),
                )
            )
    if scanned >= scan_limit and not all(g.full for g in groups.values()):
        note = (note + " " if note else "") + (
            f"Stopped after {scan_limit:,} records (--scan-limit); some classes have fewer "
            "samples than asked for."
        )
    return ContactSheet(
        split=split,
        groups=tuple(
            SampleGroup(g.label, g.label_id, tuple(g.samples), g.num_records)
            for g in groups.values()
        ),
        scanned=scanned,
        note=note,
    )


class _Group:
    def __init__(self, label: str | None, label_id: int | None, wanted: int, num_records) -> None:
        self.label = label
        self.label_id = label_id
        self.wanted = wanted
        self.num_records = num_records
        self.samples: list[Sample] = []

    @property
    def full(self) -> bool:
        return len(self.samples) >= self.wanted


def error_sample(dataset: DatasetFolder, per_kind: int = ERRORS_PER_KIND) -> dict:
    """The dataset's errors by kind, the first `per_kind` of each as the errors files list them
    (read only as far as needed); counts from the manifest. {} without errors.

    An errors file that is gone or unreadable leaves its kinds without examples (verify is
    the command that reports missing files).
    """
    by_kind = dataset.manifest.errors.by_kind
    sample = ErrorSample(per_kind)
    for relative in dataset.manifest.errors.files:
        if sample.full(by_kind):
            break
        try:
            with FileSystems.open(
                dataset.path(relative), compression_type=CompressionTypes.UNCOMPRESSED
            ) as lines:
                for line in lines:
                    sample.add(_error_record(line))
                    if sample.full(by_kind):
                        break
        except (*STORAGE_ERRORS, ValueError, KeyError, TypeError):
            continue
    return sample.to_dict(counts=by_kind)


def _error_record(line: bytes) -> ErrorRecord:
    entry = json.loads(line)
    source = entry["source"]
    return ErrorRecord(
        str(source["path"]),
        source.get("row"),
        entry["stage"],
        entry["error"],
        entry["message"],
        source.get("offset"),
    )


def _int_feature(example, key: str) -> int | None:
    feature = example.features.feature
    if key not in feature or not feature[key].int64_list.value:
        return None
    return int(feature[key].int64_list.value[0])


def _bytes_feature(example, key: str) -> bytes | None:
    feature = example.features.feature
    if key not in feature or not feature[key].bytes_list.value:
        return None
    return feature[key].bytes_list.value[0]


def _text(data: bytes) -> str:
    """A stored name or class text for people: bytes that are not UTF-8 shown as `\\xf6`, as
    the messages and the errors files show them (not as U+FFFD, which hides which byte)."""
    return display(from_os(data.decode("utf-8", errors="surrogateescape")))


def write_text(path: str, text: str) -> None:
    """Write a UTF-8 text file through Beam FileSystems (local or gs://...)."""
    try:
        with FileSystems.create(
            path, mime_type="text/html", compression_type=CompressionTypes.UNCOMPRESSED
        ) as f:
            f.write(text.encode("utf-8"))
    except WRITE_ERRORS as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise UsageError(f"cannot write --html {path}: {message}") from None
