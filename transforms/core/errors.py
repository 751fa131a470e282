"""Typed errors: problems with one input (quarantined) and problems with how the tool was called.

The errors a library call raises share one base, RecordforgeError; `recordforge.errors` is their
public home. Only the CLI turns them into exit statuses.
"""

from __future__ import annotations

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


class InputIncomplete(RunFailed):
    """An input file could not be read to its end (a CSV file cut short, damaged compression, an
    I/O error): how many rows it holds is unknown, so the run ends without a manifest."""
