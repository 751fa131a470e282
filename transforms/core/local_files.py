"""Local files opened ahead of their turn, with the kernel asked to read them meanwhile.

The probe and the shard writer both go through files in a known order. Opening each file some
files before its turn, with a `posix_fadvise(WILLNEED)` hint on what will be read, lets the
kernel read files no longer in the page cache many at a time while the ones before them are
worked on, instead of one read after another at the disk's latency. From the page cache it
costs no more than opening the file in turn.
"""

from __future__ import annotations

import io
import os


def open_hinted(path: str, head: int = 0, tail: int = 0) -> io.FileIO | None:
    """`path` opened for unbuffered reads, the kernel asked to read what will be read: the
    first `head` bytes and the last `tail` (head 0: the whole file).

    None when the file cannot be opened: the caller opens it again and reports why.
    """
    try:
        opened = io.FileIO(path)
    except OSError:
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
