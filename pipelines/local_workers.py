"""How many worker processes a local conversion uses when the user does not say (`--workers`).

One process is faster on small inputs: a second one costs a fork server importing Beam and a
round trip to every worker at each of the pipeline's stages, which only enough payload work
pays for (docs/performance.md, "The default"). So a conversion of local images or CSV tables
uses one worker process per `BYTES_PER_WORKER` of input, as many as the cores this process may
run on, and this process alone below two. Only uncompressed CSV files count: a gzip file is
read whole, by one worker, and the images a table names are not counted (the measured gains
are those of tables read in ranges by several workers). Remote inputs (gs://) stay in this
process: their size is not known without listing them, which is the pipeline's first stage.

The choice changes no output byte: the same DoFns run on the same elements either way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from recordforge.transforms.core.files.filenames import absolute_local_path, to_os
from recordforge.transforms.core.files.paths import is_compressed_csv
from recordforge.transforms.core.files.walk import FILE, walk_pattern

if TYPE_CHECKING:
    from recordforge.transforms.core.records import Source

# Light to import (no numpy): the `recordforge` program asks `workers_for_folders` before it
# imports anything heavy (recordforge/command.py).

# Input bytes per worker process: below twice this, one process is faster (docs/performance.md).
BYTES_PER_WORKER = 512 * 2**20


@dataclass(frozen=True)
class LocalWorkers:
    """The choice: `count` processes (1: this process alone) and why, in words."""

    count: int
    reason: str


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def choose_local_workers(sources: Sequence[Source], cores: int | None = None) -> LocalWorkers:
    """The worker processes for a local conversion of `sources` on `cores` cores."""
    cores = usable_cores() if cores is None else cores
    if cores < 2:
        return LocalWorkers(1, "one core")
    if any("://" in source.pattern for source in sources):
        return LocalWorkers(1, "remote inputs")
    from recordforge.transforms.core.planning.sharding import human_size

    wanted = cores * BYTES_PER_WORKER
    found = input_bytes([source.pattern for source in sources], up_to=wanted)
    count = _count_for(found, cores)
    if count < 2:
        return LocalWorkers(1, f"{human_size(found)} of input")
    size = f"{human_size(found)} or more" if found >= wanted else human_size(found)
    return LocalWorkers(count, f"{size} of input, {cores} cores")


def workers_for_folders(
    folders: Sequence[str], cores: int | None = None, *, remember: bool = False
) -> int:
    """The worker processes `choose_local_workers` would choose for these local image folders
    (paths as typed). `remember`: keep the count for the conversion's own choice that follows
    (the next `input_bytes` of the same folders takes it), so a folder is not walked twice."""
    # Source.pattern of a folder, as pipelines/preflight.py makes it.
    patterns = tuple(f"{absolute_local_path(folder).rstrip('/')}/**" for folder in folders)
    return _workers_for(patterns, cores, remember)


def workers_for_tables(tables: Sequence[str], cores: int | None = None) -> int:
    """The worker processes `choose_local_workers` would choose for these local CSV files (paths
    as typed) alone: the program's guess before it imports Beam."""
    patterns = tuple(absolute_local_path(table) for table in tables)
    return _workers_for(patterns, cores, remember=False)


def _workers_for(patterns: tuple[str, ...], cores: int | None, remember: bool) -> int:
    cores = usable_cores() if cores is None else cores
    if cores < 2:
        return 1
    wanted = cores * BYTES_PER_WORKER
    found = input_bytes(patterns, up_to=wanted)
    if remember:
        _remembered[(patterns, wanted)] = found
    return max(1, _count_for(found, cores))


# The count `workers_for_folders(remember=True)` made, until the choice takes it.
_remembered: dict[tuple[tuple[str, ...], int], int] = {}


def _count_for(found: int, cores: int) -> int:
    return min(cores, found // BYTES_PER_WORKER)


def input_bytes(patterns: Sequence[str], up_to: int) -> int:
    """The bytes of the files the patterns (Source.pattern: `root/**` for a folder) name,
    counted until `up_to` is reached (the count then stops: a large folder is not listed twice
    in full). It walks as the conversion's listing does (core.files.walk: hidden files left
    out, folder links not followed, so link loops end); files that vanish or cannot be read are
    skipped."""
    remembered = _remembered.pop((tuple(patterns), up_to), None)
    if remembered is not None:
        return remembered
    total = 0
    for pattern in patterns:
        for entry in walk_pattern(pattern):
            if entry.kind != FILE or is_compressed_csv(entry.path):
                continue
            try:
                total += os.stat(to_os(entry.path)).st_size
            except OSError:
                continue
            if total >= up_to:
                return total
    return total


def chosen_in_words(workers: LocalWorkers) -> str:
    """How the summary says the choice was made."""
    if workers.count == 1:
        return f"chosen for {workers.reason}; --workers N runs N worker processes"
    return f"chosen for {workers.reason}; --workers 1 runs in this process"
