"""Path arithmetic for sources: roots of globs, relative paths, hidden files. No I/O here."""

from __future__ import annotations

import posixpath
import re

_GLOB_CHARS = re.compile(r"[*?\[]")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")

CSV_SUFFIXES = (".csv", ".csv.gz")


def has_scheme(path: str) -> bool:
    """Whether a path is a URL (gs://, s3://, ...) rather than a local path."""
    return bool(_SCHEME.match(path))


def has_glob(path: str) -> bool:
    """Whether `path` contains glob characters."""
    return bool(_GLOB_CHARS.search(path))


def glob_root(pattern: str) -> str:
    """The folder part of a glob before its first wildcard: `a/b/*/c*.jpg` -> `a/b`."""
    prefix = _GLOB_CHARS.split(pattern, maxsplit=1)[0]
    return prefix.rsplit("/", 1)[0] if "/" in prefix else "."


def relative_path(path: str, root: str) -> str:
    """`path` relative to the folder `root`, with forward slashes (works for gs:// too)."""
    root = root.rstrip("/")
    if root in ("", "."):
        return path
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    # Local paths may differ in spelling (./a vs a); fall back to normalised comparison.
    return posixpath.relpath(posixpath.normpath(path), posixpath.normpath(root))


def is_hidden(relative: str) -> bool:
    """Whether any component of a relative path starts with a dot (.DS_Store, .git/, ._x.jpg)."""
    if not relative.startswith(".") and "/." not in relative:
        return False  # the usual answer, without splitting the path
    return any(part.startswith(".") for part in relative.split("/") if part not in (".", ".."))


def is_csv(path: str) -> bool:
    """Whether a file is read as CSV (by its name: .csv or .csv.gz)."""
    return path.lower().endswith(CSV_SUFFIXES)


def is_compressed_csv(path: str) -> bool:
    """Whether a CSV file is a gzip stream (by its name), which cannot be entered at an offset:
    it is read whole, by one worker, never split into ranges."""
    return path.lower().endswith(".gz")


def resolve_reference(reference: str, base_folder: str) -> str:
    """A path written in a CSV cell, resolved against the CSV's folder unless it is absolute.

    Against an object-store folder, `.` and `..` segments are resolved here, as in a URL
    (`gs://b/tables` + `../images/x.jpg` -> `gs://b/images/x.jpg`): object stores have no
    folders to resolve them. Locally the system resolves them when the file is opened, through
    symbolic links as the user's shell would.
    """
    if reference.startswith("/") or has_scheme(reference):
        return reference
    if base_folder in ("", "."):
        return reference
    joined = base_folder.rstrip("/") + "/" + reference
    return _without_dot_segments(joined) if has_scheme(base_folder) else joined


def _without_dot_segments(url: str) -> str:
    """`scheme://bucket/key` with the key's `.` and `..` segments removed (RFC 3986, 5.2.4),
    never above the bucket. Empty segments stay: `a//b` is a valid object name."""
    scheme, _, after = url.partition("://")
    bucket, _, key = after.partition("/")
    kept: list[str] = []
    for segment in key.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    return f"{scheme}://{bucket}/" + "/".join(kept)


def parent_folder(path: str) -> str:
    """The folder holding `path` (`gs://b/x/y.csv` -> `gs://b/x`)."""
    head = path.rsplit("/", 1)[0] if "/" in path else "."
    return head if head and not head.endswith(":/") else path
