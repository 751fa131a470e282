"""TFRecord files to reshard: which split each one's place in its folder names."""

from __future__ import annotations

import re
from typing import NamedTuple

from recordforge.transforms.core.files.naming import ERRORS_DIR, is_dataset_file, shard_file_pattern

# TFDS writes the class names of every ClassLabel feature as `{key, '/' as '.'}.labels.txt`.
_TFDS_CLASS_NAMES_SUFFIX = ".labels.txt"

# TFX's ExampleGen writes each split of its output artifact to a folder of its own:
# `{artifact}/Split-{split}/data_tfrecord-{i:05d}-of-{n:05d}.gz`.
_EXAMPLEGEN_FOLDER = re.compile(r"^Split-(?P<split>.+)$")


class TFRecordInput(NamedTuple):
    """One TFRecord file to read.

    Attributes:
        path: the file (local or any Beam filesystem).
        split: the split its place names (an ExampleGen `Split-*` folder, a shard's name), or
            None when the records get splits by hash.
        source: the index of the input (as given on the command line) it was found under.
        problem: (kind, message) when the path cannot be read as a file at all (a FIFO, a
            folder that cannot be read), found by the listing: it is quarantined unopened.
    """

    path: str
    split: str | None
    source: int
    problem: tuple[str, str] | None = None


def split_of(relative: str) -> str | None:
    """The split a file's path names, relative to the folder above the input it was found
    under (the input's own folder name counts, the folders above it do not): the nearest
    `Split-{split}` folder (TFX ExampleGen), else a shard name `{name}-{split}.tfrecord-…`
    (recordforge, TensorFlow Datasets); None when it names none."""
    folders, _, name = relative.rpartition("/")
    for folder in reversed(folders.split("/") if folders else []):
        found = _EXAMPLEGEN_FOLDER.match(folder)
        if found:
            return found["split"]
    shard = shard_file_pattern().match(name)
    return shard["split"] if shard else None


def is_metadata(relative: str) -> bool:
    """Whether a file is the metadata of a dataset (recordforge's, TensorFlow Datasets'), not
    records: a manifest, TFDS's features and class names, an index or errors file. Judged by
    its name and its folder's, so the files of datasets in subfolders are known too."""
    parts = relative.split("/")
    name = parts[-1]
    if shard_file_pattern().match(name):
        return False
    if len(parts) > 1 and parts[-2] == ERRORS_DIR:
        # A dataset's quarantine is `errors/{stage}.jsonl`; other files in a folder of that
        # name are the user's (TFRecord files in `errors/` were skipped, their records lost).
        return name.endswith(".jsonl")
    if name.endswith(_TFDS_CLASS_NAMES_SUFFIX):
        return True
    return is_dataset_file(name) or (len(parts) > 1 and is_dataset_file("/".join(parts[-2:])))
