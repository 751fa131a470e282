"""Which source owns a file that several reach: the same folder given twice, a folder and its
sub-folder, a link to a file another source holds.

A file is converted once. Its owner is the source that reaches it *directly* (by its real path,
through no link) and ranks first: folder sources before globs before single files, then the
outermost root (so `photos photos/cat` labels cat's files from `photos`, as a class folder), then
the first on the command line. Every other way to it is a duplicate, counted in the manifest.
Whether a source reaches a path directly depends on the source alone (its real root, its glob
and hidden files), so each worker decides it for the files it lists, without a shuffle. Files
reached only through links are ranked the same way, among themselves (transforms.discover).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from recordforge.transforms.core.files.filenames import from_os, to_os
from recordforge.transforms.core.files.paths import glob_root, has_scheme, is_hidden
from recordforge.transforms.core.files.walk import closure, is_glob, segment_matches
from recordforge.transforms.core.records import Source

_KIND_ORDER = {"folder": 0, "glob": 1, "file": 2}


@dataclass(frozen=True)
class Reach:
    """What one source reaches directly.

    Attributes:
        index: the source's position on the command line.
        kind: "folder" (`root/**`), "glob" or "file".
        root: the real path (or URL) of its folder; of the file itself for a single file.
        segments: a glob's pattern below `root`, split at '/'.
    """

    index: int
    kind: str
    root: str
    segments: tuple[str, ...] = ()

    @property
    def rank(self) -> tuple[int, int, int]:
        return (_KIND_ORDER[self.kind], len(self.root), self.index)

    def overlaps(self, other: Reach) -> bool:
        """Whether the two could reach a file in common (one root lies within the other)."""
        return _within(self.root, other.root) or _within(other.root, self.root)

    def reaches(self, real: str) -> bool:
        """Whether this source reaches the file at real path (or URL) `real` directly."""
        return self.covers(real) and (
            self.kind == "file" or not is_hidden(real[len(self.root) :].lstrip("/"))
        )

    def covers(self, real: str) -> bool:
        """Whether this source's walk meets the path `real` (hidden or not), so that it
        reports what is there: the entries a rival ranked after it must leave alone."""
        if self.kind == "file":
            return real == self.root
        if not _within(real, self.root) or real == self.root:
            return False
        relative = real[len(self.root) :].lstrip("/")
        if self.kind == "folder":
            return True
        states = closure(self.segments, frozenset({0}))
        parts = relative.split("/")
        for name in parts:
            reached = set()
            for position in states:
                if position >= len(self.segments):
                    continue
                segment = self.segments[position]
                if segment == "**":
                    if not name.startswith("."):
                        reached.add(position)
                elif segment_matches(segment, name):
                    reached.add(position + 1)
            states = closure(self.segments, frozenset(reached))
            if not states:
                return False
        return len(self.segments) in states


def reach_of(source: Source) -> Reach:
    """A source's direct reach, its root's links resolved (on the machine that lists it)."""
    pattern = source.pattern
    if pattern.endswith("/**") and not is_glob(pattern[:-3]):
        return Reach(source.index, "folder", _real(pattern[:-3]))
    if is_glob(pattern):
        root = glob_root(pattern)
        segments = tuple(pattern[len(root) :].lstrip("/").split("/"))
        return Reach(source.index, "glob", _real(root), segments)
    return Reach(source.index, "file", _real(pattern))


class Owners:
    """The direct reaches of a run's sources, to decide which source owns a file."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self._reaches = {source.index: reach_of(source) for source in sources}

    def reach(self, index: int) -> Reach:
        return self._reaches[index]

    def rivals(self, index: int) -> list[Reach]:
        """The sources ranked before `index` that may reach some of its files directly."""
        mine = self._reaches[index]
        return [r for r in self._reaches.values() if r.rank < mine.rank and r.overlaps(mine)]

    def reached_directly(self, real: str) -> bool:
        """Whether any source reaches the file at `real` directly."""
        return any(reach.reaches(real) for reach in self._reaches.values())


def _real(path: str) -> str:
    if has_scheme(path):
        return path.rstrip("/")
    return from_os(os.path.realpath(to_os(path)))


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root if root.endswith("/") else root + "/")
