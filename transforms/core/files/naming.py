"""Names of the files a dataset consists of (TensorFlow Datasets' shard naming)."""

from __future__ import annotations

import re

from recordforge.schemas import tfds_metadata

MANIFEST_FILE = "dataset_info.json"
# With --tfds, `dataset_info.json` and `features.json` hold TensorFlow Datasets' metadata (its
# DatasetInfo proto as JSON, which TFDS parses strictly), so recordforge's manifest moves here.
MANIFEST_FILE_BESIDE_TFDS = "recordforge.json"
TFDS_FEATURES_FILE = tfds_metadata.FEATURES_FILE
# With --tfds and labels, TFDS's ClassLabel keeps the class names in `{label key}.labels.txt`.
TFDS_LABEL_FILES = tuple(tfds_metadata.label_names_file(key) for key, _ in tfds_metadata.LABEL_KEYS)
# The record index of a shard (DALI's and the `tfrecord` package's format) is
# `index/{shard}.idx`. In a folder of their own, no glob of the dataset folder matches them (the
# natural `OUT/name-train.tfrecord-*-of-*` matched `{shard}.idx` beside the shard, and tf.data
# then read an index as records): `*` never matches `/` in any filesystem's glob. The name stays
# `{shard}.idx`, the name DALI's and the `tfrecord` package's own indexers use in their examples.
INDEX_DIR = "index"
INDEX_SUFFIX = ".idx"
ERRORS_DIR = "errors"
# The temporary folder of runs before the staged commit (docs/design.md, "Commit protocol"):
# still recognised as recordforge's, so a dataset that has one can be replaced and verified.
TEMP_DIR_PREFIX = ".recordforge-tmp-"
# What a run keeps inside the output folder while it works, when it stages there (object
# stores, and local folders the directory swap cannot serve): its working folder, its lock and
# its commit journal. With the swap, the working folder and the lock sit beside the output
# folder instead: `.{folder name}{SIBLING_WORK_SUFFIX}` and `.{folder name}{SIBLING_LOCK_SUFFIX}`.
STAGING_DIR = ".recordforge-staging"
LOCK_FILE = ".recordforge-lock"
JOURNAL_FILE = ".recordforge-commit.json"
SIBLING_WORK_SUFFIX = ".recordforge"
SIBLING_LOCK_SUFFIX = ".recordforge-lock"
# The empty file a run creates and deletes to prove its working folder is writable.
WRITE_TEST_PREFIX = ".recordforge-write-test-"

COMPRESSIONS = ("none", "gzip")

# Names end up in file names on every filesystem: letters, digits, '_', '-', '.' only.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SPLIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# The rule of _SPLIT, in words, for the messages that refuse a name.
SPLIT_NAME_RULE = "ASCII letters, digits, '_' and '-', starting with a letter or digit"


def is_valid_dataset_name(name: str) -> bool:
    """Whether `name` can prefix shard file names."""
    return bool(_NAME.match(name))


def is_valid_split_name(split: str) -> bool:
    """Whether `split` can appear in shard file names (no dots, so names parse unambiguously)."""
    return bool(_SPLIT.match(split))


def shard_file_name(name: str, split: str, index: int, num_shards: int, compression: str) -> str:
    """`{name}-{split}.tfrecord-{index:05d}-of-{num_shards:05d}`, plus `.gz` for gzip."""
    if not 0 <= index < num_shards:
        raise ValueError(f"shard index {index} outside 0..{num_shards - 1}")
    suffix = ".gz" if compression == "gzip" else ""
    return f"{name}-{split}.tfrecord-{index:05d}-of-{num_shards:05d}{suffix}"


# The longest file name local file systems take (NAME_MAX of ext4, XFS, APFS, NTFS), in bytes.
MAX_FILE_NAME_BYTES = 255
# While a run works, a shard (and its index) has its final name plus `.{32 hex digits}`, the
# write attempt's, and its part record that name plus `.part.json` (transforms/write.py,
# core/files/parts.PART_RECORD_SUFFIX), until the commit renames them.
_ATTEMPT_SUFFIX_BYTES = 1 + 32
_PART_RECORD_SUFFIX_BYTES = len(".part.json")


def longest_shard_file_name(name: str, split: str, compression: str, write_index: bool) -> int:
    """Bytes of the longest file name a run writes for the shards of `split` (up to 99,999
    shards): a staged shard's part record, `{shard}.{attempt}.part.json`, or with
    `write_index` its staged index, `{shard}.idx.{attempt}`, whichever is longer."""
    shard = len(shard_file_name(name, split, 0, 1, compression).encode("utf-8"))
    index = shard + len(INDEX_SUFFIX) + _ATTEMPT_SUFFIX_BYTES if write_index else 0
    return max(shard + _ATTEMPT_SUFFIX_BYTES + _PART_RECORD_SUFFIX_BYTES, index)


def shard_file_pattern(name: str | None = None) -> re.Pattern[str]:
    """A regex matching the shard file names of dataset `name`, or of any dataset when None."""
    prefix = re.escape(name) if name is not None else r"(?P<name>.+)"
    return re.compile(
        rf"^{prefix}-(?P<split>[A-Za-z0-9][A-Za-z0-9_-]*)\.tfrecord-"
        r"(?P<index>\d{5,})-of-(?P<count>\d{5,})(?P<gz>\.gz)?$"
    )


def index_file_name(shard_file: str) -> str:
    """The index file of an (uncompressed) shard with --write-index, relative to the folder."""
    return f"{INDEX_DIR}/{shard_file}{INDEX_SUFFIX}"


def indexed_shard(relative: str) -> str | None:
    """The shard whose index file `relative` is named like, or None.

    Recognizes `index/{shard}.idx` and also `{shard}.idx` at the top of the folder, where
    recordforge wrote indexes before they had a folder (so --overwrite and verify know them).
    """
    folder, _, name = relative.rpartition("/")
    if folder not in ("", INDEX_DIR) or not name.endswith(INDEX_SUFFIX):
        return None
    shard = name.removesuffix(INDEX_SUFFIX)
    return shard if shard_file_pattern().match(shard) else None


def errors_file_name(stage: str) -> str:
    """The quarantine file of one pipeline stage, relative to the output folder."""
    return f"{ERRORS_DIR}/{stage}.jsonl"


def is_control_file(relative: str) -> bool:
    """Whether a path (relative to an output folder) is one a run keeps while it works, not a
    file of the dataset: the staging folder, the lock, the commit journal, the write test, and
    the temporary folders of earlier versions."""
    top = relative.split("/", 1)[0]
    return (
        top in (STAGING_DIR, LOCK_FILE, JOURNAL_FILE)
        or top.startswith(TEMP_DIR_PREFIX)
        or top.startswith(WRITE_TEST_PREFIX)
    )


def manifest_names(relative_files) -> list[str]:
    """The metadata files among a dataset's files (its manifest, TFDS's two files), in the
    order a commit deletes them: the ones readers look for first go first."""
    order = (MANIFEST_FILE_BESIDE_TFDS, MANIFEST_FILE, TFDS_FEATURES_FILE)
    present = set(relative_files)
    return [name for name in order if name in present]


def is_dataset_file(relative: str) -> bool:
    """Whether a file (path relative to an output folder) is one a conversion writes.

    Covers every dataset name (a rerun may change --name): shards, their index files, both
    manifest names, TFDS's features.json and class names, the errors folder and temporary
    folders.
    """
    top = relative.split("/", 1)[0]
    if top == ERRORS_DIR or top.startswith(TEMP_DIR_PREFIX):
        return True
    if indexed_shard(relative) is not None:
        return True
    if "/" in relative:
        return False
    if relative in (
        MANIFEST_FILE,
        MANIFEST_FILE_BESIDE_TFDS,
        TFDS_FEATURES_FILE,
        *TFDS_LABEL_FILES,
    ):
        return True
    return bool(shard_file_pattern().match(relative))
