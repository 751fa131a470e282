"""The entry point of FnApiRunner's worker processes (`python -m recordforge.worker`).

Each worker process of a multi-process run (`--direct_num_workers=N
--direct_running_mode=multi_processing`) runs Beam's SDK worker, after making the modules a
conversion never uses unimportable (recordforge/lean_imports.py; docs/performance.md has the
cost). The output does not depend on it: the same DoFns run on the same elements.

With `--fork-server` it is the fork server of recordforge/worker_forks.py instead: it imports
Beam's SDK worker and recordforge's transforms once and forks each worker from itself.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from recordforge.lean_imports import UNUSED_IN_WORKERS, loading_without_collections, refuse
from recordforge.worker_forks import FORK_SERVER_FLAG, serve


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    refuse(UNUSED_IN_WORKERS)
    fork_server = FORK_SERVER_FLAG in argv[1:]
    with loading_without_collections():
        from recordforge.transforms.internals import import_sdk_worker, run_sdk_worker

        import_sdk_worker()
        if fork_server:
            _import_transforms()
    if not fork_server:
        run_sdk_worker(argv)
        return
    serve(lambda: run_sdk_worker([argv[0]]))


def _import_transforms() -> None:
    """Import every module of recordforge.transforms: the DoFns a worker unpickles are there."""
    import recordforge.transforms as transforms

    for module in pkgutil.walk_packages(transforms.__path__, "recordforge.transforms."):
        importlib.import_module(module.name)


if __name__ == "__main__":
    main()
