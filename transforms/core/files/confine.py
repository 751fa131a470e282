"""Confinement: the folders a job may open files under (`--allowed-root`), and `file://` URIs.

A local path is judged by where it really leads: symbolic links and `..` resolved
(os.path.realpath), so neither `../../etc/passwd` in a CSV cell nor a link inside an input
folder reaches past an allowed root. A URL (`gs://bucket/prefix`) is judged by its text: object
stores have no links, and `.` and `..` in a CSV cell are resolved before (paths.resolve_reference).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Sequence

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.files.filenames import from_os, to_os
from recordforge.transforms.core.files.paths import has_scheme


def local_path_of_uri(uri: str) -> str:
    """`file:///a/b%20c.jpg` → `/a/b c.jpg` (RFC 8089); other text is returned as it is.

    Raises:
        InputError: `UnsupportedPath` for a `file://` URI that names another host.
    """
    if not uri[:7].lower() == "file://":
        return uri
    parsed = urllib.parse.urlsplit(uri)
    if parsed.netloc not in ("", "localhost"):
        raise InputError(
            "UnsupportedPath",
            f"{uri} names a file on another host ({parsed.netloc}); only file:///path URIs of "
            "this machine are read",
        )
    path = urllib.parse.unquote(parsed.path, errors="surrogateescape")
    return from_os(path) if path else "/"


def normalize_root(root: str) -> str:
    """An allowed root as compared: a local folder's real path, a URL without its final '/'."""
    root = local_path_of_uri(root)
    if has_scheme(root):
        stripped = root.rstrip("/")
        return stripped if not stripped.endswith(":/") else root
    return from_os(os.path.realpath(to_os(os.path.abspath(os.path.expanduser(root)))))


def real_path(path: str) -> str:
    """Where a path leads: a local path's real path (links and `..` resolved), a URL as it is."""
    if has_scheme(path):
        return path
    return from_os(os.path.realpath(to_os(path)))


def is_within(path: str, roots: Sequence[str]) -> bool:
    """Whether a path (real path or URL, as `real_path` gives) lies under one of `roots`."""
    for root in roots:
        if path == root or path.startswith(root if root.endswith("/") else root + "/"):
            return True
    return False


def check_allowed(path: str, roots: Sequence[str]) -> None:
    """Refuse to open a path outside every allowed root; no roots means no limit.

    Raises:
        InputError: `OutsideAllowedRoot`; nothing of the file is read.
    """
    if not roots:
        return
    where = real_path(path)
    if is_within(where, roots):
        return
    leads = f"{path} leads to {where}, which is" if where != path else f"{path} is"
    raise InputError(
        "OutsideAllowedRoot",
        f"{leads} outside every --allowed-root ({', '.join(roots)}); not read",
    )
