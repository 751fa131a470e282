"""A converted dataset on any Beam filesystem, read through its manifest (no TensorFlow needed)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from apache_beam.io.filesystems import FileSystems

from recordforge.pipelines.preflight import path_argument
from recordforge.schemas import codec
from recordforge.schemas.manifest import Manifest, ShardInfo, SplitInfo
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files.naming import MANIFEST_FILE, MANIFEST_FILE_BESIDE_TFDS
from recordforge.transforms.core.tfrecord.framing import read_records
from recordforge.transforms.remote_reads import open_file
from recordforge.transforms.staging import interrupted_commit
from recordforge.transforms.storage_errors import STORAGE_ERRORS


@dataclass(frozen=True)
class DatasetFolder:
    """A dataset folder and its manifest; paths are built with Beam FileSystems (gs:// works)."""

    folder: str
    manifest: Manifest
    manifest_file: str  # relative to `folder`: dataset_info.json, or recordforge.json with --tfds

    def path(self, relative: str) -> str:
        """The full path of a file named in the manifest."""
        return FileSystems.join(self.folder, relative)

    def __fspath__(self) -> str:
        # Where a path is wanted (os.fspath, open_dataset, load, tfds), the folder.
        return self.folder

    @property
    def splits(self) -> dict[str, SplitInfo]:
        """Split name → its shards and counts, in the manifest's order."""
        return dict(self.manifest.splits)

    @property
    def counts(self) -> dict[str, int]:
        """Split name → its number of records (known without reading a shard)."""
        return {name: split.num_records for name, split in self.manifest.splits.items()}

    @property
    def num_records(self) -> int:
        return sum(self.counts.values())

    def shard_paths(self, split: str) -> list[str]:
        """The full paths of a split's shards, in order."""
        return [self.path(shard.file) for shard in self.split(split).shards]

    def split(self, name: str) -> SplitInfo:
        """The split called `name`.

        Raises:
            UsageError: the dataset has no such split (the message lists the splits it has).
        """
        if name not in self.manifest.splits:
            known = ", ".join(self.manifest.splits) or "none"
            raise UsageError(f"{self.folder} has no split {name!r} (its splits: {known})")
        return self.manifest.splits[name]

    @contextlib.contextmanager
    def open_shard(self, shard: ShardInfo) -> Iterator[BinaryIO]:
        """The shard's TFRecord stream (a context manager), decompressed when gzipped.

        Gzip goes through Python's gzip module rather than Beam's reader, so a truncated stream
        or a wrong trailer CRC raises (Beam's reader ends quietly there, losing records).
        """
        path = self.path(shard.file)
        with open_file(path) as raw:
            if self.manifest.compression == "gzip":
                with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                    yield stream
            else:
                yield raw

    def records(self, split: str) -> Iterator[bytes]:
        """The serialized Examples of a split, shard by shard, with both CRCs of each checked."""
        for shard in self.split(split).shards:
            with self.open_shard(shard) as stream:
                yield from read_records(stream)

    def examples(self, split: str) -> Iterator[dict[str, list]]:
        """The records of a split as plain dicts: {feature key: list of values}."""
        for record in self.records(split):
            yield {key: values for key, (_, values) in codec.to_python(codec.parse(record)).items()}


def open_dataset(folder: str | os.PathLike | DatasetFolder) -> DatasetFolder:
    """Read the manifest of the dataset in `folder` (a DatasetFolder is returned as it is).

    Raises:
        UsageError: `folder` holds no recordforge manifest, or one that cannot be read, or a
            commit into it was interrupted (its files are then neither the old dataset nor the
            new one: docs/design.md, "Commit protocol").
    """
    if isinstance(folder, DatasetFolder):
        return folder
    folder = path_argument(folder, "a dataset")
    folder = folder.rstrip("/") if len(folder) > 1 else folder
    try:
        journal = interrupted_commit(folder)
    except (*STORAGE_ERRORS, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(
            f"cannot read the commit journal in {folder}: {_first_line(error)}"
        ) from None
    if journal is not None:
        raise UsageError(
            f"{folder} is being replaced: the commit of run {journal.get('run_id')} into it was "
            "interrupted, so it holds neither dataset whole; run the conversion again (with "
            "--resume to keep its work) to finish it"
        )
    for name in (MANIFEST_FILE_BESIDE_TFDS, MANIFEST_FILE):
        path = FileSystems.join(folder, name)
        try:
            if not FileSystems.exists(path):
                continue
            with open_file(path) as f:
                data = json.loads(f.read().decode("utf-8"))
        except (*STORAGE_ERRORS, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UsageError(f"cannot read {path}: {_first_line(error)}") from None
        if not _is_recordforge_manifest(data):
            continue  # TensorFlow Datasets' dataset_info.json, or a stranger's
        try:
            return DatasetFolder(folder, Manifest.from_dict(data), name)
        except (KeyError, TypeError, ValueError) as error:
            raise UsageError(f"{path} is not a valid recordforge manifest: {error!r}") from None
    raise UsageError(
        f"{folder} is not a recordforge dataset: it has no {MANIFEST_FILE} written by recordforge "
        "(a conversion writes it last, so an interrupted one leaves none)"
    )


def iterate(
    folder: str | os.PathLike | DatasetFolder, split: str = "train"
) -> Iterator[dict[str, list]]:
    """The records of one split as plain dicts of value lists, for frameworks other than TF.

    Bytes features are `bytes`, int64 features `int`, float features `float`; every value is a
    list, as in the Example (a scalar feature is a one-element list).
    """
    return open_dataset(folder).examples(split)


def _is_recordforge_manifest(data) -> bool:
    return isinstance(data, dict) and (data.get("tool") or {}).get("name") == "recordforge"


def _first_line(error: BaseException) -> str:
    return (str(error).strip() or type(error).__name__).splitlines()[0][:300]
