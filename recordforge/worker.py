"""The entry point of FnApiRunner's worker processes (`python -m recordforge.worker`).

Each worker process of a multi-process run (`--direct_num_workers=N
--direct_running_mode=multi_processing`) is a fresh interpreter, and `import apache_beam` pulls
in every connector Beam ships whose client library happens to be installed (BigQuery, Pub/Sub,
MongoDB) and pandas, for its DataFrame type hints; a conversion's workers use none of them.
Beam imports each of them inside `try: ... except ImportError`, so this entry point makes them
unimportable in the worker before Beam's SDK worker starts (docs/performance.md has the cost).
The output does not depend on it: the same DoFns run on the same elements.

Google Cloud Storage stays importable: a local run may read `gs://` inputs.

With `--fork-server` it is the fork server of recordforge/worker_forks.py instead: it imports
Beam's SDK worker and recordforge's transforms once and forks each worker from itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import pkgutil
import sys

from recordforge.worker_forks import FORK_SERVER_FLAG, serve

# Top-level names of modules a worker refuses to import, and why each is safe to refuse:
# Beam's package imports them only inside `try: ... except ImportError` blocks.
UNUSED_IN_WORKERS = (
    # apache_beam/io/__init__.py: the BigQuery and Pub/Sub connectors (one try block).
    "google.cloud.bigquery",
    "google.cloud.pubsub",
    "google.cloud.pubsub_v1",
    # apache_beam/typehints/__init__.py: pandas type compatibility; no recordforge DoFn
    # handles a DataFrame (pipelines/tables.py stages DataFrames as CSV in the launcher).
    "pandas",
)


class RefuseImports(importlib.abc.MetaPathFinder):
    """A finder, first on sys.meta_path, that makes the named modules (and their submodules)
    raise ModuleNotFoundError, as if they were not installed."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        name = fullname
        while name:
            if name in self._names:
                raise ModuleNotFoundError(
                    f"No module named {fullname!r} (not used in recordforge's workers)",
                    name=fullname,
                )
            name = name.rpartition(".")[0]
        return None


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    sys.meta_path.insert(0, RefuseImports(UNUSED_IN_WORKERS))
    from recordforge.transforms.internals import run_sdk_worker

    if FORK_SERVER_FLAG not in argv[1:]:
        run_sdk_worker(argv)
        return
    from recordforge.transforms.internals import import_sdk_worker

    import_sdk_worker()
    _import_transforms()
    serve(lambda: run_sdk_worker([argv[0]]))


def _import_transforms() -> None:
    """Import every module of recordforge.transforms: the DoFns a worker unpickles are there."""
    import recordforge.transforms as transforms

    for module in pkgutil.walk_packages(transforms.__path__, "recordforge.transforms."):
        importlib.import_module(module.name)


if __name__ == "__main__":
    main()
