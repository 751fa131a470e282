"""`recordforge verify`: re-read a dataset through Beam FileSystems, check it against its manifest.

The checks are in pipelines/inspection/checks.py; here the folder is listed, the files are opened
(local paths and gs:// alike) and the findings are gathered into a report. No TensorFlow needed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from recordforge.pipelines.dataset import DatasetFolder, open_dataset
from recordforge.pipelines.inspection.checks import (
    ExampleChecker,
    Finding,
    Findings,
    ShardVerifier,
    check_error_lines,
    check_file,
    check_gzip_header,
    check_label_counts,
    check_totals,
    check_unlisted,
)
from recordforge.schemas.features import DTYPES, IMAGE_ENCODED
from recordforge.schemas.manifest import ShardInfo
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.core.images.probe import DEFAULT_MAX_PIXELS
from recordforge.transforms.core.planning.labels import named_counts
from recordforge.transforms.core.planning.sharding import human_size
from recordforge.transforms.core.reports.summary import label_key
from recordforge.transforms.remote_reads import open_file
from recordforge.transforms.storage_errors import STORAGE_ERRORS

LOGGER = logging.getLogger("recordforge")

# The version of the --json structure; raised when a field changes meaning or disappears.
REPORT_FORMAT_VERSION = 1
_CHUNK = 1 << 20


@dataclass
class VerifyReport:
    """What `verify` checked and found.

    Attributes:
        folder: the dataset folder.
        manifest_file: the manifest's name in it (dataset_info.json, or recordforge.json).
        compression: "none" or "gzip" (then record offsets are in the uncompressed stream).
        deep: whether images were decoded (--deep).
        images: whether the dataset has images (an `image/encoded` feature) to decode.
        findings: every finding counted; at most max_per_file per file listed.
        shards: shards opened and read.
        records: records framed in them (sound or not).
        bytes: the shard files' sizes, summed over the shards read.
        files: other files checked (index and errors files).
        seconds: how long it took.
    """

    folder: str
    manifest_file: str
    compression: str
    deep: bool
    findings: Findings
    shards: int = 0
    records: int = 0
    bytes: int = 0
    files: int = 0
    seconds: float = 0.0
    images: bool = True

    @property
    def ok(self) -> bool:
        return self.findings.ok

    def to_dict(self) -> dict:
        """The --json report (documented in README.md, "Verifying a dataset")."""
        return {
            "format_version": REPORT_FORMAT_VERSION,
            "ok": self.ok,
            "folder": self.folder,
            "manifest": self.manifest_file,
            "compression": self.compression,
            "offsets": "uncompressed" if self.compression == "gzip" else "file",
            "deep": self.deep,
            "checked": {
                "shards": self.shards,
                "records": self.records,
                "bytes": self.bytes,
                "other_files": self.files,
            },
            "counts": {
                "errors": self.findings.errors,
                "warnings": self.findings.warnings,
                "by_check": dict(sorted(self.findings.by_check.items())),
            },
            "findings": [finding.to_dict() for finding in self.findings.listed],
            "omitted": dict(sorted(self.findings.omitted.items())),
            "seconds": round(self.seconds, 3),
        }


def verify_dataset(
    folder: str, *, deep: bool = False, max_per_file: int | None = 20
) -> VerifyReport:
    """Check the dataset in `folder` against its manifest.

    Args:
        folder: a local folder or a URL Beam FileSystems can read (gs://...).
        deep: also decode every image/encoded fully.
        max_per_file: findings listed in detail per file (None: all); every finding is counted.

    Raises:
        UsageError: `folder` holds no recordforge manifest, or one naming an unknown dtype.
    """
    started = time.monotonic()
    dataset = open_dataset(folder)
    manifest = dataset.manifest
    report = VerifyReport(
        dataset.folder,
        dataset.manifest_file,
        manifest.compression,
        deep,
        Findings(max_per_file),
        images=IMAGE_ENCODED in manifest.features,
    )
    for key, spec in manifest.features.items():
        if spec.dtype not in DTYPES:
            raise UsageError(
                f"{dataset.path(dataset.manifest_file)}: feature {key!r} has dtype "
                f"{spec.dtype!r}, not one of {', '.join(DTYPES)}"
            )
    raw = _read_json(dataset.path(dataset.manifest_file))
    files = _list_folder(dataset.folder)
    checker = ExampleChecker(manifest.features)
    max_pixels = int(manifest.options.get("max_image_pixels") or DEFAULT_MAX_PIXELS)
    key = label_key(manifest.features)
    for name, split in manifest.splits.items():
        counting = key if split.label_counts is not None else None
        before = report.findings.errors
        verifiers = [
            _verify_shard(dataset, shard, files, checker, report, deep, max_pixels, counting)
            for shard in split.shards
        ]
        # Compared only when the split's shards are otherwise sound: a record that could not
        # be read or parsed is reported already, and would only make the counts differ too.
        sound = report.findings.errors == before
        if counting is not None and sound and all(v is not None and v.complete for v in verifiers):
            ids: collections.Counter[int] = collections.Counter()
            for verifier in verifiers:
                ids.update(verifier.label_ids)
            held = named_counts(ids, manifest.labels or ())
            report.findings.extend(
                check_label_counts(name, split.label_counts, held, dataset.manifest_file)
            )

    error_lines, all_there = 0, True
    for relative in manifest.errors.files:
        missing = check_file(relative, None, files.get(relative))
        report.findings.extend(missing)
        if missing:
            all_there = False
            continue
        report.files += 1
        try:
            error_lines += _count_lines(dataset.path(relative))
        except STORAGE_ERRORS as error:
            all_there = False
            report.findings.add(_read_error(relative, error))
    if all_there:
        report.findings.extend(check_error_lines(manifest, dataset.manifest_file, error_lines))
    report.findings.extend(check_totals(raw, manifest, dataset.manifest_file))
    report.findings.extend(check_unlisted(files, manifest))
    report.seconds = time.monotonic() - started
    return report


def _verify_shard(
    dataset: DatasetFolder,
    shard: ShardInfo,
    files: dict[str, int],
    checker: ExampleChecker,
    report: VerifyReport,
    deep: bool,
    max_pixels: int,
    label_key: str | None = None,
) -> ShardVerifier | None:
    """Check one shard (and its index); returns its verifier, None when the file is missing."""
    findings = report.findings
    before = findings.errors + findings.warnings
    size = files.get(shard.file)
    findings.extend(check_file(shard.file, shard.num_bytes, size))
    if size is None:
        return None
    started = time.monotonic()
    verifier = ShardVerifier(
        shard,
        checker,
        compressed=dataset.manifest.compression == "gzip",
        deep=deep,
        max_pixels=max_pixels,
        label_key=label_key,
    )
    try:
        with contextlib.ExitStack() as stack:
            index_lines = None
            if shard.index is not None:
                missing = check_file(shard.index, None, files.get(shard.index))
                findings.extend(missing)
                if not missing:
                    report.files += 1
                    index_lines = stack.enter_context(open_file(dataset.path(shard.index)))
            if dataset.manifest.compression == "gzip":
                with open_file(dataset.path(shard.file)) as raw:
                    findings.extend(check_gzip_header(shard.file, raw.read(4)))
            stream = stack.enter_context(dataset.open_shard(shard))
            findings.extend(verifier.findings(stream, index_lines, shard.index))
    except STORAGE_ERRORS as error:
        findings.add(_read_error(shard.file, error))
    report.shards += 1
    report.records += verifier.records
    report.bytes += size
    problems = findings.errors + findings.warnings - before
    LOGGER.debug(
        "checked %s: %s records, %s in %.1f s%s",
        shard.file,
        f"{verifier.records:,}",
        human_size(size),
        time.monotonic() - started,
        f", {problems:,} problem{'s' if problems != 1 else ''}" if problems else "",
    )
    return verifier


def _read_json(path: str) -> dict:
    with open_file(path) as f:
        return json.loads(f.read().decode("utf-8"))


def _list_folder(folder: str) -> dict[str, int]:
    """Every file under `folder` (subfolders included): path relative to it -> size."""
    try:
        (result,) = FileSystems.match([FileSystems.join(folder, "**")])
    except BeamIOError:
        return {}
    files = {}
    for metadata in result.metadata_list:
        if metadata.path.endswith("/"):
            continue  # an object store's zero-byte "folder/" placeholder
        files[_relative(metadata.path, folder)] = metadata.size_in_bytes
    return files


def _relative(path: str, folder: str) -> str:
    if has_scheme(folder):
        return path[len(folder.rstrip("/")) + 1 :]
    return os.path.relpath(path, folder).replace(os.sep, "/")


def _count_lines(path: str) -> int:
    lines, last = 0, b"\n"
    with open_file(path) as f:
        while chunk := f.read(_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def _read_error(relative: str, error: BaseException) -> Finding:
    detail = (str(error).strip() or type(error).__name__).splitlines()[0][:300]
    return Finding("read_error", relative, None, None, f"cannot read the file: {detail}")


def format_report(report: VerifyReport) -> list[str]:
    """The human report: one line per finding listed, then one verdict line."""
    where_word = "uncompressed byte" if report.compression == "gzip" else "byte"
    lines = []
    for finding in report.findings.listed:
        prefix = "warning: " if finding.severity != "error" else ""
        where = ""
        if finding.record is not None:
            where = f" record {finding.record}"
            if finding.offset is not None:
                where += f" at {where_word} {finding.offset}"
            where += ":"
        lines.append(f"{prefix}{finding.file}:{where} {finding.check}: {finding.message}")
    for file, count in sorted(report.findings.omitted.items()):
        lines.append(
            f"{file}: {count:,} more finding{'s' if count != 1 else ''} not listed "
            "(--max-findings 0 lists all)"
        )
    findings = report.findings
    checked = (
        f"checked {report.shards:,} shard{'s' if report.shards != 1 else ''}, "
        f"{report.records:,} record{'s' if report.records != 1 else ''}, "
        f"{human_size(report.bytes)}"
        + (" with images decoded" if report.deep and report.images else "")
        + (" (--deep: no images to decode)" if report.deep and not report.images else "")
        + f" in {report.seconds:.1f} s"
    )
    warnings = (
        f"; {findings.warnings:,} warning{'s' if findings.warnings != 1 else ''}"
        if findings.warnings
        else ""
    )
    if findings.ok:
        lines.append(f"OK: {checked}; no problems{warnings}")
    else:
        by_check = ", ".join(
            f"{check} {count:,}" for check, count in sorted(findings.failing_checks.items())
        )
        lines.append(
            f"FAILED: {findings.errors:,} problem{'s' if findings.errors != 1 else ''} "
            f"({by_check}){warnings}; {checked}"
        )
    return lines
