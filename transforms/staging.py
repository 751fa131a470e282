"""Staging and the commit: a run makes its dataset complete out of sight, then puts it in place.

The output folder holds the previous dataset or the new one, never a mix (docs/design.md,
"Commit protocol"). Two protocols:

SWAP, local folders: the run stages the whole new dataset in `dataset/` of a working folder
beside the output folder (`.{name}.recordforge/`, same filesystem), writes a journal there
(`commit.json`: the new manifest's digest, the old dataset's files), then exchanges the two
folders in one renameat2(RENAME_EXCHANGE) (a plain rename when there is no output folder yet)
and deletes the old copy. Which folder holds the staged manifest says whether the exchange
happened, so an interrupted commit is finished either way.

JOURNAL, object stores (where a rename is a copy) and local folders the swap cannot serve (a
mount point, a parent folder that is not writable, a filesystem without the exchange): the run
stages in `OUT/.recordforge-staging/`; the commit writes `OUT/.recordforge-commit.json`, listing
every copy and deletion, before any final name is touched; then deletes the old metadata files,
copies the shards and errors files, deletes the old dataset's other files, copies TFDS's files
and the manifest last. The manifest is the commit point: while the journal is there and the
manifest is not the one it names, readers refuse the folder, and the next run rolls the commit
forward from the journal.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import google_crc32c
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.transforms.core.errors import OutputTaken
from recordforge.transforms.core.files.naming import (
    JOURNAL_FILE,
    LOCK_FILE,
    MANIFEST_FILE,
    MANIFEST_FILE_BESIDE_TFDS,
    SIBLING_LOCK_SUFFIX,
    SIBLING_WORK_SUFFIX,
    STAGING_DIR,
    TFDS_FEATURES_FILE,
    TFDS_LABEL_FILES,
    is_control_file,
    manifest_names,
)
from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.remote_reads import open_file
from recordforge.transforms.write import publish, remove_tree, write_atomically

LOGGER = logging.getLogger("recordforge")

SWAP = "swap"
JOURNAL = "journal"
JOURNAL_FORMAT = 1


class CommitError(Exception):
    """A commit (or an interrupted one) that cannot go on; the message says what to do."""


@dataclass(frozen=True)
class Staging:
    """Where a run works and how it commits.

    Attributes:
        output: the dataset folder as the user named it (local paths absolute).
        mode: SWAP or JOURNAL.
        target: the folder that the new dataset becomes: `output` with symbolic links resolved
            (SWAP replaces the directory itself, never a link to it); `output` for JOURNAL.
        work: the run's working folder: staged dataset, shard parts, spill files, run record.
        lock: the lock file of the output folder.
        reason: why a local folder is committed by JOURNAL (None otherwise), for the summary.
    """

    output: str
    mode: str
    target: str
    work: str
    lock: str
    reason: str | None = None

    @property
    def dataset(self) -> str:
        """Where the new dataset's files take their final names before the commit."""
        return FileSystems.join(self.work, "dataset")

    @property
    def parts(self) -> str:
        """Shard files as written (one per attempt), each with a record of what it holds."""
        return FileSystems.join(self.work, "parts")

    @property
    def spill(self) -> str:
        """A CSV table's encoded rows, parked until their shards are written."""
        return FileSystems.join(self.work, "spill")

    @property
    def errors(self) -> str:
        """Where a failed run leaves its errors files (the previous dataset stays as it was)."""
        return FileSystems.join(self.work, "errors")

    @property
    def run_record(self) -> str:
        """What the run was started with (`--resume` compares it)."""
        return FileSystems.join(self.work, "run.json")

    @property
    def journal(self) -> str:
        if self.mode == SWAP:
            return os.path.join(self.work, "commit.json")
        return FileSystems.join(self.output, JOURNAL_FILE)


def swap_staging(output: str) -> Staging:
    """SWAP staging of a local folder: working folder and lock beside it."""
    target = os.path.realpath(output)
    parent, base = os.path.split(target)
    return Staging(
        output=output,
        mode=SWAP,
        target=target,
        work=os.path.join(parent, f".{base}{SIBLING_WORK_SUFFIX}"),
        lock=os.path.join(parent, f".{base}{SIBLING_LOCK_SUFFIX}"),
    )


def journal_staging(output: str, reason: str | None = None) -> Staging:
    """JOURNAL staging: working folder and lock inside the output folder."""
    return Staging(
        output=output,
        mode=JOURNAL,
        target=output,
        work=FileSystems.join(output, STAGING_DIR),
        lock=FileSystems.join(output, LOCK_FILE),
        reason=reason,
    )


def default_staging(output: str) -> Staging:
    """The staging a pipeline built without the CLI gets: JOURNAL, which works anywhere."""
    return journal_staging(output)


# --- small file helpers ---------------------------------------------------------------------


def read_json(path: str) -> dict | None:
    """A JSON document, or None when the file does not exist."""
    if not FileSystems.exists(path):
        return None
    with open_file(path) as f:
        return json.loads(f.read().decode("utf-8"))


def write_json(path: str, document: dict, temp_dir: str) -> None:
    """Write a JSON document under a temporary name in `temp_dir`, then rename it to `path`."""
    data = (json.dumps(document, indent=1) + "\n").encode("utf-8")
    write_atomically(path, temp_dir, lambda f: f.write(data))


def folder_exists(folder: str) -> bool:
    """Whether a folder exists: locally a directory, on an object store any object under it
    (object stores have no folders of their own)."""
    if not has_scheme(folder):
        return os.path.isdir(folder)
    from recordforge.transforms.listing import list_files

    return bool(list_files(folder.rstrip("/") + "/**", limit=1))


def digest(data: bytes) -> dict:
    """What identifies a manifest: its size and CRC32C."""
    return {"bytes": len(data), "crc32c": google_crc32c.value(data)}


def file_digest(path: str) -> dict | None:
    """The digest of a file's bytes, or None when there is no such file."""
    if not FileSystems.exists(path):
        return None
    with open_file(path) as f:
        return digest(f.read())


def committed_files(folder: str) -> tuple[str | None, list[str]]:
    """The recordforge manifest of the dataset in `folder` and every file it lists.

    Returns (manifest name, files relative to the folder: shards, index and errors files, the
    manifest and, beside it, TFDS's files), or (None, []) when the folder holds no
    recordforge manifest.
    """
    for name in (MANIFEST_FILE_BESIDE_TFDS, MANIFEST_FILE):
        data = read_json(FileSystems.join(folder, name))
        if not isinstance(data, dict) or (data.get("tool") or {}).get("name") != "recordforge":
            continue
        files = {name, *data["errors"]["files"]}
        for split in data["splits"].values():
            for shard in split["shards"]:
                files.add(shard["file"])
                if shard.get("index"):
                    files.add(shard["index"])
        if name == MANIFEST_FILE_BESIDE_TFDS:
            files |= {MANIFEST_FILE, TFDS_FEATURES_FILE, *TFDS_LABEL_FILES}
        return name, sorted(files)
    return None, []


# --- the commit -----------------------------------------------------------------------------


def commit(
    staging: Staging,
    *,
    run_id: str,
    run_key: str,
    files: Sequence[tuple[str, str]],
    documents: Sequence[tuple[str, bytes]],
    replace: bool = False,
) -> None:
    """Make the staged dataset the output folder's.

    Args:
        staging: where the run staged.
        run_id, run_key: the run's id and options digest, recorded in the journal.
        files: (staged path, final name relative to the output folder) of the shards, index
            files and errors files.
        documents: (final name, bytes) of the metadata files, the manifest last.
        replace: a dataset in the output folder may be replaced (--overwrite).

    Raises:
        OutputTaken: without `replace`, the output folder holds a dataset: one written there
            after the run checked the folder (WriteDataset checks when the pipeline is built).
    """
    if not replace:
        taken, _ = committed_files(staging.output)
        if taken is not None:
            raise OutputTaken(
                f"the output folder {staging.output} received a dataset ({taken}) after this "
                "run checked it, and the run may not overwrite one: that dataset is left as "
                "it is; rerun with --overwrite (overwrite=True) to replace it"
            )
    run = {"run_id": run_id, "run_key": run_key}
    if staging.mode == SWAP:
        _commit_by_swap(staging, run, files, documents)
    else:
        _commit_by_journal(staging, run, files, documents)


def _journal(staging: Staging, run: dict, documents, old_files) -> dict:
    manifest_name, manifest_data = documents[-1]
    return {
        "format_version": JOURNAL_FORMAT,
        **run,
        "mode": staging.mode,
        "manifest": manifest_name,
        "digest": digest(manifest_data),
        "old_files": old_files,
    }


def _commit_by_swap(staging: Staging, run: dict, files, documents) -> None:
    dataset = staging.dataset
    os.makedirs(dataset, exist_ok=True)
    for source, relative in files:
        _move_into(source, os.path.join(dataset, relative))
    for relative, data in documents:
        _write_local(os.path.join(dataset, relative), data)
    _, old_files = committed_files(staging.target) if os.path.isdir(staging.target) else (None, [])
    journal = _journal(staging, run, documents, old_files)
    journal["target"] = staging.target
    _write_local(staging.journal, (json.dumps(journal, indent=1) + "\n").encode("utf-8"))
    finish_swap(staging, journal)


def finish_swap(staging: Staging, journal: dict) -> None:
    """Exchange the staged dataset with the output folder unless that happened already, then
    delete the old copy and the working folder. Safe to repeat."""
    target, dataset, manifest = staging.target, staging.dataset, journal["manifest"]
    if _local_digest(os.path.join(target, manifest)) != journal["digest"]:
        if _local_digest(os.path.join(dataset, manifest)) != journal["digest"]:
            raise CommitError(
                f"the interrupted commit of run {journal['run_id']} cannot be finished: neither "
                f"{target} nor {dataset} holds its manifest; look at both, keep what you need "
                f"and delete {staging.work}"
            )
        _swap_in(dataset, target)
    _clear_old_copy(dataset, target, set(journal["old_files"]))
    _remove_work(staging)


def _swap_in(dataset: str, target: str) -> None:
    from recordforge.transforms.core.files.swap import exchange

    if os.path.lexists(target):
        # The folder is replaced, not refilled: it keeps its permissions, not its owner.
        os.chmod(dataset, stat.S_IMODE(os.stat(target).st_mode))
        exchange(dataset, target)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(dataset, target)


def _clear_old_copy(old: str, target: str, old_files: set[str]) -> None:
    """Delete the previous dataset's files (and leftovers of runs) from its swapped-out copy.

    Anything else was not recordforge's: it appeared in the output folder during the run (the
    run refuses to start when there is such a file), so it goes back there.
    """
    if not os.path.isdir(old):
        return
    for folder, _, names in os.walk(old, topdown=False):
        for name in names:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, old).replace(os.sep, "/")
            if relative in old_files or is_control_file(relative):
                os.remove(path)
                continue
            home = os.path.join(target, relative)
            if os.path.lexists(home):
                LOGGER.warning("left %s: not recordforge's, and %s exists", path, home)
                continue
            os.makedirs(os.path.dirname(home), exist_ok=True)
            os.rename(path, home)
            LOGGER.warning("moved %s back into %s: it appeared during the run", relative, target)


def _move_into(source: str, final: str) -> None:
    """Rename a staged file to its final name; done already when the source is gone and the
    final name exists (a commit that is repeated)."""
    os.makedirs(os.path.dirname(final), exist_ok=True)
    try:
        os.replace(source, final)
    except FileNotFoundError:
        if not os.path.exists(final):
            raise


def _write_local(path: str, data: bytes) -> None:
    temp = f"{path}.partial"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(temp, "wb") as f:
        f.write(data)
    os.replace(temp, path)


def _local_digest(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            return digest(f.read())
    except (FileNotFoundError, NotADirectoryError):
        return None


def _commit_by_journal(staging: Staging, run: dict, files, documents) -> None:
    staged_documents = []
    for relative, data in documents:
        path = FileSystems.join(staging.dataset, relative)
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(data)
        staged_documents.append([path, relative])
    _, old_files = committed_files(staging.output)
    journal = _journal(staging, run, documents, old_files)
    journal["files"] = [list(pair) for pair in files]
    journal["documents"] = staged_documents
    # Written before any final name is touched: from here on the commit can be rolled forward.
    write_json(staging.journal, journal, staging.work)
    roll_forward(staging, journal)


def roll_forward(staging: Staging, journal: dict) -> None:
    """Carry out (or finish) a JOURNAL commit: safe to repeat from any point."""
    out = staging.output
    if file_digest(FileSystems.join(out, journal["manifest"])) != journal["digest"]:
        new_documents = {relative: source for source, relative in journal["documents"]}
        # Readers look for the metadata first: it goes before any shard changes. A name the
        # new dataset also has is skipped once its new copy is in (its staged source is gone).
        for name in manifest_names(journal["old_files"]):
            source = new_documents.get(name)
            if source is None or FileSystems.exists(source):
                _delete_if_there([FileSystems.join(out, name)])
        publish((source, FileSystems.join(out, relative)) for source, relative in journal["files"])
        new = {relative for _, relative in journal["files"]} | set(new_documents)
        _delete_if_there(
            FileSystems.join(out, relative)
            for relative in journal["old_files"]
            if relative not in new
        )
        for source, relative in journal["documents"]:  # one at a time: the manifest last
            publish([(source, FileSystems.join(out, relative))])
    _delete_if_there([staging.journal])
    _remove_work(staging)


def _remove_work(staging: Staging) -> None:
    """Delete the working folder after a commit; one that stays (an rmdir refused) is said."""
    remove_tree(staging.work)
    if not has_scheme(staging.work) and os.path.lexists(staging.work):
        LOGGER.warning(
            "the working folder %s could not be removed; the next run into %s removes it",
            staging.work,
            staging.output,
        )


def _delete_if_there(paths: Iterable[str]) -> None:
    paths = list(paths)
    if not paths:
        return
    try:
        FileSystems.delete(paths)
    except BeamIOError as error:
        failed = error.exception_details or {}
        if any(FileSystems.exists(path) for path in failed):
            raise


# --- what readers and the next run see --------------------------------------------------------


def interrupted_commit(folder: str) -> dict | None:
    """The journal of a JOURNAL commit in `folder` that has not reached its manifest yet, or
    None (no journal, or one whose manifest is in place: only its cleanup was cut short)."""
    journal = read_json(FileSystems.join(folder, JOURNAL_FILE))
    if journal is None:
        return None
    if file_digest(FileSystems.join(folder, journal["manifest"])) == journal["digest"]:
        return None
    return journal


def commit_in_place(staging: Staging) -> dict | None:
    """The journal of this staging's commit when its manifest is in the output folder already
    and only its cleanup is left (a failure or a stop after the commit point), else None."""
    try:
        journal = read_json(staging.journal)
        if journal is None:
            return None
        in_place = file_digest(FileSystems.join(staging.target, journal["manifest"]))
    except (OSError, BeamIOError, ValueError, KeyError, TypeError):  # unreadable: not known
        return None
    return journal if in_place == journal["digest"] else None


def recover(staging: Staging) -> dict | None:
    """Finish a commit that was interrupted (by a kill, a crash, a full disk); returns its
    journal, or None when there was nothing to finish."""
    finished = None
    for candidate in _possible_stagings(staging):
        journal = _read_journal(candidate)
        if journal is None:
            continue
        if journal.get("mode") == SWAP:
            finish_swap(candidate, journal)
        else:
            roll_forward(candidate, journal)
        finished = journal
    return finished


def _possible_stagings(staging: Staging) -> list[Staging]:
    # A local folder may have been committed either way by the run before (a folder can become
    # a mount point, or its parent read-only, between runs).
    if has_scheme(staging.output):
        return [staging]
    return [swap_staging(staging.output), journal_staging(staging.output)]


def _read_journal(staging: Staging) -> dict | None:
    try:
        return read_json(staging.journal)
    except (ValueError, UnicodeDecodeError):
        # A journal is written whole (under a temporary name, then renamed): one that does not
        # parse was not written by recordforge.
        raise CommitError(
            f"{staging.journal} is not a recordforge commit journal; move it away"
        ) from None
