"""One run per output folder: a lock created exclusively before anything is written.

Local folders: a file created with O_EXCL. `gs://`: an object created with the precondition
ifGenerationMatch=0 (it must not exist), through google-cloud-storage. Other object stores have
no conditional create in Beam's FileSystems: there the lock is checked, then written (a race of
two runs starting within the same moment is not caught).

The lock holds the run's id, host, process id and start time. A lock whose process is dead on
this same host is stale and taken over (looked at and deleted under an flock of its folder, so
that of several runs taking it over one wins); any other is refused, naming its holder. A run handed
to a remote runner without waiting for it (`detached`) is never judged by its launcher's
process: its commit releases the lock, and a failed one leaves it to be deleted by hand.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.remote_reads import open_file

# A lock file with no readable holder is being written, unless it is older than this.
_UNREADABLE_GRACE_SECONDS = 30
_ATTEMPTS = 5


@dataclass(frozen=True)
class LockHolder:
    """Who holds an output folder's lock."""

    run_id: str
    host: str
    pid: int
    started: str
    detached: bool = False

    @classmethod
    def this_process(cls, run_id: str, *, detached: bool = False) -> LockHolder:
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return cls(run_id, socket.gethostname(), os.getpid(), started, detached)

    def describe(self) -> str:
        how = ", handed to a runner" if self.detached else ""
        return f"run {self.run_id} (pid {self.pid} on {self.host}, started {self.started}{how})"

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> LockHolder:
        fields = json.loads(data.decode("utf-8"))
        return cls(**{key: fields[key] for key in cls.__dataclass_fields__ if key in fields})

    def is_stale(self) -> bool:
        """Whether this holder is a process of this host that no longer runs."""
        if self.detached or self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return _exited(self.pid)


def _exited(pid: int) -> bool:
    """Whether a process that still exists is a zombie: it ended (killed, say) and only its
    exit status waits for a parent to collect it, which a parent killed with it never does.
    Linux's /proc tells; elsewhere it is taken as running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold any byte.
    return fields[fields.rindex(b")") + 2 :].split(maxsplit=1)[:1] == [b"Z"]


class LockHeld(Exception):
    """The output folder is locked by another run (the message names it)."""

    def __init__(self, path: str, holder: LockHolder | None) -> None:
        who = holder.describe() if holder else "a run that is starting"
        super().__init__(
            f"another conversion is writing this output: {who} holds {path}; wait for it, or, "
            "if it is no longer running, delete that file"
        )
        self.holder = holder


def acquire_lock(path: str, holder: LockHolder) -> LockHolder | None:
    """Take the lock at `path` for `holder`.

    Returns:
        The stale holder whose lock was taken over, or None.

    Raises:
        LockHeld: a live run (or one this process cannot judge) holds it.
    """
    store = _GcsLock(path) if path.startswith("gs://") else _FileLock(path)
    taken_over = None
    for _ in range(_ATTEMPTS):
        if store.create(holder.to_bytes()):
            return taken_over
        found = store.read()
        if found is None:
            continue  # released meanwhile
        current, token, age = found
        if current is None and age < _UNREADABLE_GRACE_SECONDS:
            raise LockHeld(path, None)
        if current is not None and not current.is_stale():
            raise LockHeld(path, current)
        if store.remove(token):
            taken_over = current
    raise LockHeld(path, None)


def read_lock(path: str) -> LockHolder | None:
    """The holder of the lock at `path`, or None when there is none (or it is unreadable)."""
    store = _GcsLock(path) if path.startswith("gs://") else _FileLock(path)
    found = store.read()
    return None if found is None else found[0]


def release_lock(path: str, run_id: str) -> None:
    """Delete the lock at `path` if `run_id` holds it."""
    store = _GcsLock(path) if path.startswith("gs://") else _FileLock(path)
    found = store.read()
    if found is not None and found[0] is not None and found[0].run_id == run_id:
        store.remove(found[1])


def _parse(data: bytes) -> LockHolder | None:
    try:
        return LockHolder.from_bytes(data)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return None


class _FileLock:
    """A lock file on a local disk, or (without a conditional create) on another store."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._local = not has_scheme(path)

    def create(self, data: bytes) -> bool:
        if not self._local:
            if FileSystems.exists(self._path):
                return False
            with FileSystems.create(
                self._path, compression_type=CompressionTypes.UNCOMPRESSED
            ) as f:
                f.write(data)
            return True
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            # Not left behind empty or cut: the next run would take it for a run starting.
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            raise
        return True

    def read(self):
        """(holder or None when unreadable, a token for `remove`, age in seconds), or None."""
        try:
            if self._local:
                with open(self._path, "rb") as f:
                    data = f.read()
                    age = time.time() - os.fstat(f.fileno()).st_mtime
            else:
                with open_file(self._path) as f:
                    data = f.read()
                age = _UNREADABLE_GRACE_SECONDS
        except FileNotFoundError:
            return None
        except OSError:
            if self._local or FileSystems.exists(self._path):
                raise
            return None
        return _parse(data), data, age

    def remove(self, seen: bytes) -> bool:
        """Delete the lock if it still holds `seen`; whether this call removed it."""
        if not self._local:
            FileSystems.delete([self._path])
            return True
        # Looked at and deleted as one step among the runs of this host (the only ones that
        # take a lock over): of two runs taking over one stale lock, the second finds it gone
        # or replaced by the first one's fresh lock, never deletes that.
        folder = os.open(os.path.dirname(self._path) or ".", os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            try:
                with open(self._path, "rb") as f:
                    if f.read() != seen:
                        return False
            except FileNotFoundError:
                return False
            os.remove(self._path)
            return True
        finally:
            os.close(folder)  # releases the flock


class _GcsLock:
    """A lock object on Cloud Storage, created and deleted under generation preconditions."""

    def __init__(self, path: str) -> None:
        from google.cloud import storage

        bucket, _, name = path[len("gs://") :].partition("/")
        project = os.environ.get("GOOGLE_CLOUD_PROJECT") or None
        self._blob = storage.Client(project=project).bucket(bucket).blob(name)

    def create(self, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self._blob.upload_from_string(data, if_generation_match=0)
        except PreconditionFailed:
            return False
        return True

    def read(self):
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self._blob.bucket.get_blob(self._blob.name)
        if blob is None:
            return None
        try:
            data = blob.download_as_bytes(if_generation_match=blob.generation)
        except (NotFound, PreconditionFailed):
            return None  # deleted or replaced meanwhile: the caller tries again
        age = time.time() - blob.updated.timestamp() if blob.updated else 0
        return _parse(data), blob.generation, age

    def remove(self, generation: int) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            self._blob.delete(if_generation_match=generation)
        except (NotFound, PreconditionFailed):
            return False
        return True
