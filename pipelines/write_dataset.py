"""`recordforge.WriteDataset`: the planner and writer as a PTransform for your own pipeline."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import uuid
import weakref
from collections.abc import Mapping

import apache_beam as beam

from recordforge.pipelines import options as cli_options
from recordforge.pipelines import output as output_folder
from recordforge.pipelines import preflight
from recordforge.pipelines.reshard import load_feature_schema, reshard_run_options
from recordforge.schemas.features import FeatureType, feature_types
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.examples import ExamplesConfig, ParkElements, WriteExamples

LOGGER = logging.getLogger("recordforge")

# The output folders of each pipeline's WriteDataset transforms.
_OUTPUTS: weakref.WeakKeyDictionary[beam.Pipeline, set[str]] = weakref.WeakKeyDictionary()


class WriteDataset(beam.PTransform):
    """Records in your pipeline → a planned, sharded dataset with a manifest, as `convert` writes.

    Input: a PCollection of serialized tf.train.Example bytes (written as they are),
    tf.train.Example objects, dicts of feature values ({"age": 41, "tags": ["a", "b"]}), or
    (split, record) pairs of those. Records without a split get one by `splits` (a salted hash
    of their bytes), else "train". Output: a PCollection holding the manifest as a dict, once
    the dataset is committed.

    The options are `recordforge convert`'s output options with underscores: name, splits
    ("train=0.8,test=0.2" or {"train": 0.8, "test": 0.2}), split_salt, num_hosts,
    min_shard_mb, max_shard_mb, num_shards, max_error_rate, compression, write_index, tfds,
    overwrite; and the features' types: schema (a YAML or JSON file, as `reshard --schema`
    reads) or features ({key: dtype or {"dtype": ..., "shape": [...]}}). Mistakes raise
    UsageError (a ValueError) here; the output folder is checked (and, with overwrite, the
    dataset in it replaced when the pipeline commits) when the transform is applied.
    """

    def __init__(self, output: str, **options) -> None:
        super().__init__()
        options = dict(options)
        features = options.pop("features", None)
        args = _arguments(preflight.path_argument(output, "output"), options)
        self._overwrite = args.overwrite
        self._config = _config(args, features)

    @property
    def config(self) -> ExamplesConfig:
        return self._config

    def expand(self, records):
        config = self._config
        # Two writers of one folder in one pipeline would each stage and commit into it: the
        # second finds its staging gone, after the first has replaced the dataset.
        written = _OUTPUTS.setdefault(records.pipeline, set())
        if config.output in written:
            raise UsageError(
                f"WriteDataset: this pipeline writes {config.output} already; give each "
                "WriteDataset its own output folder"
            )
        written.add(config.output)
        # Staged as `convert` stages (pipelines/output.py): the previous dataset stays until the
        # new one commits. The lock is given back at once: the pipeline runs when its owner
        # runs it (or never), so no run of this process could be told apart from a dead one.
        prepared = output_folder.prepare_output(
            config.output,
            run_id=config.run_id,
            options=reshard_run_options(config),
            overwrite=self._overwrite,
            resume=False,
            resumable=False,
        )
        prepared.release()
        config = dataclasses.replace(config, staging=prepared.staging, overwrite=self._overwrite)
        return records | "WriteExamples" >> WriteExamples(config, ParkElements(config))


_NOT_OPTIONS = ("output", "help", "resume")


def _parser() -> argparse.ArgumentParser:
    parser = cli_options.OneLineParser(prog="WriteDataset", add_help=False, allow_abbrev=False)
    cli_options.add_split_options(parser, column=False)
    cli_options.add_sharding_options(parser)
    cli_options.add_error_rate_option(parser)
    cli_options.add_output_options(parser)
    parser.add_argument("--schema")
    return parser


def _arguments(output: str, options: Mapping) -> argparse.Namespace:
    return cli_options.set_keyword_options(
        _parser(), ["--output", output], options, caller="WriteDataset", not_options=_NOT_OPTIONS
    )


def _config(args: argparse.Namespace, features: Mapping | None) -> ExamplesConfig:
    output = preflight.output_path(args.output)
    sharding = cli_options.sharding_config(args)
    cli_options.check_error_rate(args.max_error_rate)
    name, compression, write_index, tfds = cli_options.output_settings(args, output)
    splits = preflight.parse_splits(args.splits) if args.splits else None
    if features is not None and args.schema:
        raise UsageError("give the features' types as schema (a file) or features, not both")
    types: dict[str, FeatureType] = {}
    if args.schema:
        types = load_feature_schema(args.schema)
    elif features is not None:
        try:
            types = feature_types({"features": features})
        except ValueError as error:
            raise UsageError(f"features: {error}") from None
    return ExamplesConfig(
        output=output,
        name=name,
        splits=splits or (("train", 1.0),),
        # Records that name their split list it after the hashed ones.
        configured_splits=tuple(name for name, _ in splits) if splits else (),
        salt=args.split_salt,
        types=types,
        sharding=sharding,
        compression=compression,
        write_index=write_index,
        tfds=tfds,
        max_error_rate=args.max_error_rate,
        run_id=uuid.uuid4().hex[:12],
        tool_version=cli_options.tool_version(),
        options={
            "name": name,
            "splits": dict(splits) if splits else None,
            "split_salt": args.split_salt,
            "schema": {key: rule.to_dict() for key, rule in sorted(types.items())} or None,
            "compression": compression,
            "write_index": write_index,
            "tfds": tfds,
            "sharding": sharding.to_dict(),
        },
        source={"kind": "pcollection", "inputs": ["WriteDataset"]},
    )
