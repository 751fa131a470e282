"""The `recordforge` command: convert, plan, reshard, verify, inspect, demo."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from recordforge.pipelines import options as cli_options
from recordforge.pipelines import preflight
from recordforge.pipelines.assembly import build_pipeline, build_plan_pipeline, run_pipeline
from recordforge.pipelines.dataset import DatasetFolder, open_dataset
from recordforge.pipelines.inspect import add_inspect_options, inspect_command
from recordforge.pipelines.reshard import add_reshard_options, prepare_reshard, run_reshard
from recordforge.pipelines.runner import add_runner_options, beam_options, runner_args
from recordforge.schemas.features import MixedFeatureTypes
from recordforge.transforms.commit import remove_tree
from recordforge.transforms.core.errors import (
    ErrorRateExceeded,
    InputChanged,
    InputIncomplete,
    UsageError,
)
from recordforge.transforms.core.sharding import human_size
from recordforge.transforms.core.summary import format_plan, plural
from recordforge.transforms.write import temp_folder

LOGGER = logging.getLogger("recordforge")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def main(
    argv: Sequence[str] | None = None,
    *,
    beam_argv: Sequence[str] | None = None,
    submit_only: bool = False,
) -> int:
    """Run the command line; returns the exit status (0 ok, 1 run failed, 2 usage error).

    Arguments recordforge does not know are Beam's, unless `beam_argv` gives Beam's arguments
    separately (then `argv` must hold recordforge's only). With `submit_only`, `convert` returns
    once the runner has accepted the pipeline instead of waiting for it to finish. Both serve
    the Dataflow Flex Template launch (pipelines/flex_template).
    """
    if argv is None:
        _spare_the_collector()
    parser = _parser()
    if beam_argv is None:
        args, beam_args = parser.parse_known_args(argv)
    else:
        args, beam_args = parser.parse_args(argv), list(beam_argv)
    _configure_logging(args.verbose - args.quiet)
    handler = submit_conversion if submit_only and args.handler is convert_command else args.handler
    try:
        status = handler(args, beam_args)
        sys.stdout.flush()
        return status
    except UsageError as error:
        print(f"recordforge: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("recordforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `recordforge plan --json ... | head`: the reader has all it wants. The work is done;
        # send what is left to /dev/null so the exit does not fail flushing it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


class _OneLineParser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are one line on stderr (the usage is in --help), as
    every other usage error is; subcommands get the same class."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"recordforge: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    # No abbreviations: a misspelt option must not silently match one of ours (--num-host).
    parser = _OneLineParser(
        prog="recordforge",
        allow_abbrev=False,
        description="Convert image folders and CSV files into sharded TFRecord datasets. "
        "Options recordforge does not know are passed to Apache Beam (e.g. "
        "--direct_num_workers=2 --direct_running_mode=multi_processing, --job_endpoint, "
        "--dask_client_address); see `recordforge convert --help` for --runner.",
    )
    parser.add_argument("--version", action="version", version=cli_options.tool_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    convert = commands.add_parser(
        "convert", help="convert inputs into a TFRecord dataset", allow_abbrev=False
    )
    cli_options.add_input_options(convert)
    cli_options.add_output_options(convert)
    add_runner_options(convert)
    convert.set_defaults(handler=convert_command)

    plan = commands.add_parser(
        "plan", help="print the shard plan and its reasons; write nothing", allow_abbrev=False
    )
    cli_options.add_input_options(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_runner_options(plan)
    plan.set_defaults(handler=plan_command)

    reshard = commands.add_parser(
        "reshard",
        help="reshard TFRecord files (a TFX ExampleGen output, say) into a planned dataset",
        allow_abbrev=False,
    )
    add_reshard_options(reshard)
    cli_options.add_output_options(reshard)
    add_runner_options(reshard)
    reshard.set_defaults(handler=reshard_command)

    inspect = commands.add_parser(
        "inspect",
        help="summarize a converted dataset and show its first records; --html for a page "
        "with a contact sheet of sample images",
        allow_abbrev=False,
    )
    add_inspect_options(inspect)
    inspect.set_defaults(handler=inspect_command)

    demo = commands.add_parser(
        "demo", help="generate a small demo dataset and convert it", allow_abbrev=False
    )
    demo.add_argument("--data", default="demo-data", help="where the demo images go")
    demo.add_argument("--output", default="demo-output", help="where the dataset goes")
    demo.set_defaults(handler=demo_command)

    verify = commands.add_parser(
        "verify",
        help="re-read a dataset and check every file and record against its manifest",
        allow_abbrev=False,
    )
    verify.add_argument("folder", metavar="OUT", help="the dataset folder (local or gs://...)")
    verify.add_argument(
        "--deep", action="store_true", help="also decode every image/encoded fully (slower)"
    )
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument(
        "--max-findings",
        type=int,
        default=20,
        metavar="N",
        help="findings listed per file, the rest counted (default 20; 0 lists all)",
    )
    verify.set_defaults(handler=verify_command)

    for sub in (convert, plan, reshard, inspect, demo, verify):
        sub.add_argument("-v", "--verbose", action="count", default=0, help="more detail")
        sub.add_argument("-q", "--quiet", action="count", default=0, help="less detail")
    return parser


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of one command (say `convert`), e.g. to list its options."""
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


def _spare_the_collector() -> None:
    """Keep the garbage collector off the objects that live as long as the program.

    Importing Beam leaves ~0.5 M objects behind (modules, classes, protobuf descriptors) that
    never become garbage, yet the collector walks all of them in every full collection, and
    the interpreter frees them one by one at exit: ~0.4 s of CPU in a 2 s conversion. Frozen,
    they are left alone (reference counting still frees what is dropped). Only when run as
    the `recordforge` program (argv from the command line): a process that imports `main`,
    such as a test session, keeps its collector as it is.
    """
    gc.freeze()


def _configure_logging(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("recordforge: %(message)s"))
    LOGGER.handlers[:] = [handler]
    LOGGER.propagate = False
    LOGGER.setLevel(logging.WARNING if level < 0 else logging.DEBUG if level > 0 else logging.INFO)
    # Beam's own lines drown the progress, and it logs a failing DoFn's traceback itself even
    # when the failure is a user's (too many bad inputs); a failed run is reported below, once.
    logging.getLogger().setLevel(logging.INFO if level > 0 else logging.WARNING)
    beam_level = {0: logging.CRITICAL, 1: logging.WARNING}.get(max(level, 0), logging.INFO)
    logging.getLogger("apache_beam").setLevel(beam_level)


def convert_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    output, config, options = _prepare_conversion(args, beam_args)
    started = time.monotonic()
    try:
        run_pipeline(options, lambda pipeline: build_pipeline(pipeline, config))
    except Exception as error:  # noqa: BLE001  (the runner wraps worker errors in many types)
        _remove_temp_files(output, config.run_id)
        message = _refusal_message(error)
        if message:
            print(f"recordforge: failed: {message}", file=sys.stderr)
            return EXIT_FAILED
        LOGGER.error("the conversion failed; no dataset_info.json was written", exc_info=error)
        return EXIT_FAILED
    dataset = open_dataset(output)
    _print_summary(dataset, time.monotonic() - started)
    return EXIT_OK


def reshard_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    output, config, inputs, options = prepare_reshard(args, beam_args)
    started = time.monotonic()
    try:
        run_reshard(config, inputs, options)
    except Exception as error:  # noqa: BLE001  (the runner wraps worker errors in many types)
        message = _refusal_message(error)
        if message:
            print(f"recordforge: failed: {message}", file=sys.stderr)
            return EXIT_FAILED
        LOGGER.error("resharding failed; no dataset_info.json was written", exc_info=error)
        return EXIT_FAILED
    _print_summary(open_dataset(output), time.monotonic() - started, verb="Resharded")
    return EXIT_OK


def submit_conversion(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    """`convert` that returns once the runner has the job, without waiting for it to finish."""
    output, config, options = _prepare_conversion(args, beam_args)
    try:
        run_pipeline(options, lambda pipeline: build_pipeline(pipeline, config), wait=False)
    except Exception as error:  # noqa: BLE001  (the runner wraps submission errors in many types)
        _remove_temp_files(output, config.run_id)
        LOGGER.error("the conversion could not be submitted", exc_info=error)
        return EXIT_FAILED
    print(f"Submitted the conversion into {output}; its dataset_info.json appears when it is done")
    return EXIT_OK


def pipeline_options(args: argparse.Namespace, beam_args: Sequence[str]) -> PipelineOptions:
    """Beam's options for `convert` and `plan`: --runner/--worker_pool expanded, then the rest."""
    return beam_options([*runner_args(args.runner, args.worker_pool), *beam_args])


def _prepare_conversion(args: argparse.Namespace, beam_args: Sequence[str]):
    """Check the options, inputs and output, and clear a dataset --overwrite replaces."""
    output = preflight.normalize_path(args.output)
    config = cli_options.build_config(args, output=output)
    options = pipeline_options(args, beam_args)
    old_files = preflight.check_output(output, config.sources, overwrite=args.overwrite)
    preflight.check_writable(output)
    if old_files:
        LOGGER.info("--overwrite: deleting the %d files of the previous dataset", len(old_files))
        preflight.delete_files(old_files, output)
    if config.split_note:
        splits = config.split_note
    elif config.roles.split_column:
        splits = f"splits from column {config.roles.split_column}"
    else:
        splits = "hashed splits: " + ", ".join(f"{n}={f:g}" for n, f in config.splits)
    LOGGER.info(
        "converting %s into %s (%s)", ", ".join(s.given for s in config.sources), output, splits
    )
    return output, config, options


# Runs the pipeline itself refuses: too many bad inputs, an input that changed during the run,
# an input not read to its end, records whose feature types disagree.
REFUSALS = (ErrorRateExceeded, InputChanged, InputIncomplete, MixedFeatureTypes)


def _refusal_message(error: BaseException) -> str | None:
    """The message of a run the pipeline itself refused, else None."""
    refusal = refusal_in(error)
    return None if refusal is None else str(refusal)


def refusal_in(error: BaseException) -> Exception | None:
    """The refusal (one of REFUSALS) a failed run's exception carries, as raised; else None."""
    # Raised inside the pipeline; runners re-raise it wrapped (with the worker's traceback as
    # text when the worker was another process), so look for it by name in the chain.
    while error is not None:
        if isinstance(error, REFUSALS):
            return type(error)(str(error).split(" [while running")[0])
        text = str(error)
        for kind in REFUSALS:
            marker = kind.__name__ + ": "
            if marker in text:
                message = text.split(marker, 1)[1].splitlines()[0].split(" [while running")[0]
                return kind(message)
        error = error.__cause__ or error.__context__
    return None


def _remove_temp_files(output: str, run_id: str) -> None:
    try:
        remove_tree(temp_folder(output, run_id))
    except Exception:  # noqa: BLE001  (best effort: the run already failed)
        LOGGER.warning("could not remove %s", temp_folder(output, run_id))


def _read_json(path: str) -> dict:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return json.loads(f.read().decode("utf-8"))


def _print_summary(dataset: DatasetFolder, seconds: float, verb: str = "Converted") -> None:
    manifest, output = dataset.manifest.to_dict(), dataset.folder
    print(
        f"{verb} {plural(manifest['num_inputs'], 'input')} into "
        f"{plural(manifest['num_records'], 'record')} in {seconds:.1f} s"
    )
    source = manifest.get("source") or {}
    if source.get("splits"):  # the splits the inputs named: folders, names, SOURCE=SPLIT
        print(f"  {source['splits']}")
    print(f"  {'split':<14}{'records':>12}{'shards':>8}{'bytes':>14}")
    for name, split in manifest["splits"].items():
        print(
            f"  {name:<14}{split['num_records']:>12,}{split['num_shards']:>8,}"
            f"{human_size(split['num_bytes']):>14}"
        )
    labels = manifest.get("labels")
    if labels:
        shown = ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")
        print(f"  {plural(len(labels), 'class')}: {shown}")
    if source.get("labels"):  # why folders gave labels, or did not
        print(f"  {source['labels']}")
    skipped = [
        f"{source[key]:,} {words}"
        for key, words in (
            ("duplicate_files", "files reached a second time (converted once)"),
            ("symlinked_folders_not_followed", "links to folders not followed"),
        )
        if source.get(key)
    ]
    if skipped:
        print(f"  skipped: {'; '.join(skipped)}")
    errors = manifest["errors"]
    if errors["count"]:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in errors["by_kind"].items())
        files = ", ".join(FileSystems.join(output, f) for f in errors["files"])
        print(
            f"WARNING: {errors['count']:,} of {manifest['num_inputs']:,} inputs failed "
            f"({kinds}); details in {files}",
            file=sys.stderr,
        )
    else:
        print("  no errors")
    print(f"Dataset: {dataset.path(dataset.manifest_file)}")


def plan_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    config = cli_options.build_config(args, output=None)
    options = pipeline_options(args, beam_args)
    # The workers write the report where this process can read it: on remote runners that is
    # Beam's --temp_location (gs://... on Dataflow), not a local folder of this machine.
    temp_location = options.view_as(GoogleCloudOptions).temp_location
    if temp_location:
        report_dir = FileSystems.join(temp_location, f"recordforge-plan-{uuid.uuid4().hex}")
    else:
        report_dir = tempfile.mkdtemp(prefix="recordforge-plan-")
    try:
        report_path = FileSystems.join(report_dir, "plan.json")
        run_pipeline(options, lambda p: build_plan_pipeline(p, config, report_path))
        report = _read_json(report_path)
    except Exception as error:  # noqa: BLE001  (the runner wraps worker errors in many types)
        message = _refusal_message(error)  # an input that cannot be read to its end, say
        if not message:
            raise
        print(f"recordforge: failed: {message}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        remove_tree(report_dir)
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print("\n".join(format_plan(report, config.sharding.num_hosts)))
    return EXIT_OK


def verify_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    from recordforge.pipelines import verify

    if args.max_findings < 0:
        raise UsageError("--max-findings must be 0 (list all) or more")
    # Beam options (say, a project for gs://) reach the filesystems; no pipeline runs.
    FileSystems.set_options(beam_options(beam_args))
    report = verify.verify_dataset(
        preflight.normalize_path(args.folder),
        deep=args.deep,
        max_per_file=args.max_findings or None,
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("\n".join(verify.format_report(report)))
    return EXIT_OK if report.ok else EXIT_FAILED


def demo_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    from recordforge.pipelines import demo

    data = demo.generate_demo_data(args.data)
    LOGGER.info("demo images in %s", data)
    argv = [
        "convert",
        data,
        "--output",
        args.output,
        "--overwrite",
        "--splits",
        "train=0.8,validation=0.2",
        *(["-v"] * args.verbose),
        *(["-q"] * args.quiet),
        *beam_args,
    ]
    return main(argv)
