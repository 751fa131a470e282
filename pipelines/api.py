"""recordforge as a library: convert, plan and verify from Python; the CLI runs the same calls.

The keyword options of `convert` and `plan` are the command's own (`recordforge convert
--help`) with underscores, and they are parsed by the command's own parser: the two cannot
drift apart, and a value means what it means on the command line. Calls raise the exceptions
of `recordforge.errors` and print nothing; only the CLI turns them into exit statuses.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import logging
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from recordforge.pipelines import options as cli_options
from recordforge.pipelines import output as output_folder
from recordforge.pipelines import preflight
from recordforge.pipelines import progress as progress_view
from recordforge.pipelines.assembly import build_pipeline, build_plan_pipeline, run_pipeline
from recordforge.pipelines.dataset import DatasetFolder, open_dataset
from recordforge.pipelines.library_calls import check_switches, logging_as_found
from recordforge.pipelines.local_workers import LocalWorkers, choose_local_workers
from recordforge.pipelines.progress import ProgressMonitor
from recordforge.pipelines.runner import (
    beam_options,
    check_runner_reachable,
    chooses_where_it_runs,
    csv_range_settings,
    flags_of,
    runner_args,
)
from recordforge.pipelines.tables import StagedTable, staged_table, table_kind
from recordforge.pipelines.verify import VerifyReport, format_report, verify_dataset
from recordforge.schemas.features import MixedFeatureTypes
from recordforge.transforms.core.errors import (
    ErrorRateExceeded,
    FileNameTooLong,
    InputChanged,
    InputIncomplete,
    ListingFailed,
    OutOfSpace,
    OutputTaken,
    ResumeRefused,
    RunFailed,
    UsageError,
    VerifyFailed,
)
from recordforge.transforms.core.reports.summary import format_plan, plural
from recordforge.transforms.internals import parser_actions, without_step_suffix
from recordforge.transforms.write import remove_tree

LOGGER = logging.getLogger("recordforge")

# Options of the commands that are not keyword arguments: given otherwise (sources, output),
# or about the command's own printing.
_NOT_KEYWORDS = frozenset({"help", "sources", "output", "verbose", "quiet", "json"})

BeamArgs = Sequence[str] | PipelineOptions | None


def convert(
    sources,
    output: str | os.PathLike,
    *,
    beam_args: BeamArgs = None,
    progress: bool | None = None,
    **options,
):
    """Convert `sources` into a dataset in `output`; returns the dataset (a DatasetFolder).

    Args:
        sources: an image folder, image file, CSV file or glob (a path or gs:// URL), a list of
            them, or one pandas DataFrame or pyarrow Table (one row per record, converted as
            the same data written to CSV by `df.to_csv("table.csv", index=False)` or
            `pyarrow.csv.write_csv` would be; relative image paths are taken from the current
            folder).
        output: the dataset folder (local or gs://).
        beam_args: Apache Beam's options, as command-line flags
            (`["--direct_num_workers=2", "--direct_running_mode=multi_processing"]`) or a
            PipelineOptions.
        progress: show the run's progress on stderr: True always (bars on a terminal or in
            a notebook, else a status line every few seconds), False never, None (the
            default) where there is a terminal or a notebook.
        **options: the options of `recordforge convert`, with underscores: `splits`
            ("train=0.8,test=0.2" or {"train": 0.8, "test": 0.2}), `image_column`,
            `label_column`, `num_hosts`, `overwrite=True`, `allowed_root=[...]`, `runner`, ...

    Raises:
        UsageError: a bad option, source or output; nothing was written.
        RunFailed: the run refused to finish (ErrorRateExceeded, InputChanged,
            InputIncomplete, ListingFailed, OutputTaken); the output holds no new dataset.
            MixedFeatureTypes (a ValueError) likewise, when records' feature types disagree.
    """
    _check_keywords("convert", options)
    _check_progress(progress)
    output = preflight.path_argument(output, "output")
    flags = beam_flags(beam_args)
    with logging_as_found(), _staged_sources(sources, _temp_location(flags)) as (paths, tables):
        args = command_arguments("convert", paths, {"output": output, **options})
        folder = run_conversion(
            args, flags, tables=tables, progress=progress_view.library_monitor(progress)
        )
    return open_dataset(folder)


def plan(sources, *, beam_args: BeamArgs = None, progress: bool | None = None, **options) -> Plan:
    """The shard plan `convert` would make for `sources`, and its reasons; writes nothing.

    Takes the arguments of `convert` (`progress` shows listing and probing) but the output and
    its options (name, compression, ...).

    Raises:
        UsageError, RunFailed: as `convert`.
    """
    _check_keywords("plan", options)
    _check_progress(progress)
    flags = beam_flags(beam_args)
    with logging_as_found(), _staged_sources(sources, _temp_location(flags)) as (paths, tables):
        args = command_arguments("plan", paths, options)
        monitor = progress_view.library_monitor(progress, progress_view.PLAN_PHASES)
        report = run_plan(args, flags, tables=tables, progress=monitor)
    return Plan(report, args.num_hosts)


def verify(
    dataset, *, deep: bool = False, max_findings: int = 20, check: bool = False
) -> VerifyReport:
    """Re-read a dataset (a folder, or what `convert` returned) and check every file and
    record against its manifest.

    Args:
        deep: also decode every image fully.
        max_findings: findings listed per file, the rest counted (0 lists all).
        check: raise VerifyFailed when there are problems (else look at `report.ok`).

    Raises:
        UsageError: not a recordforge dataset, or a bad max_findings.
        VerifyFailed: with `check`, the dataset has problems (the exception holds the report).
    """
    if isinstance(max_findings, bool) or not isinstance(max_findings, int) or max_findings < 0:
        raise UsageError("--max-findings must be 0 (list all) or more")
    check_switches(deep=deep, check=check)
    if not isinstance(dataset, DatasetFolder):
        dataset = preflight.normalize_path(preflight.path_argument(dataset, "dataset"))
    with logging_as_found():
        report = verify_dataset(dataset, deep=deep, max_per_file=max_findings or None)
    if check and not report.ok:
        lines = format_report(report)
        raise VerifyFailed(f"{report.folder} failed verification: {lines[-1]}", report)
    return report


def _check_progress(progress: bool | None) -> None:
    if progress is not None:
        check_switches(progress=progress)


@dataclass(frozen=True)
class Plan:
    """The plan of a conversion, as `recordforge plan --json` prints it (`report`)."""

    report: dict
    num_hosts: int

    @property
    def splits(self) -> dict[str, dict]:
        """Split name → its plan: num_shards, num_records, num_bytes, shard_bytes, reasons."""
        return self.report["splits"]

    @property
    def num_inputs(self) -> int:
        return self.report["num_inputs"]

    @property
    def failed_inputs(self) -> int:
        """Inputs already known to be unusable (a conversion quarantines them)."""
        return self.report["failed_inputs"]

    @property
    def labels(self) -> list[str] | None:
        return self.report["labels"]

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self.report))

    def __str__(self) -> str:
        return "\n".join(format_plan(self.report, self.num_hosts))


# --- what the CLI runs ---------------------------------------------------------------------


def run_conversion(
    args: argparse.Namespace,
    beam_args: Sequence[str],
    *,
    tables: Sequence[StagedTable] = (),
    progress: ProgressMonitor | None = None,
) -> str:
    """Convert as the parsed `convert` options say; returns the output folder.

    The steps of `recordforge convert`, which reports their failures in its own words.

    Raises:
        UsageError: a bad option, input or output.
        RunFailed: the pipeline refused to finish (too many bad inputs, an input changed, the
            disk full); MixedFeatureTypes likewise; ResumeRefused for a `resume` that cannot.
        Whatever the runner raised for any other failure.
    """
    output, config, options, prepared, _ = prepare_conversion(args, beam_args, tables=tables)
    try:
        run_prepared(args, config, options, prepared, progress=progress)
    except Exception as error:  # noqa: BLE001  (the runner wraps worker errors in many types)
        raise_interrupt_in(error)
        refusal = refusal_in(error, (*REFUSALS, ResumeRefused, OutOfSpace, FileNameTooLong))
        if refusal is not None:
            raise refusal from error
        from recordforge.pipelines.run_outcomes import library_outcome

        if not library_outcome(error, prepared):
            raise
    finally:
        prepared.release()
    return output


def run_prepared(args: argparse.Namespace, config, options, prepared, *, progress=None) -> bool:
    """Run a prepared conversion, unless `--resume` finds the interrupted run had reached its
    commit (then the preparation finished it); returns whether a pipeline ran."""
    if args.resume and prepared.nothing_to_resume(config.run_key):
        return False
    run_pipeline(options, lambda pipeline: build_pipeline(pipeline, config), progress=progress)
    return True


def run_plan(
    args: argparse.Namespace,
    beam_args: Sequence[str],
    *,
    tables: Sequence[StagedTable] = (),
    progress: ProgressMonitor | None = None,
) -> dict:
    """The plan report of the parsed `plan` options (see `Plan`).

    Raises:
        UsageError, RunFailed: as run_conversion.
    """
    config = cli_options.build_config(args, output=None, tables=tables)
    options = pipeline_options(args, beam_args)
    config = dataclasses.replace(config, **csv_range_settings(options))
    # The workers write the report where this process can read it: on remote runners that is
    # Beam's --temp_location (gs://... on Dataflow), not a local folder of this machine.
    temp_location = options.view_as(GoogleCloudOptions).temp_location
    if temp_location:
        report_dir = FileSystems.join(temp_location, f"recordforge-plan-{uuid.uuid4().hex}")
    else:
        report_dir = tempfile.mkdtemp(prefix="recordforge-plan-")
    try:
        report_path = FileSystems.join(report_dir, "plan.json")
        run_pipeline(
            options, lambda p: build_plan_pipeline(p, config, report_path), progress=progress
        )
        return _read_json(report_path)
    except Exception as error:  # noqa: BLE001  (the runner wraps worker errors in many types)
        raise_interrupt_in(error)
        refusal = refusal_in(error)  # an input that cannot be read to its end, say
        if refusal is not None:
            raise refusal from error
        raise
    finally:
        remove_tree(report_dir)


def pipeline_options(
    args: argparse.Namespace, beam_args: Sequence[str], workers: int | None = None
) -> PipelineOptions:
    """Beam's options for `convert` and `plan`: --runner/--worker_pool expanded, then the rest;
    `workers` are the local worker processes recordforge chose (`args.workers` otherwise)."""
    workers = args.workers if workers is None else workers
    return beam_options(
        [*runner_args(args.runner, args.worker_pool, workers, beam_args), *beam_args]
    )


def choose_workers(
    args: argparse.Namespace, beam_args: Sequence[str], sources
) -> LocalWorkers | None:
    """The local worker processes recordforge chooses for a conversion whose user did not say
    where it runs (pipelines/local_workers.py); None when the user did."""
    if chooses_where_it_runs(args.runner, args.workers, beam_args):
        return None
    chosen = choose_local_workers(sources)
    LOGGER.debug(
        "running in %s (%s)",
        plural(chosen.count, "worker process") if chosen.count > 1 else "this process",
        chosen.reason,
    )
    return chosen


def prepare_conversion(
    args: argparse.Namespace,
    beam_args: Sequence[str],
    *,
    detached: bool = False,
    tables: Sequence[StagedTable] = (),
):
    """Check the options, inputs, runner and output; lock the output and stage the run.

    Returns (output folder, config, Beam options, prepared output, the worker processes
    recordforge chose or None); the caller releases the prepared output (its lock) when the run
    ends.
    """
    output = preflight.output_path(args.output)
    config = cli_options.build_config(args, output=output, tables=tables)
    chosen = choose_workers(args, beam_args, config.sources)
    options = pipeline_options(args, beam_args, workers=chosen.count if chosen else None)
    check_runner_reachable(options)
    csv_ranges = csv_range_settings(options)  # before the output is locked: it may refuse
    output_folder.check_location(output, config.sources)
    recorded = output_folder.run_options(config)
    prepared = output_folder.prepare_output(
        output,
        run_id=config.run_id,
        options=recorded,
        overwrite=args.overwrite,
        resume=args.resume,
        detached=detached,
    )
    config = dataclasses.replace(
        config,
        staging=prepared.staging,
        run_key=output_folder.run_key(recorded),
        resume=prepared.resuming is not None,
        detached=detached,
        overwrite=args.overwrite,
        **csv_ranges,
    )
    if config.split_note:
        splits = config.split_note
    elif config.roles.split_column:
        splits = f"splits from column {config.roles.split_column}"
    else:
        splits = "hashed splits: " + ", ".join(f"{n}={f:g}" for n, f in config.splits)
    LOGGER.info(
        "converting %s into %s (%s)", ", ".join(s.given for s in config.sources), output, splits
    )
    return output, config, options, prepared, chosen


# Runs the pipeline itself refuses: too many bad inputs, an input that changed during the run,
# an input not read to its end, records whose feature types disagree.
REFUSALS = (
    ErrorRateExceeded,
    InputChanged,
    InputIncomplete,
    ListingFailed,
    MixedFeatureTypes,
    OutputTaken,
)
# What a caller catches for a refused run (MixedFeatureTypes comes from the pure schemas layer,
# which cannot import RunFailed; it is a ValueError).
REFUSED = (RunFailed, MixedFeatureTypes)


def raise_interrupt_in(error: BaseException) -> None:
    """Raise the KeyboardInterrupt (Ctrl-C) a failed run's exception wraps, if it wraps one.

    FnApiRunner in this process re-raises a KeyboardInterrupt that arrived while a DoFn ran as
    a RuntimeError naming the step it interrupted: Ctrl-C in a notebook or a
    script then looked like a failed run, and `except Exception` around a call went on.
    """
    cause = error.__cause__ or error.__context__
    while cause is not None:
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from error
        cause = cause.__cause__ or cause.__context__


def refusal_in(
    error: BaseException, kinds: tuple[type[BaseException], ...] = REFUSALS
) -> BaseException | None:
    """The refusal (one of `kinds`) a failed run's exception carries, as raised; else None."""
    # Raised inside the pipeline; runners re-raise it wrapped (with the worker's traceback as
    # text when the worker was another process), so look for it by name in the chain.
    while error is not None:
        if isinstance(error, kinds):
            return type(error)(without_step_suffix(str(error)))
        text = str(error)
        for kind in kinds:
            marker = kind.__name__ + ": "
            if marker in text:
                message = without_step_suffix(text.split(marker, 1)[1].splitlines()[0])
                return kind(message)
        error = error.__cause__ or error.__context__
    return None


def _read_json(path: str) -> dict:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return json.loads(f.read().decode("utf-8"))


# --- keyword arguments as the command's options --------------------------------------------


def _command_actions(command: str, *, keywords_only: bool = True) -> dict[str, argparse.Action]:
    """The command's options that are keyword arguments, by keyword (the option's dest)."""
    from recordforge.pipelines.cli import command_parser

    actions = parser_actions(command_parser(command))
    return {
        a.dest: a
        for a in actions
        if a.option_strings and not (keywords_only and a.dest in _NOT_KEYWORDS)
    }


def _check_keywords(command: str, options: Mapping) -> None:
    actions = _command_actions(command)
    for key in options:
        if key not in actions:
            close = difflib.get_close_matches(key, actions, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"{command}() has no option {key!r}{hint}")


def command_arguments(command: str, sources: Sequence[str], options: Mapping) -> argparse.Namespace:
    """The parsed options of `recordforge COMMAND SOURCES...` given as keyword arguments.

    Raises:
        UsageError: an unknown keyword, or a value the option does not take.
    """
    from recordforge.pipelines.cli import command_parser

    actions = _command_actions(command, keywords_only=False)
    argv: list[str] = []
    for key, value in options.items():
        if key not in actions:
            raise UsageError(f"{command}() has no option {key!r}")
        argv += cli_options.keyword_flags(actions[key], key, value)
    args = command_parser(command).parse_args([*argv, "--", *sources])
    return cli_options.checked_lists(args, options)


def beam_flags(beam_args: BeamArgs) -> list[str]:
    """Beam's options as flags, from a list of flags or a PipelineOptions."""
    if beam_args is None:
        return []
    if isinstance(beam_args, PipelineOptions):
        return flags_of(beam_args)
    if isinstance(beam_args, str | bytes) or not all(isinstance(a, str) for a in beam_args):
        raise UsageError("beam_args is a list of flags (['--direct_num_workers=2']) or options")
    return list(beam_args)


def _temp_location(flags: Sequence[str]) -> str | None:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--temp_location")
    known, _ = parser.parse_known_args(list(flags))
    return known.temp_location


@contextlib.contextmanager
def _staged_sources(
    sources, temp_location: str | None
) -> Iterator[tuple[list[str], tuple[StagedTable, ...]]]:
    """(source paths, staged tables) for what `convert` and `plan` were given."""
    if table_kind(sources) is not None:
        with staged_table(sources, temp_location) as table:
            try:
                yield [table.path], (table,)
            except UsageError as error:  # name the table as the user knows it, not its file
                message = str(error)
                if table.path not in message:
                    raise
                raise UsageError(message.replace(table.path, table.label)) from None
        return
    if isinstance(sources, str | bytes | os.PathLike):
        sources = [sources]
    if not isinstance(sources, Iterable):
        raise UsageError(f"sources are paths, a DataFrame or a Table, not {sources!r}")
    sources = list(sources)
    if not sources:
        raise UsageError("no sources given")
    for source in sources:
        if table_kind(source) is not None:
            raise UsageError("give a DataFrame or a Table alone, not in a list of sources")
        if not isinstance(source, str | bytes | os.PathLike):
            raise UsageError(f"a source is a path, a DataFrame or a Table, not {source!r}")
    yield [preflight.path_argument(source, "a source") for source in sources], ()
