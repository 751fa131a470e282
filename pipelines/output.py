"""The output folder around a run: how it is staged, its lock, an interrupted run's leftovers.

Before a conversion builds its pipeline (docs/design.md, "Commit protocol"):
1. the staging is chosen: SWAP for a local folder whose parent can hold a working folder on the
   same filesystem and exchange it, JOURNAL otherwise (transforms/staging.py);
2. the lock is taken (transforms/lock.py): a second run is refused, naming the first;
3. an interrupted commit is finished (rolled forward) and the staged work of an interrupted run
   is kept for `--resume` (if its options match) or discarded;
4. the folder's contents are checked: files no recordforge manifest lists are never deleted, so
   their presence refuses the run; a dataset is replaced only with `--overwrite`;
5. the working folder is created and the run record written into it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files.naming import (
    TEMP_DIR_PREFIX,
    WRITE_TEST_PREFIX,
    is_control_file,
)
from recordforge.transforms.core.files.parts import PART_RECORD_SUFFIX
from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.core.files.swap import exchange, exchange_available
from recordforge.transforms.core.files.walk import is_glob
from recordforge.transforms.core.planning.sharding import human_size
from recordforge.transforms.core.records import Source
from recordforge.transforms.listing import list_files
from recordforge.transforms.lock import LockHeld, LockHolder, acquire_lock, release_lock
from recordforge.transforms.staging import (
    CommitError,
    Staging,
    committed_files,
    folder_exists,
    journal_staging,
    read_json,
    recover,
    swap_staging,
    write_json,
)
from recordforge.transforms.storage_errors import STORAGE_ERRORS, WRITE_ERRORS, storage_reason
from recordforge.transforms.write import remove_tree

LOGGER = logging.getLogger("recordforge")

RUN_RECORD_FORMAT = 1

# How the options a run records read on the command line, for "what changed" messages.
_OPTION_NAMES = {
    "inputs": "the inputs",
    "csv_schema": "the CSV schema",
    "tool_version": "recordforge's version",
    "options.name": "--name",
    "options.splits": "--splits",
    "options.split_column": "--split-column",
    "options.split_salt": "--split-salt",
    "options.labels": "--labels",
    "options.image_column": "--image-column",
    "options.label_column": "--label-column",
    "options.max_image_pixels": "--max-image-pixels",
    "options.compression": "--compression",
    "options.write_index": "--write-index",
    "options.tfds": "--tfds",
    "options.sharding.num_hosts": "--num-hosts",
    "options.sharding.min_shard_bytes": "--min-shard-mb",
    "options.sharding.max_shard_bytes": "--max-shard-mb",
    "options.sharding.ideal_shard_bytes": "--min-shard-mb/--max-shard-mb",
    "options.sharding.num_shards": "--num-shards",
}


@dataclass
class PreparedOutput:
    """An output folder ready for a run: staged, locked, leftovers dealt with."""

    staging: Staging
    holder: LockHolder
    resuming: str | None = None  # the run id whose staged work `--resume` keeps
    finished: dict | None = None  # the journal of an interrupted commit this run finished
    resumable: bool = True  # whether `--resume` can continue this run (reshard's cannot)

    def nothing_to_resume(self, key: str) -> bool:
        """Whether `--resume` found the run it continues committed: an interrupted commit of
        the same options, finished before this run began."""
        return self.finished is not None and self.finished.get("run_key") == key

    def release(self) -> None:
        """Give up the lock (the working folder stays as it is)."""
        try:
            release_lock(self.staging.lock, self.holder.run_id)
        except STORAGE_ERRORS as error:
            LOGGER.warning("could not remove the lock %s: %s", self.staging.lock, error)


def run_options(config) -> dict:
    """What a run records of its options and inputs: all that shapes the output's bytes."""
    record = {
        "tool_version": config.tool_version,
        "inputs": [source.pattern for source in config.sources],
        "options": dict(config.options),
    }
    if config.csv_schema is not None:
        record["csv_schema"] = config.csv_schema.to_dict()
    return json.loads(json.dumps(record, sort_keys=True))


def run_key(options: Mapping) -> str:
    """A digest of `run_options`, part of every staged shard's fingerprint."""
    return hashlib.blake2b(json.dumps(options, sort_keys=True).encode(), digest_size=16).hexdigest()


def check_location(output: str, sources: Sequence[Source]) -> None:
    """The output folder must not lie inside an image input (a folder or glob: an image file
    given on its own is all its source reads, whatever lies beside it); `prepare_output`
    refuses a file."""
    for source in sources:
        if (
            source.kind == "images"
            and is_glob(source.pattern)
            and (output + "/").startswith(source.root.rstrip("/") + "/")
        ):
            raise UsageError(
                f"the output folder {output!r} is inside the input {source.given!r}; "
                "its files would be read as inputs"
            )


def _check_not_a_file(output: str) -> None:
    # A file there would be replaced by the dataset's folder.
    if not has_scheme(output) and os.path.lexists(output) and not os.path.isdir(output):
        raise UsageError(f"the output {output!r} is a file, not a folder")
    if has_scheme(output) and output in list_files(output):
        raise UsageError(f"the output {output!r} is a file, not a folder")


def choose_staging(output: str) -> Staging:
    """SWAP where a local folder can be exchanged with a sibling, JOURNAL otherwise."""
    if has_scheme(output):
        return journal_staging(output)
    swap = swap_staging(output)
    parent = os.path.dirname(swap.target)
    if os.path.isdir(swap.target) and os.path.ismount(swap.target):
        return journal_staging(output, "the output folder is a mount point")
    if not exchange_available():
        return journal_staging(output, "this system's C library has no renameat2")
    try:
        os.makedirs(parent, exist_ok=True)
        _remove_stale_probes(parent, os.path.basename(swap.target))
        probe = tempfile.mkdtemp(
            prefix=_probe_prefix(os.path.basename(swap.target), LockHolder.this_process("")),
            dir=parent,
        )
    except OSError:
        return journal_staging(output, f"its parent folder {parent} is not writable")
    try:
        first, second = os.path.join(probe, "a"), os.path.join(probe, "b")
        os.mkdir(first)
        os.mkdir(second)
        exchange(first, second)
    except OSError as error:
        return journal_staging(output, f"its filesystem cannot exchange folders ({error.strerror})")
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return swap


def _probe_prefix(name: str, holder: LockHolder | None = None) -> str:
    """The start of the names of the folders that test whether `name`'s parent can exchange
    folders; with `holder`, of the one its process makes (its pid and host in the name)."""
    prefix = f".{name}.recordforge-probe-"
    return prefix if holder is None else f"{prefix}{holder.pid}@{holder.host}-"


def _remove_stale_probes(parent: str, name: str) -> None:
    """Delete the exchange probes beside `name` whose process, of this host, no longer runs:
    a run killed (SIGKILL, the OOM killer) while it probed left one behind."""
    prefix = _probe_prefix(name)
    for entry in os.listdir(parent):
        owner, _, rest = entry[len(prefix) :].partition("@")
        if not (entry.startswith(prefix) and owner.isdigit() and "-" in rest):
            continue  # not a probe, or one named before probes named their process
        holder = LockHolder("", rest.rsplit("-", 1)[0], int(owner), "")
        if holder.is_stale():
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def prepare_output(
    output: str,
    *,
    run_id: str,
    options: Mapping,
    overwrite: bool,
    resume: bool,
    detached: bool = False,
    resumable: bool = True,
) -> PreparedOutput:
    """Choose the staging, take the lock, deal with leftovers and check the folder.

    Raises:
        UsageError: the output is a file; the folder is locked by another run, holds files
            recordforge did not write, holds a dataset without --overwrite, cannot be written,
            or `--resume` finds staged work made with other options.

    A run that is not `resumable` (reshard, WriteDataset) keeps no staged work when it stops
    and does not point to `--resume` when it discards another run's.
    """
    _check_not_a_file(output)
    staging = choose_staging(output)
    holder = LockHolder.this_process(run_id, detached=detached)
    try:
        taken_over = acquire_lock(staging.lock, holder)
    except LockHeld as error:
        raise UsageError(str(error)) from None
    except WRITE_ERRORS as error:
        raise UsageError(
            f"cannot write to the output folder {output!r}: {_first_line(error)}"
        ) from None
    prepared = PreparedOutput(staging, holder, resumable=resumable)
    notes = []  # said once the run goes ahead: a refused run says one line only
    try:
        if taken_over is not None:
            notes.append(f"took over the lock of {taken_over.describe()}, which no longer runs")
        try:
            prepared.finished = recover(staging)
        except CommitError as error:
            raise UsageError(str(error)) from None
        if prepared.finished:
            notes.append(_finished_commit(prepared.finished, output))
        if not (resume and prepared.nothing_to_resume(run_key(options))):
            _check_contents(staging, overwrite)
            prepared.resuming = _leftovers(staging, options, resume, notes, resumable)
            _start_work(staging, run_id, options, prepared.resuming)
    except BaseException as error:
        if prepared.finished:  # a refused run has changed the folder even so: it says how
            LOGGER.warning("%s", _finished_commit(prepared.finished, output))
        prepared.release()
        if isinstance(error, STORAGE_ERRORS):  # the previous manifest unreadable, say
            where = f" ({error.filename})" if getattr(error, "filename", None) else ""
            raise UsageError(
                f"cannot prepare the output folder {output!r}: {storage_reason(error)}{where}"
            ) from None
        raise
    for note in notes:
        LOGGER.info("%s", note)
    return prepared


def _finished_commit(journal: dict, output: str) -> str:
    return (
        f"finished the interrupted commit of run {journal.get('run_id')} into {output} (it had "
        "passed its commit point): the folder holds that run's dataset now"
    )


def _leftovers(
    staging: Staging, options: Mapping, resume: bool, notes: list, resumable: bool = True
) -> str | None:
    """Keep (for `--resume`) or remove an interrupted run's working folder; the run id kept."""
    for candidate in _working_folders(staging):
        if not folder_exists(candidate.work):
            continue
        record = _read_run_record(candidate)
        if resume and record is not None and candidate.work == staging.work:
            changes = _differences(record.get("options") or {}, options)
            if changes:
                raise UsageError(
                    "--resume: the options changed since the interrupted run "
                    f"{record.get('run_id')}: {'; '.join(changes)}; rerun without --resume to "
                    "start over"
                )
            staged = staged_work(candidate) or "nothing staged"
            notes.append(f"resuming run {record.get('run_id')}: {staged}")
            return record.get("run_id")
        what = staged_work(candidate)
        remove_tree(candidate.work)
        if what:
            keeps = "; --resume keeps it" if resumable else ""
            notes.append(f"discarded the staged work of an interrupted run ({what}){keeps}")
    _remove_old_temp_folders(staging.output)
    if resume:
        notes.append(
            f"--resume: no interrupted run to continue in {staging.output}; starting afresh"
        )
    return None


def _working_folders(staging: Staging) -> list[Staging]:
    if has_scheme(staging.output):
        return [staging]
    others = [swap_staging(staging.output), journal_staging(staging.output)]
    return [staging] + [other for other in others if other.work != staging.work]


def _read_run_record(staging: Staging) -> dict | None:
    try:
        record = read_json(staging.run_record)
    except (*STORAGE_ERRORS, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or record.get("format_version") != RUN_RECORD_FORMAT:
        return None
    return record


def _differences(before: Mapping, now: Mapping, prefix: str = "") -> list[str]:
    changes = []
    for key in sorted(set(before) | set(now)):
        path = f"{prefix}{key}"
        old, new = before.get(key), now.get(key)
        whole = path in ("csv_schema", "options.splits")
        if isinstance(old, Mapping) and isinstance(new, Mapping) and not whole:
            changes += _differences(old, new, path + ".")
        elif old != new:
            name = _OPTION_NAMES.get(path, path)
            if path == "csv_schema":
                changes.append(f"{name} differs")
            else:
                changes.append(f"{name}: {_shown(old)} → {_shown(new)}")
    return changes


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def staged_work(staging: Staging) -> str | None:
    """What a working folder holds that `--resume` would keep, in words; None when nothing."""
    try:
        (matched,) = FileSystems.match([FileSystems.join(staging.parts, "*" + PART_RECORD_SUFFIX)])
    except Exception:  # noqa: BLE001  (no parts folder: nothing staged)
        return None
    records = [m.path for m in matched.metadata_list]
    if not records:
        return None
    total = 0
    for path in records:
        try:
            total += json.loads(_read_text(path)).get("num_bytes", 0)
        except (*STORAGE_ERRORS, ValueError):
            continue
    count = len(records)
    return f"{count:,} staged shard{'s' if count != 1 else ''}, {human_size(total)}"


def cleaned_up_after_commit(staging: Staging) -> bool:
    """Whether the run's record is gone from its working folder: while the run holds the lock,
    only its commit's cleanup removes it, after the new dataset is in place (and the commit's
    journal is gone with it)."""
    try:
        return not FileSystems.exists(staging.run_record)
    except STORAGE_ERRORS:  # not known: not claimed
        return False


def keep_resumable(staging: Staging, resumable: bool = True) -> str:
    """After a run that stopped or failed: keep what `--resume` can use (staged shards, and the
    errors files of a run its error rate failed), delete the rest (spill files are never
    reused; nothing of a run `--resume` cannot continue); says what was kept."""
    staged = staged_work(staging) if resumable else None
    failed_errors = folder_exists(staging.errors)
    try:
        if staged or failed_errors:
            remove_tree(staging.spill)
            if not resumable:
                remove_tree(staging.parts)
        else:
            remove_tree(staging.work)
    except STORAGE_ERRORS as error:
        LOGGER.warning("could not clean up %s: %s", staging.work, error)
    if staged:
        return f"{staged} kept in {staging.work}: add --resume to continue"
    return "nothing staged was kept"


def _read_text(path: str) -> str:
    from recordforge.transforms.remote_reads import open_file

    with open_file(path) as f:
        return f.read().decode("utf-8")


def _remove_old_temp_folders(output: str) -> None:
    # Left by killed runs of versions before the staged commit: recordforge's, never a dataset.
    for path in list_files(output.rstrip("/") + "/**"):
        relative = path[len(output.rstrip("/")) + 1 :]
        top = relative.split("/", 1)[0]
        if top.startswith((TEMP_DIR_PREFIX, WRITE_TEST_PREFIX)):
            FileSystems.delete([path])
    if not has_scheme(output) and os.path.isdir(output):
        for name in os.listdir(output):
            if name.startswith(TEMP_DIR_PREFIX) and not os.listdir(os.path.join(output, name)):
                os.rmdir(os.path.join(output, name))


def _check_contents(staging: Staging, overwrite: bool) -> None:
    output = staging.output.rstrip("/")
    relatives = [path[len(output) + 1 :] for path in list_files(output + "/**")]
    present = [relative for relative in relatives if not is_control_file(relative)]
    if not present:
        return
    if not overwrite:
        raise UsageError(
            f"the output folder {output!r} is not empty; use --overwrite to replace the "
            "dataset in it"
        )
    _, listed = committed_files(output)
    foreign = [relative for relative in present if relative not in set(listed)]
    if foreign:
        more = f" and {len(foreign) - 1:,} more" if len(foreign) > 1 else ""
        raise UsageError(
            f"--overwrite: {output!r} holds {foreign[0]!r}{more}, which recordforge did not "
            "write (no recordforge manifest there lists it); refusing to delete it: move it "
            "away, or choose another output folder"
        )


def _start_work(staging: Staging, run_id: str, options: Mapping, resuming: str | None) -> None:
    """Create the working folder, prove it can be written, and record the run in it."""
    probe = FileSystems.join(staging.work, f"{WRITE_TEST_PREFIX}{uuid.uuid4().hex}")
    try:
        with FileSystems.create(probe, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(b"")
        FileSystems.delete([probe])
        record = {
            "format_version": RUN_RECORD_FORMAT,
            "run_id": run_id,
            "resumes": resuming,
            "options": options,
            "output": staging.output,
        }
        write_json(staging.run_record, record, staging.work)
    except WRITE_ERRORS as error:
        raise UsageError(
            f"cannot write to the output folder {staging.output!r}: {_first_line(error)}"
        ) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
