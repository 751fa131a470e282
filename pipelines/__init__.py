"""recordforge's entry points: the CLI (pipelines.cli) and reading a converted dataset back.

`load(folder, split)` gives a tf.data.Dataset (TensorFlow is imported only when it is called);
`iterate(folder, split)` gives plain dicts without TensorFlow; `open_dataset(folder)` gives the
manifest and the shards. They are imported when first used, so the pure modules under this
package (`recordforge.pipelines.inspection`) import without Apache Beam.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "DatasetFolder": "recordforge.pipelines.dataset",
    "iterate": "recordforge.pipelines.dataset",
    "open_dataset": "recordforge.pipelines.dataset",
    "feature_spec": "recordforge.pipelines.tf_dataset",
    "load": "recordforge.pipelines.tf_dataset",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'recordforge.pipelines' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
