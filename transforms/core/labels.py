"""Class labels: which sources are labelled, and the sorted class names that give label ids."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

LABEL_MODES = ("auto", "folder", "none")


@dataclass
class LabelTally:
    """What the good candidates say about labels (a mergeable combiner accumulator).

    Attributes:
        depths: per folder source, the (shallowest, deepest) file depth below its root.
        names: per source, the label texts seen (class folder names, or CSV label texts).
    """

    depths: dict[int, tuple[int, int]] = field(default_factory=dict)
    names: dict[int, set[str]] = field(default_factory=dict)

    def add(self, source: int, depth: int | None, label: str | int | None) -> None:
        if depth is not None:
            low, high = self.depths.get(source, (depth, depth))
            self.depths[source] = (min(low, depth), max(high, depth))
        if isinstance(label, str):
            self.names.setdefault(source, set()).add(label)

    def merge(self, other: LabelTally) -> LabelTally:
        for source, (low, high) in other.depths.items():
            mine = self.depths.get(source, (low, high))
            self.depths[source] = (min(mine[0], low), max(mine[1], high))
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
    """

    names: tuple[str, ...] = ()
    labelled_sources: frozenset[int] = frozenset()
    note: str = ""

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
) -> LabelMap:
    """Decide which sources are labelled and number the class names.

    Folder sources are labelled in mode "folder"; in mode "auto" when every file of every folder
    source sits exactly one folder below its root (root/<class>/<file>); never in mode "none".
    CSV sources are labelled when a label column is given.
    """
    folder_sources, labelled = sorted(folder_sources), set()
    note = ""
    if mode == "folder":
        labelled.update(folder_sources)
        note = "labels from the first folder level below each source (--labels folder)"
    elif mode == "auto" and folder_sources:
        shapes = [tally.depths.get(s) for s in folder_sources]
        if all(shape == (1, 1) for shape in shapes if shape is not None) and any(shapes):
            labelled.update(folder_sources)
            note = "labels from class folders (every image is in root/<class>/<file>)"
        elif any(shapes):
            note = (
                "no labels: not every image is in root/<class>/<file>; use --labels folder to "
                "take the first folder level as the class"
            )
    if csv_labelled:
        labelled.update(csv_sources)
    names = sorted({name for s in labelled for name in tally.names.get(s, ())})
    return LabelMap(tuple(names), frozenset(labelled), note)


def named_counts(counts: Mapping[int, int], names: Sequence[str]) -> dict[str, int]:
    """{class id: records} → {class name: records} in id order, every named class included
    (0 when absent); ids without a name (numeric labels) as text, in numeric order."""
    named = {name: counts.get(index, 0) for index, name in enumerate(names)}
    rest = sorted(index for index in counts if not 0 <= index < len(names))
    return {**named, **{str(index): counts[index] for index in rest}}
