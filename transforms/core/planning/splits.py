"""Splits named by the inputs themselves: split folders (root/<split>/<class>/<file>), a
source's own name (data/train, test.csv) or SOURCE=SPLIT on the command line.

Split folder names follow TensorFlow Datasets' split names: `train`, `validation` and `test`
(tfds.Split). The other usual spellings of a validation set (`val`, `valid`, `dev`, `eval`)
become `validation`, as TFDS's own datasets name theirs (GLUE's and SQuAD's `dev` files are
its `validation` splits). Names are matched without regard to case.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Folder (or file) name, lower case → the split it names.
SPLIT_NAMES: Mapping[str, str] = {
    "train": "train",
    "validation": "validation",
    "val": "validation",
    "valid": "validation",
    "dev": "validation",
    "eval": "validation",
    "test": "test",
}
# Canonical splits in the order manifests and summaries list them.
SPLIT_ORDER = ("train", "validation", "test")


class SplitNameClash(ValueError):
    """Two folders (or sources) name the same split, e.g. `val` and `dev`: they would merge."""


def split_of_name(name: str) -> str | None:
    """The split a folder or file name stands for (`Val` → validation), or None."""
    return SPLIT_NAMES.get(name.lower())


def split_folders(names: Iterable[str]) -> dict[str, str] | None:
    """{folder name: split} when every name (the first-level folders of a source) is a split
    name, else None (no folders at all is None too).

    Raises:
        SplitNameClash: two folders name the same split (`val/` and `dev/`).
    """
    names = sorted(names)
    if not names or any(split_of_name(name) is None for name in names):
        return None
    mapping: dict[str, str] = {}
    for name in names:
        split = split_of_name(name)
        other = next((n for n, s in mapping.items() if s == split), None)
        if other is not None:
            raise SplitNameClash(
                f"folders {other!r} and {name!r} both name the {split} split; rename one"
            )
        mapping[name] = split
    return mapping


def ordered_splits(splits: Iterable[str]) -> tuple[str, ...]:
    """Split names in manifest order: train, validation, test, then others sorted."""
    splits = set(splits)
    known = [s for s in SPLIT_ORDER if s in splits]
    return (*known, *sorted(splits - set(known)))


def describe_folders(mapping: Mapping[str, str]) -> str:
    """`train ← train/, validation ← val/` (folders whose name is not the split's shown)."""
    by_split = {split: folder for folder, split in mapping.items()}
    return ", ".join(
        split if by_split[split] == split else f"{split} ← {by_split[split]}/"
        for split in ordered_splits(by_split)
    )
