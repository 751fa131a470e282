"""Listing the files a source names: Beam FileSystems for object stores, a careful walk locally.

Locally this differs from Beam's LocalFileSystem.match on purpose, which silently drops files it
cannot stat (broken links) and folders it cannot read. The walk here reports every entry it
meets (transforms.core.files.walk): files, hidden files, broken links (to be reported as missing
files), and what cannot be an input (a FIFO, socket or device, never opened; a folder it cannot
read; a path too long to open; a link leading outside the allowed roots) as problems. Symbolic
links to folders are followed only when asked, each real folder once. Object stores have none
of these, and go through Beam FileSystems.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from recordforge.transforms.core.errors import ListingFailed
from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.core.files.walk import FILE, HIDDEN, Listed, walk_pattern


def list_entries(
    pattern: str,
    *,
    follow_symlinks: bool = False,
    allowed_roots: Sequence[str] = (),
    limit: int | None = None,
) -> Iterator[Listed]:
    """What a pattern names: a folder's `root/**`, a glob, or one file's path.

    Local entries come in walk order (sorted within each folder), remote ones sorted.
    """
    if has_scheme(pattern):
        yield from (Listed(FILE, path) for path in _match_remote(pattern, limit))
        return
    yield from walk_pattern(
        pattern, follow_symlinks=follow_symlinks, allowed_roots=allowed_roots, limit=limit
    )


def list_files(
    pattern: str, limit: int | None = None, *, follow_symlinks: bool = False
) -> list[str]:
    """The files a pattern matches, sorted, hidden ones and broken links included; what cannot
    be an input (see list_entries) left out."""
    files = []
    for entry in list_entries(pattern, follow_symlinks=follow_symlinks, limit=limit):
        if entry.kind in (FILE, HIDDEN):
            files.append(entry.path)
            if limit is not None and len(files) >= limit:
                break
    return sorted(files)


def _match_remote(pattern: str, limit: int | None) -> list[str]:
    """The objects `pattern` matches; ListingFailed when the store does not answer the listing
    (an empty answer here would be a source without inputs, or an output folder seen empty)."""
    try:
        (result,) = FileSystems.match([pattern], limits=[limit] if limit else None)
    except BeamIOError as error:
        cause: BaseException = error
        # Beam wraps the store's error (a 403, a 5xx its retries gave up on) once per layer.
        while isinstance(cause, BeamIOError) and cause.exception_details:
            cause = next(iter(cause.exception_details.values()))
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
        raise ListingFailed(f"cannot list {pattern}: {reason}") from None
    # Object stores may hold zero-byte "folder/" placeholder objects: not inputs.
    return sorted(m.path for m in result.metadata_list if not m.path.endswith("/"))
