"""recordforge: image folders and CSV files into planned, sharded TFRecord datasets.

The subpackages are `recordforge.pipelines` (the CLI and the entry points), `recordforge.transforms`
(Beam transforms, and the pure logic they wrap in `recordforge.transforms.core`) and
`recordforge.schemas` (feature specs, the Example codec, the manifest model).

Writing from Python: `reshard(inputs, output, **options)` turns TFRecord files into a planned
dataset, and `WriteDataset(output, **options)` is a Beam PTransform that writes the records of
your own pipeline as `convert` writes its own. Reading: `load(folder, split)` gives a
tf.data.Dataset (TensorFlow is imported only when it is called), `iterate(folder, split)`
plain dicts without TensorFlow, `open_dataset(folder)` the manifest and the shards. Names are
imported when first used, so `import recordforge` stays cheap and pure modules can be imported
without Apache Beam.
"""

from __future__ import annotations

import importlib
import pathlib

# In a checkout the subpackages are the repository's top-level folders, beside this one
# (pyproject.toml's package-dir maps them); installed, they are inside it. This lets code run
# from a checkout's root (`python -m benchmarks`) import the same names as an installed copy.
_here = pathlib.Path(__file__).resolve().parent
if not (_here / "pipelines").is_dir() and (_here.parent / "pyproject.toml").is_file():
    __path__.append(str(_here.parent))

_PUBLIC = {
    "DatasetFolder": "recordforge.pipelines.dataset",
    "WriteDataset": "recordforge.pipelines.write_dataset",
    "reshard": "recordforge.pipelines.reshard",
    "iterate": "recordforge.pipelines.dataset",
    "open_dataset": "recordforge.pipelines.dataset",
    "feature_spec": "recordforge.pipelines.tf_dataset",
    "load": "recordforge.pipelines.tf_dataset",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'recordforge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
