"""The `recordforge` command: convert, plan, reshard, verify, inspect, demo."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from recordforge.pipelines import api, progress
from recordforge.pipelines import options as cli_options
from recordforge.pipelines.assembly import build_pipeline, run_pipeline
from recordforge.pipelines.dataset import DatasetFolder, open_dataset
from recordforge.pipelines.inspect import add_inspect_options, inspect_command
from recordforge.pipelines.local_workers import chosen_in_words
from recordforge.pipelines.reshard import add_reshard_options, prepare_reshard, run_reshard
from recordforge.pipelines.run_outcomes import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    only_cleanup_failed,
    report_failure,
    report_stop,
)
from recordforge.pipelines.runner import add_runner_options, beam_options, how_it_runs
from recordforge.schemas.tfds_metadata import names_left_out
from recordforge.transforms.core.errors import (
    RunFailed,
    Stopped,
    UsageError,
    WorkerLost,
)
from recordforge.transforms.core.files.naming import MANIFEST_FILE_BESIDE_TFDS
from recordforge.transforms.core.planning.sharding import human_size
from recordforge.transforms.core.reports.summary import plural, printable
from recordforge.transforms.internals import (
    subcommand_parser,
)
from recordforge.transforms.staging import JOURNAL

LOGGER = logging.getLogger("recordforge")


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
        from recordforge.command import handle_stops

        handle_stops()
    parser = _parser()
    stdout = sys.stdout
    sys.stdout = _WatchedStdout(stdout)
    try:
        if beam_argv is None:
            args, beam_args = parser.parse_known_args(argv)
        else:
            args, beam_args = parser.parse_args(argv), list(beam_argv)
        _configure_logging(args.verbose - args.quiet)
        handler = args.handler
        if submit_only and handler is convert_command:
            handler = submit_conversion
        status = handler(args, beam_args)
        sys.stdout.flush()
        return status
    except UsageError as error:
        print(f"recordforge: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except RunFailed as error:  # before the pipeline: an output folder that cannot be listed
        print(f"recordforge: failed: {error}; nothing was written", file=sys.stderr)
        return EXIT_FAILED
    except Stopped as stop:
        print(f"recordforge: stopped by {stop.name}; nothing was written", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:
        print("recordforge: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `recordforge plan --json ... | head`: the reader has all it wants. The work is done;
        # send what is left to /dev/null so the exit does not fail flushing it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as error:
        if not _stdout_fails():
            raise
        print(f"recordforge: error: cannot write to stdout: {error.strerror}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        sys.stdout = stdout


class _WatchedStdout:
    """sys.stdout, noting a failed write (a full disk, /dev/full) so that it can be told from
    any other OSError."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.failed = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            self.failed = True
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self.failed = True
            raise

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _stdout_fails() -> bool:
    """Whether a write to stdout failed; its unwritten text is then dropped, so that the exit
    does not fail flushing it again."""
    if not (isinstance(sys.stdout, _WatchedStdout) and sys.stdout.failed):
        return False
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    return True


def _print_summary_or_warn(*args, **kwargs) -> None:
    """The summary of a run whose dataset is in place: an unwritable stdout does not make it
    a failed run."""
    try:
        _print_summary(*args, **kwargs)
        sys.stdout.flush()
    except OSError as error:
        if isinstance(error, BrokenPipeError) or not _stdout_fails():
            raise  # a reader that stopped (`| head`) is no failure: main says nothing of it
        print(
            f"recordforge: warning: the summary could not be written to stdout "
            f"({error.strerror}); the dataset is in place",
            file=sys.stderr,
        )


def _parser() -> argparse.ArgumentParser:
    # No abbreviations: a misspelt option must not silently match one of ours (--num-host).
    parser = cli_options.OneLineParser(
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
    cli_options.add_output_options(reshard, resumable=False)
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
    return subcommand_parser(_parser(), command)


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


def _progress_of(args: argparse.Namespace, phases=progress.CONVERT_PHASES):
    """Bars on a terminal, status lines elsewhere (stderr), none with --quiet."""
    return None if args.quiet else progress.monitor(phases=phases)


def convert_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    monitor = _progress_of(args)  # (a bad RECORDFORGE_PROGRESS_SECONDS: before anything runs)
    output, config, options, prepared, chosen = api.prepare_conversion(args, beam_args)
    staging = prepared.staging
    started = time.monotonic()
    try:
        if args.resume and prepared.nothing_to_resume(config.run_key):
            print(
                f"--resume: the interrupted run had reached its commit; finished it into {output}"
            )
        else:
            run_pipeline(
                options,
                lambda pipeline: build_pipeline(pipeline, config),
                progress=monitor,
            )
    except (Stopped, WorkerLost) as stop:
        return report_stop(stop, prepared)
    except Exception as error:  # noqa: BLE001  (the runner wraps worker errors in many types)
        from recordforge.command import received_stop

        stop = received_stop()  # Beam re-raises a Stopped raised inside a DoFn, wrapped
        if stop is not None:
            return report_stop(stop, prepared)
        if not only_cleanup_failed(error, prepared):
            return report_failure(error, prepared)
    finally:
        prepared.release()
    dataset = open_dataset(output)
    how = how_it_runs(options, chosen_in_words(chosen) if chosen else "")
    _print_summary_or_warn(dataset, time.monotonic() - started, how)
    if staging.mode == JOURNAL and staging.reason:
        print(f"  committed file by file (not by one folder swap): {staging.reason}")
    return EXIT_OK


def reshard_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    monitor = _progress_of(args, progress.RESHARD_PHASES)
    output, config, inputs, options, prepared = prepare_reshard(args, beam_args)
    started = time.monotonic()
    try:
        run_reshard(config, inputs, options, progress=monitor)
    except (Stopped, WorkerLost) as stop:
        return report_stop(stop, prepared)
    except Exception as error:  # noqa: BLE001  (the runner wraps worker errors in many types)
        from recordforge.command import received_stop

        stop = received_stop()
        if stop is not None:
            return report_stop(stop, prepared)
        if not only_cleanup_failed(error, prepared):
            return report_failure(error, prepared)
    finally:
        prepared.release()
    seconds = time.monotonic() - started
    _print_summary_or_warn(open_dataset(output), seconds, how_it_runs(options), verb="Resharded")
    return EXIT_OK


def submit_conversion(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    """`convert` that returns once the runner has the job, without waiting for it to finish."""
    output, config, options, prepared, _ = api.prepare_conversion(args, beam_args, detached=True)
    try:
        run_pipeline(options, lambda pipeline: build_pipeline(pipeline, config), wait=False)
    except Exception as error:  # noqa: BLE001  (the runner wraps submission errors in many types)
        prepared.release()
        LOGGER.error("the conversion could not be submitted", exc_info=error)
        return EXIT_FAILED
    except BaseException:
        prepared.release()
        raise
    # The job's commit releases the lock.
    print(f"Submitted the conversion into {output}; its dataset_info.json appears when it is done")
    return EXIT_OK


# What a record is, by the manifest's source kind, for the summary's rate.
_RECORDS_ARE = {"images": "images", "csv": "rows"}


def _print_summary(
    dataset: DatasetFolder, seconds: float, how: str, verb: str = "Converted"
) -> None:
    manifest, output = dataset.manifest.to_dict(), dataset.folder
    print(
        f"{verb} {plural(manifest['num_inputs'], 'input')} into "
        f"{plural(manifest['num_records'], 'record')} in {seconds:.1f} s"
    )
    source = manifest.get("source") or {}
    written = sum(split["num_bytes"] for split in manifest["splits"].values())
    per_second = 1 / max(seconds, 1e-3)
    records_are = _RECORDS_ARE.get(source.get("kind"), "records")
    print(
        f"  {manifest['num_records'] * per_second:,.0f} {records_are}/s, "
        f"{written * per_second / 1e6:,.1f} MB/s written; ran {how}"
    )
    if source.get("splits"):  # the splits the inputs named: folders, names, SOURCE=SPLIT
        named = source["splits"]
        if isinstance(named, list):  # reshard's: the splits of the input files
            named = "splits kept from the inputs: " + ", ".join(named)
        print(f"  {named}")
    print(f"  {'split':<14}{'records':>12}{'shards':>8}{'bytes':>14}")
    for name, split in manifest["splits"].items():
        print(
            f"  {printable(name):<14}{split['num_records']:>12,}{split['num_shards']:>8,}"
            f"{human_size(split['num_bytes']):>14}"
        )
    requested = ((manifest.get("plan") or {}).get("config") or {}).get("num_shards")
    for name, split in ((manifest.get("plan") or {}).get("splits") or {}).items():
        if requested is not None and split.get("num_shards", requested) < requested:
            print(f"  {printable(name)}: {split['reason']}")  # --num-shards was not kept
    labels = manifest.get("labels")
    if labels:
        # A class name's control characters (a line break, an escape sequence) are escaped.
        shown = ", ".join(map(printable, labels[:8])) + (", ..." if len(labels) > 8 else "")
        print(f"  {plural(len(labels), 'class')}: {shown}")
    if source.get("labels"):  # why folders gave labels, or did not
        print(f"  {source['labels']}")
    if dataset.manifest_file == MANIFEST_FILE_BESIDE_TFDS and names_left_out(dataset.manifest):
        print(
            "  TFDS: a class name has a line break or leading or trailing spaces, which its "
            "labels file cannot hold: its ClassLabel has ids only (the manifest keeps the names)"
        )
    followed = (manifest.get("options") or {}).get("follow_symlinks")
    skipped = [
        f"{source[key]:,} {words}"
        for key, words in (
            ("duplicate_files", "files reached a second time (converted once)"),
            (
                "symlinked_folders_not_followed",
                # With --follow-symlinks, the links counted lead to folders already walked.
                "links to folders already walked (a loop or a second way in)"
                if followed
                else "links to folders not followed",
            ),
        )
        if source.get(key)
    ]
    if skipped:
        print(f"  skipped: {'; '.join(skipped)}")
    errors = manifest["errors"]
    if errors["count"]:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in errors["by_kind"].items())
        files = ", ".join(FileSystems.join(output, f) for f in errors["files"])
        failed = f"{errors['count']:,} of {manifest['num_inputs']:,} inputs failed ({kinds})"
        # On stdout with the summary (a job keeping only stdout keeps it), and as a warning.
        print(f"  {failed}: the reasons are in {files}")
        print(f"WARNING: {failed}; details in {files}", file=sys.stderr)
    else:
        print("  no errors")
    print(f"Dataset: {dataset.path(dataset.manifest_file)}")


def plan_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    monitor = _progress_of(args, progress.PLAN_PHASES)
    try:
        report = api.run_plan(args, beam_args, progress=monitor)
    except api.REFUSED as failure:  # an input that cannot be read to its end, say
        print(f"recordforge: failed: {failure}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print(str(api.Plan(report, args.num_hosts)))
    return EXIT_OK


def verify_command(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    from recordforge.pipelines import verify

    if args.max_findings < 0:
        raise UsageError("--max-findings must be 0 (list all) or more")
    # Beam options (say, a project for gs://) reach the filesystems; no pipeline runs.
    FileSystems.set_options(beam_options(beam_args))
    report = api.verify(args.folder, deep=args.deep, max_findings=args.max_findings)
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
