"""Typed errors: problems with one input (quarantined) and problems with how the tool was called."""

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


class UsageError(ValueError):
    """The tool was asked for something it cannot do (bad path, bad option, bad schema file).

    The CLI reports the message as one line on stderr and exits with status 2, without a traceback.
    A ValueError, for library callers (recordforge.reshard, recordforge.WriteDataset).
    """


class ErrorRateExceeded(Exception):
    """More inputs failed than --max-error-rate allows; the run ends without a manifest."""


class InputChanged(Exception):
    """An input file changed while the run was reading it; the run ends without a manifest."""


class InputIncomplete(Exception):
    """An input file could not be read to its end (a CSV file cut short, damaged compression, an
    I/O error): how many rows it holds is unknown, so the run ends without a manifest."""
