"""The commit: checks that all results arrived, assembles the manifest, puts the dataset in place.

How the staged files become the output folder's is transforms/staging.py.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from recordforge.schemas import tfds_metadata
from recordforge.schemas.features import DeclaredFeature
from recordforge.transforms.combiners import TallyCombineFn
from recordforge.transforms.core.errors import ErrorRateExceeded
from recordforge.transforms.core.files import skipped
from recordforge.transforms.core.files.naming import (
    MANIFEST_FILE,
    MANIFEST_FILE_BESIDE_TFDS,
)
from recordforge.transforms.core.planning.assemble import (
    GatheredResults,
    assemble_manifest,
    error_rate_message,
    summarize_errors,
)
from recordforge.transforms.lock import release_lock
from recordforge.transforms.progress import LOGGER
from recordforge.transforms.staging import Staging, commit
from recordforge.transforms.write import publish, raise_if_out_of_space


@dataclass(frozen=True)
class CommitConfig:
    """What the commit needs besides the pipeline's results.

    `detached`: the launcher does not wait for the run (a submitted Dataflow job), so the
    commit releases the output folder's lock itself. `overwrite`: the commit may replace a
    dataset in the output folder (else one that appeared there during the run stays).
    """

    staging: Staging
    name: str
    run_id: str
    tool_version: str
    compression: str
    tfds: bool
    configured_splits: tuple[str, ...]
    declared: tuple[DeclaredFeature, ...]
    max_error_rate: float | None
    plan_config: Mapping = field(default_factory=dict)
    options: Mapping = field(default_factory=dict)
    source: Mapping = field(default_factory=dict)
    run_key: str = ""
    detached: bool = False
    overwrite: bool = False


class Commit(beam.PTransform):
    """ShardResults and ErrorFileResults → files renamed into place, then `dataset_info.json`.

    Input: PCollection[ShardResult | ErrorFileResult], gathered into one GatheredResults (label
    counts summed per split, so the gathered element grows with the shard count only). Output:
    PCollection with the manifest as a dict. Side inputs: the layouts, labels, feature tally,
    input counts and ignored files.
    Fails the pipeline (ErrorRateExceeded) when too many inputs failed, after the errors files
    are written and without leaving shards behind.
    """

    def __init__(self, config: CommitConfig, *, layouts, labels, tally, counts, ignored) -> None:
        super().__init__()
        self._config = config
        self._side = (layouts, labels, tally, counts, ignored)

    def expand(self, results):
        layouts, labels, tally, counts, ignored = (beam.pvalue.AsSingleton(p) for p in self._side)
        return (
            results
            # One GatheredResults: every result, label counts summed per split on the way.
            | "GatherResults"
            >> beam.CombineGlobally(TallyCombineFn(GatheredResults, GatheredResults.add))
            | "WriteManifest"
            >> beam.ParDo(_CommitFn(self._config), layouts, labels, tally, counts, ignored)
        )


class _CommitFn(beam.DoFn):
    def __init__(self, config: CommitConfig) -> None:
        self._config = config

    def process(self, results, layouts, labels, tally, counts, ignored):
        config = self._config
        staging = config.staging
        shards = results.shards
        error_files = results.error_files
        errors = summarize_errors(error_files)
        failure = error_rate_message(
            errors.count, counts.num_inputs, config.max_error_rate, staging.errors
        )
        if failure:
            # Nothing is committed: the errors files stay in the working folder, to say why.
            publish(
                (source, FileSystems.join(staging.work, relative))
                for result in error_files
                for source, relative in result.staged
            )
            raise ErrorRateExceeded(failure)
        source = dict(config.source)
        source.update(skipped.source_fields(ignored))
        if labels.note:
            source["labels"] = labels.note
        manifest = assemble_manifest(
            shards=shards,
            errors=errors,
            layouts=layouts,
            labels=labels,
            tally=tally,
            counts=counts,
            declared=config.declared,
            configured_splits=config.configured_splits,
            name=config.name,
            tool_version=config.tool_version,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            compression=config.compression,
            options=config.options,
            source=source,
            plan_config=config.plan_config,
            label_counts=results.label_counts,
        )
        documents = []
        if config.tfds:  # features.json, dataset_info.json and the class names
            documents += tfds_metadata.documents(manifest, tally.images)
        # Ours comes last: its presence means the dataset is complete.
        manifest_file = MANIFEST_FILE_BESIDE_TFDS if config.tfds else MANIFEST_FILE
        documents.append((manifest_file, manifest.to_json()))
        files = [pair for shard in shards for pair in shard.staged]
        files += [pair for result in error_files for pair in result.staged]
        try:
            commit(
                staging,
                run_id=config.run_id,
                run_key=config.run_key,
                files=files,
                documents=[(name, text.encode("utf-8")) for name, text in documents],
                replace=config.overwrite,
            )
        except OSError as error:
            raise_if_out_of_space(error, "the manifest", staging.work)
            raise
        if config.detached:
            release_lock(staging.lock, config.run_id)
        LOGGER.info("wrote %s", FileSystems.join(staging.output, manifest_file))
        yield manifest.to_dict()
