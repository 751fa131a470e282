"""Walking a local source: its files, and everything met that cannot be an input, reported.

A walk never opens a file (only folders, to list them) and never follows a symbolic link to a
folder unless asked to; then it visits each real folder once, so link loops end. Entries:

- FILE: a regular file (or a link to one, or a broken link, which the probe reports as a
  missing file). `real` is set when the file was reached through a link: where it leads.
- HIDDEN: a file inside the source whose path has a component starting with a dot (counted in
  the manifest, not converted).
- PROBLEM: what is not an input but must not vanish without a word: a FIFO, socket or device
  (never opened: opening a FIFO waits for a writer), a folder that cannot be read, a path too
  long to open, a link leading outside the allowed roots. `error` holds (kind, message).
- FOLDER_LINK: a symbolic link to a folder, not followed (or leading to a folder already
  walked: a loop, or a second way to it). Counted in the manifest.

Names that are not UTF-8 come out as pipeline text (transforms.core.files.filenames).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from recordforge.transforms.core.files.confine import is_within
from recordforge.transforms.core.files.filenames import display, from_os, to_os
from recordforge.transforms.core.files.paths import glob_root, has_glob, has_scheme

FILE = "file"
HIDDEN = "hidden"
PROBLEM = "problem"
FOLDER_LINK = "folder_link"


class Listed(NamedTuple):
    """One entry of a walk (see the module's docstring)."""

    kind: str
    path: str
    real: str | None = None
    error: tuple[str, str] | None = None


def is_glob(pattern: str) -> bool:
    """Whether a source is a glob: it has glob characters and, when local, names no existing
    file or folder as it is (`photos [2024]` is a folder's name before it is a glob)."""
    if not has_glob(pattern):
        return False
    return has_scheme(pattern) or not os.path.lexists(to_os(pattern))


def walk_pattern(
    pattern: str,
    *,
    follow_symlinks: bool = False,
    allowed_roots: Sequence[str] = (),
    limit: int | None = None,
) -> Iterator[Listed]:
    """The entries a local pattern names: `root/**` (a folder), a glob, or one file's path.

    `limit` stops the walk after about that many entries (a quick look, as preflight takes).
    """
    if pattern.endswith("/**") and not is_glob(pattern[:-3]):
        segments: tuple[str, ...] | None = None
        root = pattern[:-3]
    elif is_glob(pattern):
        root = glob_root(pattern)
        segments = tuple(pattern[len(root) :].lstrip("/").split("/"))
    else:
        yield from _one_file(pattern, allowed_roots)
        return
    walker = _Walker(root, segments, follow_symlinks, tuple(allowed_roots), limit)
    yield from walker.walk()


def _one_file(path: str, allowed_roots: Sequence[str]) -> Iterator[Listed]:
    os_path = to_os(path)
    try:
        info = os.stat(os_path)
    except FileNotFoundError:
        if os.path.islink(os_path):
            yield Listed(FILE, path)  # a broken link: the probe says so
        return
    except OSError as error:
        yield Listed(PROBLEM, path, error=_unreadable(path, error, folder=False))
        return
    if stat.S_ISDIR(info.st_mode):
        return
    linked = os.path.islink(os_path)
    real = from_os(os.path.realpath(os_path)) if linked else None
    if not stat.S_ISREG(info.st_mode):
        yield Listed(PROBLEM, path, error=_not_regular(path, info.st_mode))
    elif linked and allowed_roots and not is_within(real, allowed_roots):
        yield Listed(PROBLEM, path, error=_outside(path, real, allowed_roots))
    else:
        yield Listed(FILE, path, real=real)


class _Walker:
    """One walk: the real tree first, then (when following links) the linked folders."""

    def __init__(
        self,
        root: str,
        segments: tuple[str, ...] | None,
        follow: bool,
        allowed_roots: tuple[str, ...],
        limit: int | None,
    ) -> None:
        self._root = root.rstrip("/") or "/"
        self._segments = segments
        self._follow = follow
        self._allowed = allowed_roots
        self._limit = limit
        self._count = 0
        self._visited: set[tuple[int, int]] = set()  # real folders walked (following links)
        self._links: list[tuple[str, frozenset[int] | None]] = []  # folder links met

    def walk(self) -> Iterator[Listed]:
        start = self._states_after_root()
        if start is None:
            return
        if self._follow:
            self._remember(self._root)
        yield from self._folder(self._root, None, start, hidden=False)
        if not self._follow:
            return
        # Linked folders after the whole real tree: a file is reached by its real path first.
        while self._links and not self._full():
            links, self._links = self._links, []
            for path, states in sorted(links, key=lambda link: link[0]):
                yield from self._linked_folder(path, states)

    def _full(self) -> bool:
        return self._limit is not None and self._count >= self._limit

    def _states_after_root(self) -> frozenset[int] | None:
        if self._segments is None:
            return frozenset()  # not a glob: everything below the root
        return closure(self._segments, frozenset({0}))

    def _remember(self, folder: str) -> bool:
        """Note a real folder as walked; False when it was already."""
        try:
            info = os.stat(to_os(folder))
        except OSError:
            return True
        key = (info.st_dev, info.st_ino)
        if key in self._visited:
            return False
        self._visited.add(key)
        return True

    def _linked_folder(self, path: str, states: frozenset[int] | None) -> Iterator[Listed]:
        os_path = to_os(path)
        real = from_os(os.path.realpath(os_path))
        if self._allowed and not is_within(real, self._allowed):
            yield Listed(PROBLEM, path, error=_outside(path, real, self._allowed))
            return
        if not self._remember(path):
            yield Listed(FOLDER_LINK, path)  # a loop, or a folder reached before
            return
        yield from self._folder(path, real, states, hidden=False)

    def _folder(
        self, folder: str, real: str | None, states: frozenset[int] | None, hidden: bool
    ) -> Iterator[Listed]:
        """The entries of one folder and those below it, depth first, sorted by name.

        `real`: where the folder really is, when reached through a link (None: in the real
        tree). `states`: for a glob, the pattern positions this folder has reached.
        """
        try:
            with os.scandir(to_os(folder)) as found:
                entries = sorted(found, key=lambda entry: entry.name)
        except OSError as error:
            if not hidden:
                yield Listed(PROBLEM, folder, error=_unreadable(folder, error, folder=True))
            return
        for entry in entries:
            if self._full():
                return
            name = from_os(entry.name)
            path = f"{folder}/{name}" if folder != "/" else f"/{name}"
            entry_hidden = hidden or name.startswith(".")
            entry_states = None
            if self._segments is not None:
                entry_states = self._advance(states, name)
                if not entry_states:
                    continue
            try:
                is_link = entry.is_symlink()
                is_dir = not is_link and entry.is_dir(follow_symlinks=False)
            except OSError as error:
                if not entry_hidden:
                    yield self._counted(Listed(PROBLEM, path, error=_unreadable(path, error)))
                continue
            linked_real = f"{real}/{name}" if real is not None else None
            if is_dir:
                if not self._may_match_below(entry_states):
                    continue
                if self._follow and not self._remember(path):
                    if not entry_hidden:
                        yield self._counted(Listed(FOLDER_LINK, path))
                    continue
                yield from self._folder(path, linked_real, entry_states, entry_hidden)
            elif is_link:
                yield from self._link(path, entry_states, entry_hidden)
            elif not self._matches(entry_states):
                continue
            elif entry_hidden:
                yield self._counted(Listed(HIDDEN, path))
            elif entry.is_file(follow_symlinks=False):
                yield self._counted(Listed(FILE, path, real=linked_real))
            else:
                mode = _lstat_mode(entry)
                yield self._counted(Listed(PROBLEM, path, error=_not_regular(path, mode)))

    def _link(self, path: str, states: frozenset[int] | None, hidden: bool) -> Iterator[Listed]:
        os_path = to_os(path)
        try:
            info = os.stat(os_path)
        except FileNotFoundError:
            if self._matches(states):  # a broken link: the probe reports it as missing
                yield self._counted(Listed(HIDDEN if hidden else FILE, path))
            return
        except OSError as error:
            if not hidden and self._matches(states):
                yield self._counted(Listed(PROBLEM, path, error=_unreadable(path, error)))
            return
        if stat.S_ISDIR(info.st_mode):
            if hidden:
                return
            if not self._may_match_below(states):
                return
            if self._follow:
                self._links.append((path, states))
            else:
                yield self._counted(Listed(FOLDER_LINK, path))
            return
        if not self._matches(states):
            return
        if hidden:
            yield self._counted(Listed(HIDDEN, path))
            return
        real = from_os(os.path.realpath(os_path))
        if not stat.S_ISREG(info.st_mode):
            yield self._counted(Listed(PROBLEM, path, error=_not_regular(path, info.st_mode)))
        elif self._allowed and not is_within(real, self._allowed):
            yield self._counted(Listed(PROBLEM, path, error=_outside(path, real, self._allowed)))
        else:
            yield self._counted(Listed(FILE, path, real=real))

    def _counted(self, entry: Listed) -> Listed:
        self._count += 1
        return entry

    def _advance(self, states: frozenset[int] | None, name: str) -> frozenset[int]:
        """The glob positions reached after `name` (an entry of a folder at `states`)."""
        segments = self._segments
        reached = set()
        for position in states or ():
            if position >= len(segments):
                continue
            segment = segments[position]
            if segment == "**":
                if not name.startswith("."):
                    reached.add(position)  # ** goes on below a (visible) folder
                continue
            if segment_matches(segment, name):
                reached.add(position + 1)
        return closure(segments, frozenset(reached))

    def _may_match_below(self, states: frozenset[int] | None) -> bool:
        """Whether a folder at these glob positions may hold matches (always, outside a glob)."""
        return self._segments is None or any(s < len(self._segments) for s in states)

    def _matches(self, states: frozenset[int] | None) -> bool:
        """Whether a file at these glob positions is matched (always, outside a glob)."""
        return self._segments is None or len(self._segments) in states


def closure(segments: tuple[str, ...], states: frozenset[int]) -> frozenset[int]:
    """`**` matches no folder too: a position at `**` also stands at the one after it."""
    result = set(states)
    for position in sorted(states):
        while position < len(segments) and segments[position] == "**":
            position += 1
            result.add(position)
    return frozenset(result)


def segment_matches(segment: str, name: str) -> bool:
    # As the glob module does: a wildcard does not match a leading dot (hidden names) unless the
    # pattern starts with one; a segment without wildcards matches its own name only.
    if not has_glob(segment):
        return segment == name
    if name.startswith(".") and not segment.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, segment)


def _lstat_mode(entry: os.DirEntry) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return 0


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular(path: str, mode: int) -> tuple[str, str]:
    what = next((name for test, name in _SPECIAL_KINDS if test(mode)), "not a regular file")
    return (
        "NotARegularFile",
        f"{display(path)} is {what}, not a regular file; not opened",
    )


def _unreadable(path: str, error: OSError, folder: bool = False) -> tuple[str, str]:
    if error.errno == errno.ENAMETOOLONG:
        return (
            "PathTooLong",
            f"the path {display(path)} is longer than this system allows "
            f"({len(to_os(path).encode('utf-8', 'surrogateescape')):,} bytes); "
            "files below it cannot be opened",
        )
    what = "folder" if folder else "file"
    reason = error.strerror or type(error).__name__
    return (
        "UnreadableFolder" if folder else "UnreadableFile",
        f"cannot read the {what} {display(path)}: {reason}"
        + ("; the files in it were not converted" if folder else ""),
    )


def _outside(path: str, real: str, roots: Sequence[str]) -> tuple[str, str]:
    return (
        "OutsideAllowedRoot",
        f"{display(path)} is a link to {display(real)}, outside every --allowed-root "
        f"({', '.join(display(r) for r in roots)}); not followed",
    )
