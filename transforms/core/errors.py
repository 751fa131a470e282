"""Typed errors: problems with one input (quarantined) and problems with how the tool was called.

The errors a library call raises share one base, RecordforgeError; `recordforge.errors` is their
public home. Only the CLI turns them into exit statuses.
"""

from __future__ import annotations

import errno
import re

# A Python bytes literal, as some libraries' messages quote a file's bytes (b'\x89PNG').
_BYTES_LITERAL = re.compile(r"""(?<!\w)b(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def without_file_bytes(text: str) -> str:
    """A library's error message with any quoted bytes of the file taken out: no message of
    recordforge's quotes what a file holds (it may not be the user's to see)."""
    return _BYTES_LITERAL.sub("<bytes>", text)


class InputError(Exception):
    """One input (a file, a CSV row) cannot become a record; the run goes on without it.

    Attributes:
        kind: a short CamelCase name for the problem, written to the errors file's `error` field
            (for example `TruncatedImage`, `BadCell`).
        message: what is wrong, in words a user can act on. The caller adds where (file, row).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __reduce__(self):
        # Beam may pickle exceptions between processes; keep both fields.
        return (type(self), (self.kind, self.message))


class RecordforgeError(Exception):
    """What recordforge raises for a failure of its own kind (not a bug, not a runner's fault)."""


class UsageError(RecordforgeError, ValueError):
    """The tool was asked for something it cannot do (bad path, bad option, bad schema file).

    The CLI reports the message as one line on stderr and exits with status 2, without a traceback.
    A ValueError, for library callers (recordforge.reshard, recordforge.WriteDataset).
    """


class RunFailed(RecordforgeError):
    """A run the pipeline itself refused to finish; it wrote no manifest (the CLI exits 1)."""


class ErrorRateExceeded(RunFailed):
    """More inputs failed than --max-error-rate allows; the run ends without a manifest."""


class InputChanged(RunFailed):
    """An input file changed while the run was reading it; the run ends without a manifest."""


class VerifyFailed(RecordforgeError):
    """`verify(..., check=True)` found problems; `report` holds them all."""

    def __init__(self, message: str, report=None) -> None:
        super().__init__(message)
        self.report = report


class ResumeRefused(RecordforgeError):
    """`--resume` was asked for, but the staged work was made from other inputs or options."""


class OutOfSpace(RunFailed):
    """The disk (or quota) ran out while a file was written; the message names it."""


class FileNameTooLong(RunFailed):
    """A shard's file name is longer than the file system takes (a split name from the data);
    the message names the shard and the split."""


def out_of_space_message(error: OSError, what: str, where: str) -> str | None:
    """One line for an OSError that is a full disk or an exhausted quota, else None.

    `what`: what was being written (say, "shard x-train..."); `where`: its path, when the
    error does not name it (a write to an open file names none).
    """
    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    reason = "out of disk space" if error.errno == errno.ENOSPC else "out of disk quota"
    return f"{reason} while writing {what} at {error.filename or where}"


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived (the `recordforge` program turns them into this).

    A BaseException, like KeyboardInterrupt: code that handles errors (`except Exception`)
    lets it through to the program, which says what was kept and exits 128 + the signal.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        import signal

        return {signal.SIGINT: "SIGINT (Ctrl-C)"}.get(self.signum, signal.Signals(self.signum).name)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class WorkerLost(BaseException):
    """A worker process of the runner died (killed, out of memory) under a bundle: the program
    ends the run, which the runner might otherwise wait for forever. A BaseException, like
    Stopped, so that no error handler on the way takes it for a failure of its own."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ListingFailed(RunFailed):
    """A folder or glob on an object store could not be listed (the listing was refused or kept
    failing): which inputs it holds is unknown, so the run ends without a manifest."""


class OutputTaken(RunFailed):
    """The output folder received a dataset during the run, which was not told to overwrite
    one: it is left as it is, and the run ends without a manifest."""


class InputIncomplete(RunFailed):
    """An input file could not be read to its end (a CSV file cut short, damaged compression, an
    I/O error): how many rows it holds is unknown, so the run ends without a manifest."""
