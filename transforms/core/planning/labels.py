"""Class labels: which sources are labelled, and the sorted class names that give label ids."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

LABEL_MODES = ("auto", "folder", "none")
# What becomes of an image outside the class folders of a labelled folder source (root/<file>).
STRAY_FILE_MODES = ("error", "unlabeled")


@dataclass
class LabelTally:
    """What the good candidates say about labels (a mergeable combiner accumulator).

    Attributes:
        depths: per folder source, how many files lie (in the root, one folder below it,
            deeper): root/<file>, root/<class>/<file>, root/<class>/.../<file>.
        names: per source, the label texts seen (class folder names, or CSV label texts).
    """

    depths: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    names: dict[int, set[str]] = field(default_factory=dict)

    def add(self, source: int, depth: int | None, label: str | int | None, times: int = 1) -> None:
        if depth is not None:
            counts = list(self.depths.get(source, (0, 0, 0)))
            counts[min(depth, 2)] += times
            self.depths[source] = tuple(counts)
        if isinstance(label, str):
            self.names.setdefault(source, set()).add(label)

    def merge(self, other: LabelTally) -> LabelTally:
        for source, theirs in other.depths.items():
            mine = self.depths.get(source, (0, 0, 0))
            self.depths[source] = tuple(a + b for a, b in zip(mine, theirs, strict=True))
        for source, names in other.names.items():
            self.names.setdefault(source, set()).update(names)
        return self


class UnknownLabel(KeyError):
    """A class name that is not among the run's (LabelMap.names); the name is args[0]."""


@dataclass(frozen=True)
class LabelMap:
    """The resolved labels of a run: which sources carry labels, and the id of each class name.

    Attributes:
        names: class names in id order (sorted), or () when labels are numeric or absent.
        labelled_sources: indices of sources whose records get label features.
        note: why folder sources are (not) labelled, for the summary.
        unlabeled_strays: an image outside the class folders of a labelled folder source is
            converted without a label (else it is an error record, NoClassFolder).
    """

    names: tuple[str, ...] = ()
    labelled_sources: frozenset[int] = frozenset()
    note: str = ""
    unlabeled_strays: bool = False

    def id_of(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise UnknownLabel(name) from None

    @property
    def _ids(self) -> dict[str, int]:
        ids = self.__dict__.get("_ids_cache")
        if ids is None:
            ids = {name: index for index, name in enumerate(self.names)}
            object.__setattr__(self, "_ids_cache", ids)
        return ids


def resolve_labels(
    tally: LabelTally,
    folder_sources: Iterable[int],
    csv_sources: Iterable[int],
    mode: str,
    csv_labelled: bool,
    stray_files: str = "error",
) -> LabelMap:
    """Decide which sources are labelled and number the class names.

    Folder sources are labelled in mode "folder"; in mode "auto" when most files of every
    folder source sit exactly one folder below its root (root/<class>/<file>): a few files
    elsewhere do not take the others' labels away, they are error records of their own (or,
    with `stray_files` "unlabeled", records without a label) when in the root, and take their
    first folder as class when deeper; never in mode "none". CSV sources are labelled when a
    label column is given.
    """
    folder_sources, labelled = sorted(folder_sources), set()
    note = ""
    if mode == "folder":
        labelled.update(folder_sources)
        note = "labels from the first folder level below each source (--labels folder)"
    elif mode == "auto" and folder_sources:
        counts = [tally.depths[s] for s in folder_sources if s in tally.depths]
        root, level, deeper = (sum(c[position] for c in counts) for position in range(3))
        if counts and all(2 * c[1] > sum(c) for c in counts):
            labelled.update(folder_sources)
            note = _class_folder_note(root, level, deeper, stray_files)
        elif counts:
            note = (
                "no labels: not every image is in root/<class>/<file>; use --labels folder to "
                "take the first folder level as the class"
            )
            if level:
                note += (
                    f" (only {level:,} of {root + level + deeper:,} images are; class folders "
                    "need most of them)"
                )
    if csv_labelled:
        labelled.update(csv_sources)
    names = sorted({name for s in labelled for name in tally.names.get(s, ())})
    return LabelMap(tuple(names), frozenset(labelled), note, stray_files == "unlabeled")


def _class_folder_note(root: int, level: int, deeper: int, stray_files: str) -> str:
    if not root and not deeper:
        return "labels from class folders (every image is in root/<class>/<file>)"
    parts = [
        f"labels from class folders ({level:,} of {root + level + deeper:,} images are in "
        "root/<class>/<file>)"
    ]
    if root:
        fate = (
            "converted without a label (--stray-files unlabeled)"
            if stray_files == "unlabeled"
            else "error records (NoClassFolder; --stray-files unlabeled converts them)"
        )
        parts.append(f"{root:,} outside any class folder are {fate}")
    if deeper:
        parts.append(f"{deeper:,} deeper take their first folder as the class")
    return "; ".join(parts)


def named_counts(counts: Mapping[int, int], names: Sequence[str]) -> dict[str, int]:
    """{class id: records} → {class name: records} in id order, every named class included
    (0 when absent); ids without a name (numeric labels) as text, in numeric order."""
    named = {name: counts.get(index, 0) for index, name in enumerate(names)}
    rest = sorted(index for index in counts if not 0 <= index < len(names))
    return {**named, **{str(index): counts[index] for index in rest}}
