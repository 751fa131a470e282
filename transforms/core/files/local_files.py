"""Local files opened ahead of their turn, with the kernel asked to read them meanwhile.

The probe and the shard writer both go through files in a known order. Opening each file some
files before its turn, with a `posix_fadvise(WILLNEED)` hint on what will be read, lets the
kernel read files no longer in the page cache many at a time while the ones before them are
worked on, instead of one read after another at the disk's latency. From the page cache it
costs no more than opening the file in turn.
"""

from __future__ import annotations

import errno
import io
import os
import stat

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.files.filenames import display, to_os

_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)
# Opening never waits (a FIFO waits for a writer otherwise) and never makes a terminal ours.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


def open_regular(path: str) -> io.FileIO:
    """A local file (pipeline text, see files.filenames) opened for unbuffered reads, once it is
    known to be a regular file: a FIFO, socket or device is not opened at all (its mode is
    read first), and a file swapped for one meanwhile is closed before anything is read.

    Raises:
        InputError: `NotARegularFile`, or `PathTooLong` for a path the system cannot open.
        OSError: the file cannot be opened (missing, forbidden).
    """
    os_path = to_os(path)
    try:
        _refuse_special(path, os.stat(os_path).st_mode)
        fd = os.open(os_path, _OPEN_FLAGS)
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise InputError(
                "PathTooLong", f"the path {display(path)} is longer than this system allows"
            ) from error
        raise
    try:
        _refuse_special(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return io.FileIO(fd, closefd=True)


def _refuse_special(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
    raise InputError(
        "NotARegularFile", f"{display(path)} is {what}, not a regular file; not opened"
    )


def open_hinted(path: str, head: int = 0, tail: int = 0) -> io.FileIO | None:
    """`path` opened for unbuffered reads, the kernel asked to read what will be read: the
    first `head` bytes and the last `tail` (head 0: the whole file).

    None when the file cannot be opened, or is not a regular file (open_regular): the caller
    opens it again with open_regular and reports why.
    """
    try:
        opened = open_regular(path)
    except (OSError, InputError):
        return None
    try:
        fd = opened.fileno()
        os.posix_fadvise(fd, 0, head, os.POSIX_FADV_WILLNEED)
        if head and tail:
            size = os.fstat(fd).st_size
            if size > head:
                start = max(head, size - tail)
                os.posix_fadvise(fd, start, size - start, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):  # only a hint; AttributeError: none on macOS
        pass
    return opened
