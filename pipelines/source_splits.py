"""Splits the inputs name themselves: split folders, sources named like splits, SOURCE=SPLIT.

Decided before the pipeline is built, from the first level of each folder source, so that a
mix with `--splits` or `--split-column` is a usage error and never a silent merge.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files.filenames import display, from_os, to_os
from recordforge.transforms.core.files.paths import has_scheme, is_hidden, relative_path
from recordforge.transforms.core.files.walk import is_glob
from recordforge.transforms.core.planning.splits import (
    SplitNameClash,
    describe_folders,
    ordered_splits,
    split_folders,
    split_of_name,
)
from recordforge.transforms.core.records import Source
from recordforge.transforms.listing import list_files

LOGGER = logging.getLogger("recordforge")

_CSV_SUFFIXES = (".csv.gz", ".csv")


@dataclass(frozen=True)
class SourceSplits:
    """What the inputs say about splits.

    Attributes:
        sources: the sources, each with its split or split folders filled in.
        splits: the split names, in manifest order; () when the inputs name none.
        note: how the splits were found, for the summary, `plan` and the manifest ("" if not).
        by_source: {source as typed: split, or {folder: split}} for the manifest's options.
    """

    sources: tuple[Source, ...]
    splits: tuple[str, ...] = ()
    note: str = ""
    by_source: dict | None = None


def resolve_source_splits(
    sources: Sequence[Source],
    *,
    ratio_splits: bool,
    split_column: bool,
    follow_symlinks: bool = False,
) -> SourceSplits:
    """Find the splits the inputs name: SOURCE=SPLIT, split folders (root/<split>/<class>/...),
    or the sources' own names when they name two splits or more (data/train data/test,
    train.csv test.csv).

    Raises:
        UsageError: splits named so together with --splits or --split-column; some sources
            with a split and others without; two split folders naming one split.
    """
    resolved, how = [], set()
    for source in sources:
        if source.split is not None:
            how.add("names given on the command line")
        elif _is_folder_source(source):
            mapping = _split_folders_of(source, follow_symlinks)
            if mapping:
                source = source._replace(split_folders=tuple(sorted(mapping.items())))
                how.add("split folders")
        resolved.append(source)
    option = "--splits" if ratio_splits else "--split-column" if split_column else None
    if how and option:
        first = next(s for s in resolved if s.split or s.split_folders)
        kind = "names its split" if first.split else "has split folders"
        remedy = f"drop {option}" + (" to keep them" if first.split_folders else " or =SPLIT")
        raise UsageError(
            f"{option} cannot be combined with inputs that name their splits ({first.given!r} "
            f"{kind}): {remedy}"
        )
    unnamed = [s for s in resolved if not s.split and not s.split_folders]
    by_name = {s.index: _split_of_source_name(s) for s in unnamed}
    named = {index: split for index, split in by_name.items() if split}
    if named and option:
        if len(set(named.values())) > 1:
            shown = ", ".join(
                f"{s.given!r} ({named[s.index]})" for s in unnamed if s.index in named
            )
            raise UsageError(
                f"the inputs are named like different splits ({shown}): {option} would merge "
                "them; drop it to keep each as its split, or rename them"
            )
        named = {}  # one input that happens to be called `test`: --splits divides it
    if len(set(named.values())) < 2:
        # One input called `train` (or `test`) alone, or several named alike: nothing to keep
        # apart, and such a run converts as it always did.
        named = {}
    if named:
        resolved = [s._replace(split=named[s.index]) if s.index in named else s for s in resolved]
        how.add("the inputs' names")
    if not how:
        return SourceSplits(tuple(resolved))
    without = [s for s in resolved if not s.split and not s.split_folders]
    if without:
        raise UsageError(
            f"{without[0].given!r} has no split while other inputs name theirs: give it one "
            f"with {without[0].given}=SPLIT (never merged silently)"
        )
    splits = ordered_splits(
        {s.split for s in resolved if s.split}
        | {split for s in resolved for _, split in s.split_folders}
    )
    return SourceSplits(tuple(resolved), splits, _note(resolved, sorted(how)), _by_source(resolved))


def check_class_names(sources: Sequence[Source], follow_symlinks: bool = False) -> None:
    """Refuse class folders of one local source whose names are shown alike.

    A class is named by its folder's name as shown (core.files.filenames.display: a byte that
    is not UTF-8 as `\\xf6`), so a folder named `d<0xf6>g` and one literally named `d\\xf6g`
    would be one class.

    Raises:
        UsageError: naming the name both are shown as.
    """
    for source in sources:
        if not _is_folder_source(source) or has_scheme(source.root):
            continue
        parents = [source.root + "/" + folder for folder, _ in source.split_folders] or [
            source.root
        ]
        for parent in parents:
            shown: dict[str, str] = {}
            for name in _first_level_folders(parent, follow_symlinks):
                other = shown.setdefault(display(name), name)
                if other != name:
                    raise UsageError(
                        f"input {source.given!r}: two class folders are both shown as "
                        f"{display(name)!r} (one name is not UTF-8, the other spells its "
                        "escape), so their images would be one class: rename one"
                    )


def _is_folder_source(source: Source) -> bool:
    return source.kind == "images" and source.pattern == source.root + "/**"


def _split_folders_of(source: Source, follow_symlinks: bool) -> dict[str, str] | None:
    names = _first_level_folders(source.root, follow_symlinks)
    try:
        mapping = split_folders(names)
    except SplitNameClash as error:
        raise UsageError(f"input {source.given!r}: {error}") from None
    if mapping is None:
        looks_split = sorted(n for n in names if split_of_name(n))
        if len(looks_split) > 1:
            others = sorted(set(names) - set(looks_split))
            LOGGER.warning(
                "%s: the folders %s look like splits, but %s not: the tree is read as one source "
                "and its split folders are not kept apart; to keep them apart, give each as "
                "SOURCE=SPLIT (%s/%s=%s)",
                source.given,
                ", ".join(looks_split),
                ", ".join(others[:3]) + (" are" if len(others) > 1 else " is"),
                source.given.rstrip("/"),
                looks_split[0],
                split_of_name(looks_split[0]),
            )
    return mapping


def _first_level_folders(root: str, follow_symlinks: bool) -> list[str]:
    """The names of the visible folders directly in `root` (links to folders only when
    followed). On object stores, the first path component of every object in a folder: that
    lists the source once more (the pipeline lists it again)."""
    if has_scheme(root):
        found = {
            relative_path(path, root).split("/", 1)[0]
            for path in list_files(root.rstrip("/") + "/**")
            if "/" in relative_path(path, root)
        }
        return sorted(name for name in found if not is_hidden(name))
    try:
        with os.scandir(to_os(root)) as entries:
            return sorted(
                from_os(entry.name)
                for entry in entries
                if not is_hidden(entry.name) and _is_dir(entry, follow_symlinks)
            )
    except OSError:
        return []  # the listing reports an unreadable folder itself


def _is_dir(entry: os.DirEntry, follow_symlinks: bool) -> bool:
    try:
        return entry.is_dir(follow_symlinks=follow_symlinks)
    except OSError:
        return False


def _split_of_source_name(source: Source) -> str | None:
    """The split a folder source or a CSV file is named after (data/val, test.csv), or None."""
    if source.kind == "images" and not _is_folder_source(source):
        return None  # an image file called test.jpg is not a split
    if source.kind == "csv" and is_glob(source.pattern):
        return None
    name = source.pattern.rstrip("/").removesuffix("/**").rsplit("/", 1)[-1]
    for suffix in _CSV_SUFFIXES:
        if source.kind == "csv" and name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return split_of_name(name)


def _note(sources: Sequence[Source], how: Sequence[str]) -> str:
    """`splits from split folders in data (root/<split>/<class>/…): train, validation ← val/`,
    or `splits from the inputs' names: train ← data/train, test ← data/test`."""
    if len(sources) == 1 and sources[0].split_folders:
        folders = describe_folders(dict(sources[0].split_folders))
        where = f"split folders in {sources[0].given} (root/<split>/<class>/…)"
        return f"splits from {where}: {folders}"
    parts = [
        f"{describe_folders(dict(s.split_folders))} (split folders in {s.given})"
        if s.split_folders
        else f"{s.split} ← {s.given}"
        for s in sources
    ]
    return f"splits from {' and '.join(how)}: {', '.join(parts)}"


def _by_source(sources: Sequence[Source]) -> dict:
    return {s.given: dict(s.split_folders) if s.split_folders else s.split for s in sources}
