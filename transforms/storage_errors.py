"""What Beam FileSystems raise for a missing or forbidden file, on any store.

Local files raise OSError and Beam wraps some failures in BeamIOError, but Beam's GCS filesystem
lets the storage client's own exceptions through: a missing object is
`google.api_core.exceptions.NotFound`, not FileNotFoundError, and an upload the server refuses
(no such bucket, no permission) is `google.cloud.storage.exceptions.InvalidResponse`. Those are
facts about the user's paths, to be reported against them; other errors (throttling, outages)
propagate, so the runner retries the work.
"""

from __future__ import annotations

import errno

from apache_beam.io.filesystem import BeamIOError

from recordforge.transforms.core.errors import without_file_bytes


def _gcs_read_errors() -> tuple[type[BaseException], ...]:
    try:  # installed with apache-beam[gcp]; absent from a Beam without the GCP extra
        from google.api_core.exceptions import Forbidden, NotFound
    except ImportError:
        return ()
    return (NotFound, Forbidden)


def _gcs_write_errors() -> tuple[type[BaseException], ...]:
    try:
        from google.cloud.storage.exceptions import InvalidResponse
    except ImportError:
        return ()
    return (InvalidResponse,)


# Reading a file (or listing, or deleting one).
STORAGE_ERRORS: tuple[type[BaseException], ...] = (OSError, BeamIOError, *_gcs_read_errors())
# Creating one: also an upload the store refuses. Only where any refusal is the user's to fix
# (the output folder checked before a run, the --html page): a worker lets it propagate.
WRITE_ERRORS: tuple[type[BaseException], ...] = (*STORAGE_ERRORS, *_gcs_write_errors())


def storage_reason(error: BaseException) -> str:
    """Why a file could not be opened or read, in a few words (never quoting its bytes)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).strip() or type(error).__name__
    return without_file_bytes(text.splitlines()[0])


# The process's limits, not a fact about the file: too many open files (here or machine-wide).
# An input met by one is not bad input; it must not be quarantined, so the run fails. (ENOMEM
# from a read is not re-raised: the in-process runner then hung, found injecting it with strace.)
_PROCESS_LIMITS = (errno.EMFILE, errno.ENFILE)


def raise_process_limit(error: BaseException) -> None:
    """Re-raise `error` when it is a limit of the process (see _PROCESS_LIMITS)."""
    if isinstance(error, OSError) and error.errno in _PROCESS_LIMITS:
        raise error
