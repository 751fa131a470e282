"""`recordforge reshard` and `recordforge.reshard`: TFRecord files into a planned dataset.

The inputs are TFRecord files of tf.train.Examples (plain or gzip), globs of them, or folders
holding them, such as a TFX ExampleGen output folder (`Split-train/data_tfrecord-…-of-….gz`).
They are listed here, before anything runs, because their place decides their splits: files in
ExampleGen's `Split-{name}` folders, or named as the shards of a recordforge or TFDS dataset
(`{name}-{split}.tfrecord-…`), keep that split; with --splits every record is split by a hash
of its bytes instead. The records are copied byte for byte.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.pipelines import options as cli_options
from recordforge.pipelines import output as output_folder
from recordforge.pipelines import preflight
from recordforge.pipelines.assembly import build_reshard_pipeline, run_pipeline
from recordforge.pipelines.dataset import DatasetFolder, open_dataset
from recordforge.pipelines.library_calls import logging_as_found
from recordforge.pipelines.runner import beam_options, check_runner_reachable, runner_args
from recordforge.schemas.csv.document import SchemaError, load_yaml_document
from recordforge.schemas.features import FeatureType, feature_types
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files.filenames import to_os
from recordforge.transforms.core.files.naming import is_valid_split_name
from recordforge.transforms.core.files.paths import glob_root, has_scheme, is_hidden, relative_path
from recordforge.transforms.core.files.walk import FILE, FOLDER_LINK, HIDDEN, PROBLEM, is_glob
from recordforge.transforms.core.tfrecord.inputs import TFRecordInput, is_metadata, split_of
from recordforge.transforms.examples import ExamplesConfig
from recordforge.transforms.listing import list_entries, list_files

LOGGER = logging.getLogger("recordforge")


def add_reshard_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="IN",
        help="TFRecord files of tf.train.Examples (plain or gzip), globs of them, or folders "
        "holding them (a TFX ExampleGen output folder keeps its Split-* splits); local or gs://",
    )
    cli_options.add_split_options(
        parser, column=False, default="the splits the inputs' folders or names give, else train=1"
    )
    parser.add_argument(
        "--schema",
        help="a YAML or JSON file typing features (features: {key: dtype or {dtype, shape}}; a "
        "recordforge dataset_info.json is one): records that disagree go to the quarantine. "
        "Default: typed by what the records hold",
    )
    cli_options.add_sharding_options(parser)
    cli_options.add_error_rate_option(parser)


def reshard(
    inputs: str | Sequence[str],
    output: str,
    *,
    beam_args: Sequence[str] = (),
    **options,
) -> DatasetFolder:
    """Reshard TFRecord files into a planned, balanced dataset in `output`; return it.

    `inputs`: files, globs or folders, as `recordforge reshard` takes them. `options` are the
    command's options with underscores (num_hosts=8, splits="train=0.9,test=0.1", schema=...,
    overwrite=True, ...); `beam_args` Beam's (["--runner", "portable", ...]), runner included.

    Raises:
        UsageError (a ValueError): an option or input the command would refuse.
        ErrorRateExceeded, MixedFeatureTypes: the run refused to commit (nothing written).
        Whatever the runner raises when the pipeline fails otherwise.
    """
    if isinstance(inputs, str | bytes | os.PathLike) or not isinstance(inputs, Iterable):
        inputs = [inputs]
    inputs = [preflight.path_argument(item, "an input") for item in inputs]
    args = reshard_arguments(inputs, preflight.path_argument(output, "output"), options)
    with logging_as_found():
        return _reshard_prepared(args, beam_args)


def _reshard_prepared(args: argparse.Namespace, beam_args: Sequence[str]) -> DatasetFolder:
    from recordforge.pipelines.api import raise_interrupt_in, refusal_in

    output, config, files, beam, prepared = prepare_reshard(args, beam_args)
    try:
        run_reshard(config, files, beam)
    except Exception as error:
        raise_interrupt_in(error)
        refused = refusal_in(error)
        if refused is not None:
            raise refused from None
        from recordforge.pipelines.run_outcomes import library_outcome

        if not library_outcome(error, prepared):
            raise
    finally:
        prepared.release()
    return open_dataset(output)


def reshard_arguments(inputs: list[str], output: str, options: Mapping) -> argparse.Namespace:
    """The command's arguments for a Python call: its defaults, overridden by `options`."""
    from recordforge.pipelines.cli import command_parser

    return cli_options.set_keyword_options(
        command_parser("reshard"),
        [*inputs, "--output", output],
        options,
        caller="reshard()",
        not_options=_NOT_OPTIONS,
    )


# The command's arguments that are not keyword options of reshard().
_NOT_OPTIONS = ("inputs", "output", "handler", "verbose", "quiet", "help")


def prepare_reshard(args: argparse.Namespace, beam_args: Sequence[str]):
    """Check the options, inputs and output; lock the output and stage the run, as `convert`
    does (pipelines/output.py): the previous dataset stays until the new one commits.

    Returns (output, ExamplesConfig, TFRecordInputs, PipelineOptions, PreparedOutput); the
    caller releases the PreparedOutput's lock when the run ends.
    """
    if args.resume:
        # Its shards carry no fingerprint of their inputs to check a staged one against: a run
        # that said it kept them would write them anew.
        raise UsageError(
            "--resume: a reshard cannot be continued; rerun without --resume (it starts over, "
            "and finishes an interrupted commit first)"
        )
    output = preflight.output_path(args.output)
    config, inputs = build_reshard_config(args, output=output)
    options = beam_options(
        [*runner_args(args.runner, args.worker_pool, args.workers, beam_args), *beam_args]
    )
    check_runner_reachable(options)
    prepared = output_folder.prepare_output(
        output,
        run_id=config.run_id,
        options=reshard_run_options(config),
        overwrite=args.overwrite,
        resume=False,
        resumable=False,
    )
    config = dataclasses.replace(config, staging=prepared.staging, overwrite=args.overwrite)
    LOGGER.info(
        "resharding %d TFRecord files into %s (splits %s)",
        len(inputs),
        output,
        describe_splits(config),
    )
    return output, config, inputs, options, prepared


def reshard_run_options(config: ExamplesConfig) -> dict:
    """What a run records of its options and inputs (its working folder's run record)."""
    record = {
        "tool_version": config.tool_version,
        "inputs": list(config.source.get("inputs", ())),
        "options": dict(config.options),
    }
    return json.loads(json.dumps(record, sort_keys=True))


def run_reshard(
    config: ExamplesConfig,
    inputs: tuple[TFRecordInput, ...],
    options: PipelineOptions,
    *,
    progress=None,
) -> None:
    """Run the pipeline (a failed run leaves the output folder as it was; its working folder
    is removed by the next run); a `progress` monitor (pipelines/progress.py) shows it."""
    run_pipeline(
        options,
        lambda pipeline: build_reshard_pipeline(pipeline, config, inputs),
        progress=progress,
    )


def build_reshard_config(
    args: argparse.Namespace, *, output: str
) -> tuple[ExamplesConfig, tuple[TFRecordInput, ...]]:
    """Validate the options, list the inputs, and resolve both into a config (no writes)."""
    sharding = cli_options.sharding_config(args)
    cli_options.check_error_rate(args.max_error_rate)
    name, compression, write_index, tfds = cli_options.output_settings(args, output)
    hashed = preflight.parse_splits(args.splits) if args.splits else None
    listing = list_inputs(args.inputs, hashed=hashed is not None, output=output)
    inputs = listing.inputs
    kept = sorted(
        {file.split for file in inputs if file.split is not None and not file.problem}
        | (set(listing.empty_splits) if any(file.split for file in inputs) else set())
    )
    if hashed is not None:
        splits, configured, split_from = hashed, tuple(name for name, _ in hashed), "hash"
    elif kept:
        # Listed even when they hold no records (an empty Split-eval is kept, as an empty
        # hashed split is).
        splits, configured, split_from = (("train", 1.0),), tuple(kept), "input"
    else:
        splits, configured, split_from = (("train", 1.0),), ("train",), "hash"
    types = load_feature_schema(args.schema) if args.schema else {}
    config = ExamplesConfig(
        output=output,
        name=name,
        splits=splits,
        configured_splits=configured,
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
            "splits": dict(splits) if split_from == "hash" else None,
            "splits_from": split_from,
            "split_salt": args.split_salt,
            "schema": {key: rule.to_dict() for key, rule in sorted(types.items())} or None,
            "compression": compression,
            "write_index": write_index,
            "tfds": tfds,
            "sharding": sharding.to_dict(),
        },
        source={
            "inputs": list(args.inputs),
            "kind": "tfrecord",
            "files": len(inputs),
            "splits": kept if split_from == "input" else None,
            "skipped_metadata_files": listing.metadata,
            # Recorded only when some were found, so that a manifest without them is unchanged.
            **({"duplicate_files": listing.duplicates} if listing.duplicates else {}),
        },
        ignored=listing.hidden,
        folder_links=listing.folder_links,
    )
    return config, inputs


class Listing(NamedTuple):
    """What reshard's inputs name: the inputs (each file once, and what cannot be read as one,
    to be quarantined), and what was passed over, counted."""

    inputs: tuple[TFRecordInput, ...]
    hidden: int  # hidden files, and files in hidden folders
    metadata: int  # a dataset's manifests, index and errors files
    duplicates: int  # files reached a second time: by the same path, or a local file's link
    folder_links: int  # links to folders, not followed
    empty_splits: tuple[str, ...]  # splits an input dataset's manifest lists with no records


def list_inputs(given: Sequence[str], *, hashed: bool, output: str | None = None) -> Listing:
    """The TFRecord files the inputs name, and what was passed over (see Listing).

    A dataset's metadata (manifests, index and errors files) holds no records. A file's split
    is the one its place names (see split_of), unless `hashed`. What a folder holds that cannot
    be an input (a FIFO, a folder that cannot be read: see transforms.listing) is an input with
    a `problem`, which the read quarantines, so that nothing there vanishes uncounted.

    Raises:
        UsageError: an input that does not exist or holds no file, a split name that cannot
            name shard files, inputs of which some name splits and others do not, or inputs
            and `output` inside one another.
    """
    found: dict[str, TFRecordInput] = {}
    hidden = metadata = duplicates = folder_links = 0
    manifests: dict[str, dict[str, str]] = {}
    empty_splits: set[str] = set()  # listed by an input dataset's manifest, with no records
    reached: set[tuple[int, int]] = set()  # local files' (device, inode): a link is no new file
    for index, raw in enumerate(given):
        path = preflight.normalize_path(raw)
        if is_glob(path):
            root = glob_root(path)
            files, problems, links = _listed(path, index, found)
            if not files and not problems:
                raise UsageError(f"no files match {raw!r}")
        elif path in list_files(path):
            files, problems, links, root = [path], [], 0, None
        else:
            root = path.rstrip("/")
            if not has_scheme(root) and not os.path.lexists(to_os(root)):
                raise UsageError(f"input not found: {raw!r}")
            files, problems, links = _listed(root + "/**", index, found)
            if not files and not problems:
                raise UsageError(f"input not found: {raw!r}")
        folder_links += links
        kept = len(problems)
        found.update((problem.path, problem) for problem in problems)
        for file in files:
            relative = relative_path(file, root or file.rsplit("/", 1)[0])
            if root is not None and is_hidden(relative):  # a file named on its own is kept
                hidden += 1
                continue
            if is_metadata(relative):
                metadata += 1
                continue
            kept += 1
            identity = _local_identity(file)
            if file in found or identity in reached:
                duplicates += 1
                continue
            if identity is not None:
                reached.add(identity)
            # The input's own folder and those below it may name a split, not those above.
            base = (root or file.rsplit("/", 1)[0]).rstrip("/").rpartition("/")[0]
            placed = relative_path(file, base)
            split = None if hashed else _split_of(file, placed, manifests, empty_splits)
            if split is not None and not is_valid_split_name(split):
                raise UsageError(
                    f"{file} is in split {split!r}, which cannot name shard files "
                    "(letters, digits, '_', '-'); give --splits to split by hash instead"
                )
            found[file] = TFRecordInput(file, split, index)
        if not kept:
            raise UsageError(f"input {raw!r} holds no TFRecord files (hidden files do not count)")
        if output is not None:
            check_apart(output, raw, root, files)
    inputs = tuple(found.values())
    readable = [file for file in inputs if not file.problem]
    named = [file for file in readable if file.split is not None]
    if named and len(named) < len(readable):
        unnamed = next(file.path for file in readable if file.split is None)
        raise UsageError(
            f"some inputs are in splits ({named[0].path} is in {named[0].split!r}) and others "
            f"are not ({unnamed}); give --splits to split every record by hash, or reshard them "
            "apart"
        )
    return Listing(inputs, hidden, metadata, duplicates, folder_links, tuple(sorted(empty_splits)))


def _listed(
    pattern: str, index: int, found: Mapping[str, TFRecordInput]
) -> tuple[list[str], list[TFRecordInput], int]:
    """(the files a folder's `root/**` or a glob names, sorted; what it names that cannot be
    an input, as inputs with a `problem` not listed yet; the links to folders it met)."""
    entries = list(list_entries(pattern))
    files = sorted(entry.path for entry in entries if entry.kind in (FILE, HIDDEN))
    problems = [
        TFRecordInput(entry.path, None, index, entry.error)
        for entry in entries
        if entry.kind == PROBLEM and entry.path not in found
    ]
    return files, problems, sum(entry.kind == FOLDER_LINK for entry in entries)


def _local_identity(file: str) -> tuple[int, int] | None:
    """A local file's (device, inode), the same through any link to it; None elsewhere."""
    if has_scheme(file):
        return None
    try:
        info = os.stat(file)
    except OSError:  # read (and reported) as any input is
        return None
    return info.st_dev, info.st_ino


def _split_of(
    file: str, placed: str, manifests: dict[str, dict[str, str]], empty_splits: set[str]
) -> str | None:
    """The split of a TFRecord input: the one the recordforge manifest beside it lists it in,
    else the one `placed` (its path from the folder above the input it was found under)
    names (`split_of`). A split name may hold '-', as a dataset's name
    may, so `{name}-{split}.tfrecord-…` alone cannot tell `a-test` from `test`. The splits such
    a manifest lists without shards (no records) are added to `empty_splits`."""
    folder, _, name = file.rpartition("/")
    if folder not in manifests:
        try:
            splits = open_dataset(folder).manifest.splits
        except UsageError:  # no manifest there, or not one of recordforge's
            splits = {}
        manifests[folder] = {
            shard.file: split for split, info in splits.items() for shard in info.shards
        }
        empty_splits.update(split for split, info in splits.items() if not info.shards)
    listed = manifests[folder].get(name)
    return listed if listed is not None else split_of(placed)


def check_apart(output: str, given: str, root: str | None, files: Sequence[str]) -> None:
    """Neither inside the other: an input's files inside the output folder would be deleted by
    --overwrite before they are read; an output inside an input folder (`root`, None for a
    file) read by the next run."""
    inside = output.rstrip("/") + "/"
    for file in files:
        if file.startswith(inside):
            raise UsageError(
                f"the input {file} is inside the output folder {output!r}; write the new "
                "dataset to another folder"
            )
    if root is not None and inside.startswith(root.rstrip("/") + "/"):
        raise UsageError(
            f"the output folder {output!r} is inside the input {given!r}; its files would be "
            "read as inputs"
        )


def load_feature_schema(path: str) -> dict[str, FeatureType]:
    """{key: FeatureType} from a YAML or JSON file (a recordforge manifest is one), read and
    parsed with the same limits as a CSV schema file (size, no aliases)."""
    text = preflight.read_schema_text(path)
    try:
        document = load_yaml_document(text, source_name=path)
    except SchemaError as error:
        raise UsageError(str(error)) from None
    try:
        return feature_types(document)
    except ValueError as error:
        raise UsageError(f"schema file {path!r}: {error}") from None


def describe_splits(config: ExamplesConfig) -> str:
    """How the records get their splits, for the log."""
    if config.options.get("splits_from") == "input":
        return "kept from the inputs: " + ", ".join(config.source.get("splits") or [])
    return "by hash: " + ", ".join(f"{n}={f:g}" for n, f in config.splits)
