"""Modules that recordforge's own processes refuse to import because a conversion never uses them.

`import apache_beam` pulls in every connector Beam ships whose client library happens to be
installed (BigQuery, Pub/Sub), pandas (for its DataFrame type hints) and the Dataflow
API client (through its runners' module), whether or not a run uses them: a large part of the
second that importing Beam costs (docs/performance.md). Beam imports each of them inside
`try: ... except ImportError`, so a process that refuses them loses nothing it uses.

Only processes recordforge owns refuse anything: FnApiRunner's worker processes and their fork
server (recordforge/worker.py) and the `recordforge` program (recordforge/command.py). A user's
own process that imports recordforge as a library keeps every module it has. Google Cloud
Storage always stays importable: a local run may read `gs://` inputs, named on the command line
or inside a CSV file.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import sys
from collections.abc import Iterator, Sequence

# Each top-level name refuses its submodules too. Where Beam imports each, inside try blocks:
_CONNECTORS = (
    "google.cloud.bigquery",  # apache_beam/io/__init__.py, with Pub/Sub in one try block
    "google.cloud.pubsub",
    "google.cloud.pubsub_v1",
)
# Not refused: pymongo (apache_beam/io/mongodbio.py), whose absence Beam reports with a warning
# on every start.
# apache_beam/typehints/__init__.py: pandas type compatibility; no recordforge DoFn handles a
# DataFrame (pipelines/tables.py stages a DataFrame given to the Python API as CSV).
_DATAFRAMES = ("pandas",)
# apache_beam/runners/dataflow/dataflow_runner.py; a run on Dataflow needs it in its launcher.
_DATAFLOW_CLIENT = ("google.cloud.dataflow", "google.cloud.dataflow_v1beta3")

UNUSED_IN_WORKERS = _CONNECTORS + _DATAFRAMES + _DATAFLOW_CLIENT


class RefuseImports(importlib.abc.MetaPathFinder):
    """A finder, first on sys.meta_path, that makes the named modules (and their submodules)
    raise ModuleNotFoundError, as if they were not installed."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        name = fullname
        while name:
            if name in self._names:
                raise ModuleNotFoundError(
                    f"No module named {fullname!r} (not used in this recordforge process)",
                    name=fullname,
                )
            name = name.rpartition(".")[0]
        return None


def refuse(names: Sequence[str]) -> None:
    """Refuse `names` in this process from now on (modules already imported stay)."""
    sys.meta_path.insert(0, RefuseImports(names))


def unused_by_command(argv: Sequence[str]) -> tuple[str, ...]:
    """What the `recordforge` program started with `argv` never imports: what its workers
    refuse, except the Dataflow client when the arguments name a Dataflow runner."""
    if any("dataflow" in arg.lower() for arg in argv):
        return _CONNECTORS + _DATAFRAMES
    return UNUSED_IN_WORKERS


@contextlib.contextmanager
def loading_without_collections() -> Iterator[None]:
    """Load modules with the garbage collector off, then freeze what was loaded.

    Loading Beam makes hundreds of thousands of objects and no garbage, and the collector
    walks them again at every collection of its older generations: most of the collector's
    time in a run is spent while modules load (docs/performance.md, "Start-up: the garbage
    collector"). After the block, everything alive is moved out of every later collection
    (`gc.freeze`): modules live as long as the process, and in the workers' fork server the
    forked children then leave those pages shared (CPython's gc docs recommend it before a
    fork). For recordforge's own processes only, as `refuse`.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
