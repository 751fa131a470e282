"""Swapping two directories in one step: Linux's renameat2(2) with RENAME_EXCHANGE.

Python has no wrapper for it. The PyPI packages that do (`renameat2`, a compiled cffi module,
last released 2022; `atomicswap`, raw syscall numbers per architecture, 2023) are not kept up,
so this calls glibc's own `renameat2` (exported since glibc 2.28) through ctypes: one function,
looked up by name, on every architecture glibc supports. Where it is missing (musl, macOS,
an old glibc) or the filesystem refuses the flag (EINVAL: NFS, some FUSE filesystems),
`exchange` raises OSError and the caller stages and commits another way.
"""

from __future__ import annotations

import ctypes
import errno
import os

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _libc_renameat2():
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter runs on
        function = libc.renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = (
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    )
    function.restype = ctypes.c_int
    return function


_RENAMEAT2 = _libc_renameat2()


def exchange_available() -> bool:
    """Whether the C library has renameat2 (the filesystem may still refuse the exchange)."""
    return _RENAMEAT2 is not None


def exchange(first: str, second: str) -> None:
    """Swap the paths `first` and `second` (both must exist) in one atomic step.

    Raises:
        OSError: ENOSYS without renameat2; EINVAL where the filesystem cannot exchange; ENOENT,
            EXDEV (different filesystems) and the rest as rename(2) would.
    """
    if _RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available in this C library")
    result = _RENAMEAT2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot exchange {first} and {second}: {os.strerror(code)}")
