"""Running a pipeline: Beam options from the command line, runner names, the default runner."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import socket
from collections.abc import Sequence

from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    SetupOptions,
    StandardOptions,
)

from recordforge.pipelines.local_workers import BYTES_PER_WORKER, usable_cores
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.internals import add_option_arguments, fn_api_runner

# How long the preflight waits for a job service, worker pool or Dask scheduler to answer.
CONNECT_TIMEOUT_SECONDS = 5.0


# Short runner names recordforge adds to Beam's own (Beam knows "portable", "flink", ... but not
# Dask, whose runner lives outside its list of known runners).
RUNNER_SHORTHANDS = {
    "dask": "recordforge.pipelines.dask_runner.DaskRunner",
    "portable": "apache_beam.runners.portability.portable_runner.PortableRunner",
}
_DASK_RUNNER = RUNNER_SHORTHANDS["dask"]
# Beam's own DaskRunner mixes up multi-output DoFns (see pipelines/dask_runner.py): asked for it by
# name, recordforge runs its fixed subclass instead.
_BEAM_DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """--runner and --worker_pool: the runners recordforge is tested on, by short names."""
    group = parser.add_argument_group(
        "runner",
        "Where the pipeline runs. Default: Beam's FnApiRunner in this process (--workers N "
        "for N worker processes).",
    )
    group.add_argument(
        "--workers",
        metavar="N",
        type=int,
        help="the local runner: run the pipeline in N worker processes (short for "
        "--direct_num_workers=N --direct_running_mode=multi_processing); 1 runs it in this "
        "process. Default: chosen by the input's size, one worker process per "
        f"{BYTES_PER_WORKER // 2**20:,} MiB of local images and uncompressed CSV tables up to "
        "the cores, this process below two (the summary says which)",
    )
    group.add_argument(
        "--runner",
        metavar="NAME",
        help="'dask' (a dask.distributed cluster; needs --dask_client_address HOST:PORT), "
        "'portable' (a Beam job service; needs --job_endpoint HOST:PORT), or any Beam runner "
        "name or class path (DataflowRunner, FlinkRunner, SparkRunner, ...)",
    )
    group.add_argument(
        "--worker_pool",
        metavar="HOST:PORT",
        help="portable runners: run the Python code in this running Beam SDK worker pool "
        "(short for --environment_type=EXTERNAL --environment_config=HOST:PORT)",
    )


def runner_args(
    runner: str | None,
    worker_pool: str | None,
    workers: int | None = None,
    beam_args: Sequence[str] = (),
) -> list[str]:
    """The Beam arguments that `--runner NAME`, `--worker_pool HOST:PORT` and `--workers N`
    stand for (`beam_args`, the Beam flags given beside them, are only checked).

    Raises:
        UsageError: a runner name Beam does not know, a worker pool without a portable runner,
            or --workers that is not a positive count, beside another runner or Beam's own
            worker flags.
    """
    args = _local_workers_args(runner, workers, beam_args)
    if runner is not None:
        args.append(f"--runner={_runner_path(runner)}")
    if worker_pool is not None:
        if runner is None or _runner_path(runner) == _DASK_RUNNER:
            raise UsageError(
                "--worker_pool is for portable runners (--runner portable, FlinkRunner, "
                "SparkRunner)"
            )
        _check_address("--worker_pool", worker_pool)
        args += ["--environment_type=EXTERNAL", f"--environment_config={worker_pool}"]
    return args


def _runner_path(name: str) -> str:
    """A runner's class path (dotted names as given); Beam's short names are checked, not kept."""
    short = name.lower().removesuffix("runner")  # "dask", "Dask", "DaskRunner"
    if short in RUNNER_SHORTHANDS:
        return RUNNER_SHORTHANDS[short]
    if name == _BEAM_DASK_RUNNER:
        return _DASK_RUNNER
    if "." in name:
        return name
    known = {n.lower() for n in StandardOptions.KNOWN_RUNNER_NAMES}
    if name.lower() not in known and name.lower() + "runner" not in known:
        names = ", ".join([*RUNNER_SHORTHANDS, *StandardOptions.KNOWN_RUNNER_NAMES])
        raise UsageError(f"unknown runner {name!r}; known: {names}, or a runner's class path")
    return name


def _check_address(option: str, address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"{option} wants HOST:PORT, got {address!r}")


def beam_options(args: Sequence[str]) -> PipelineOptions:
    """PipelineOptions from the arguments recordforge itself did not recognise.

    Raises:
        UsageError: an argument that no Beam option knows either (most likely a typo), or a
            runner that lacks what it needs (an address, an installed package).
    """
    runner = _runner_from_args(args)
    if runner is not None and "." in runner:
        _import_runner_module(runner)  # registers its options (--dask_client_address, ...)
    unknown = _unknown_beam_args(args)
    if unknown:
        raise UsageError(f"unrecognised option {unknown[0]!r} (see recordforge --help)")
    options = _ViewsMadeOnce(list(args))
    # Workers import recordforge as an installed package; never pickle the launcher's session.
    options.view_as(SetupOptions).save_main_session = False
    _check_runner_needs(options)
    return options


def flags_of(options: PipelineOptions) -> list[str]:
    """The command-line flags that make `options` again (those differing from Beam's
    defaults), spelt as Beam's `PipelineOptions.from_dictionary` spells them; that method keeps
    the flags it makes only in a private attribute, so the few lines are repeated here."""
    flags = []
    # Unknown options are not kept: options made without flags parse sys.argv (Beam's rule),
    # which in a notebook or under pytest holds the host program's own arguments.
    values = options.get_all_options(drop_default=True)
    for key, value in values.items():
        if isinstance(value, bool):
            if value:
                flags.append(f"--{key}")
        elif isinstance(value, list):
            flags += [f"--{key}={item}" for item in value]
        elif isinstance(value, dict):
            flags.append(f"--{key}={json.dumps(value)}")
        elif value is not None:
            flags.append(f"--{key}={value}")
    return flags


class _ViewsMadeOnce(PipelineOptions):
    """PipelineOptions that make each view (`view_as(cls)`) once and then hand out the same one.

    Beam asks the options for a view (TypeOptions, StandardOptions, ...) for every transform it
    applies, and each new view builds an argparse parser and parses the flags again: ~480 times
    and ~0.15 s per conversion. A view holds no values of its own (they live in the options'
    shared `_all_options`), so one view per class behaves the same.
    """

    def view_as(self, cls):
        views = self.__dict__.setdefault("_views", {})
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self):
        # Copies (Pipeline deep-copies its options) and pickles make their own views.
        state = super().__getstate__()
        return {key: value for key, value in state.items() if key != "_views"}


def _runner_from_args(args: Sequence[str]) -> str | None:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--runner")
    known, _ = parser.parse_known_args(list(args))
    return known.runner


def _import_runner_module(runner: str) -> None:
    if runner == _DASK_RUNNER and importlib.util.find_spec("distributed") is None:
        raise UsageError("the Dask runner needs dask.distributed: pip install 'recordforge[dask]'")
    module = runner.rpartition(".")[0]
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise UsageError(f"cannot load the runner {runner!r}: {error}") from None


def _check_runner_needs(options: PipelineOptions) -> None:
    runner = options.view_as(StandardOptions).runner
    if runner is None:
        return
    if runner == _DASK_RUNNER and not options.get_all_options().get("address"):
        # Without an address DaskRunner would start a LocalCluster whose dashboard listens on
        # every network interface; recordforge's own local runs use FnApiRunner instead.
        raise UsageError(
            "--runner dask needs --dask_client_address HOST:PORT, a running dask scheduler "
            "(e.g. `dask scheduler --host 127.0.0.1`)"
        )
    if runner.rpartition(".")[2].lower() in ("portable", "portablerunner"):
        if not options.view_as(PortableOptions).job_endpoint:
            raise UsageError(
                "--runner portable needs --job_endpoint HOST:PORT, a running Beam job service"
            )


def check_runner_reachable(options: PipelineOptions) -> None:
    """Fail in seconds, before a pipeline is built, when a runner cannot work: a job service,
    worker pool or Dask scheduler that does not accept a connection, or Dataflow without the
    project, region and temporary location it needs.

    Raises:
        UsageError: one line naming the option and the address or what is missing.
    """
    runner = (options.view_as(StandardOptions).runner or "").rpartition(".")[2].lower()
    portable = options.view_as(PortableOptions)
    if runner in ("portable", "portablerunner") and portable.job_endpoint != "embed":
        _check_connects("--job_endpoint", "the Beam job service", portable.job_endpoint)
    if (portable.environment_type or "").upper() == "EXTERNAL" and portable.environment_config:
        _check_connects(
            "--worker_pool/--environment_config", "the SDK worker pool", portable.environment_config
        )
    if options.view_as(StandardOptions).runner == _DASK_RUNNER:
        address = options.get_all_options().get("address")
        _check_connects("--dask_client_address", "the Dask scheduler", address)
    if runner in ("dataflow", "dataflowrunner"):
        cloud = options.view_as(GoogleCloudOptions)
        missing = [
            flag
            for flag, value in (
                ("--project", cloud.project),
                ("--region", cloud.region),
                ("--temp_location", cloud.temp_location),
            )
            if not value
        ]
        if missing:
            raise UsageError(
                f"--runner DataflowRunner needs {', '.join(missing)} (the temporary location "
                "a gs:// folder its workers can write)"
            )


def _check_connects(option: str, what: str, address: str) -> None:
    scheme, _, rest = address.rpartition("://")
    host, _, port = (rest if scheme else address).rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"{option} wants HOST:PORT, got {address!r}")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_SECONDS):
            pass
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise UsageError(
            f"{what} at {address} ({option}) does not answer: {reason}; start it, or check the "
            "address"
        ) from None


_LOCAL_WORKER_FLAGS = ("--direct_num_workers", "--direct_running_mode")

# More local worker processes than this per core is a mistake (--workers 1000): each one starts
# an SDK harness of its own, and the run would spend minutes starting them.
WORKERS_PER_CORE = 16


def _local_workers_args(runner: str | None, workers: int | None, beam_args: Sequence[str]):
    if workers is None:
        return []
    if workers < 1:
        raise UsageError(f"--workers wants a count of 1 or more, got {workers}")
    cores = usable_cores()
    if workers > WORKERS_PER_CORE * cores:
        raise UsageError(
            f"--workers {workers} is more than {WORKERS_PER_CORE} worker processes for each of "
            f"the {cores} cores this process may use (at most {WORKERS_PER_CORE * cores}): "
            "each one only adds its start-up and memory"
        )
    if runner is not None:
        raise UsageError(
            "--workers is for the local runner; other runners size their workers with their "
            "own options (Dask: its cluster; Dataflow: --num_workers)"
        )
    given = sorted({a.split("=")[0] for a in beam_args if a.startswith(_LOCAL_WORKER_FLAGS)})
    if given:
        raise UsageError(f"give --workers or Beam's {' and '.join(given)}, not both")
    if workers == 1:
        return []
    return [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]


def chooses_where_it_runs(
    runner: str | None, workers: int | None, beam_args: Sequence[str]
) -> bool:
    """Whether the user said where a run goes: a runner (recordforge's --runner or Beam's),
    --workers, or Beam's local worker flags. When not, recordforge chooses the local runner's
    worker processes (pipelines/local_workers.py)."""
    named = any(a.startswith(("--runner", *_LOCAL_WORKER_FLAGS)) for a in beam_args)
    return runner is not None or workers is not None or named


def how_it_runs(options: PipelineOptions, chosen: str = "") -> str:
    """Where a run's pipeline runs, in words: 'in this process', 'in 4 worker processes', or
    'on <runner>'; with `chosen`, why recordforge chose it, in parentheses."""
    if chosen:
        return f"{how_it_runs(options)} ({chosen})"
    if not uses_default_runner(options):
        return f"on {options.view_as(StandardOptions).runner.rpartition('.')[2]}"
    workers = local_worker_processes(options)
    if workers:
        return f"in {workers} worker processes"
    return "in this process"


def local_worker_processes(options: PipelineOptions) -> int:
    """How many worker processes the local runner (FnApiRunner) runs the pipeline in; 0 when
    it runs in this process, or on another runner."""
    if not uses_default_runner(options):
        return 0
    direct = options.view_as(DirectOptions)
    workers = direct.direct_num_workers or 1
    if direct.direct_running_mode == "multi_processing" and workers != 1:
        return os.cpu_count() if workers == 0 else workers
    return 0


# How much of a CSV file one worker's task reads when a run has several workers
# (transforms/table.py): enough ranges that two or more workers share a file evenly, few
# enough that each range's fixed cost (opening, a reader, a spill file) stays small.
CSV_RANGE_BYTES = 16 << 20
CSV_RANGE_VARIABLE = "RECORDFORGE_CSV_RANGE_MB"


def csv_range_bytes(options: PipelineOptions) -> int | None:
    """The size of the ranges CSV files are read in (None: each file whole, in one task).

    One process reads a file fastest in one piece: splitting it first costs a pass over its
    bytes and buys nothing without a second worker. RECORDFORGE_CSV_RANGE_MB, when set,
    decides instead (0: whole files), on any runner.

    Raises:
        UsageError: RECORDFORGE_CSV_RANGE_MB is not a number of MB, 0 or more.
    """
    text = os.environ.get(CSV_RANGE_VARIABLE, "").strip()
    if text:
        try:
            megabytes = float(text)
        except ValueError:
            megabytes = -1.0
        if not 0 <= megabytes < float("inf"):
            raise UsageError(f"{CSV_RANGE_VARIABLE}={text!r}: expected a number of MB, 0 or more")
        return int(megabytes * (1 << 20)) or None
    if how_it_runs(options) == "in this process":
        return None
    return CSV_RANGE_BYTES


def csv_range_multiple(options: PipelineOptions) -> int:
    """How many ranges of a split CSV file make a round: the local runner's worker processes,
    to which FnApiRunner deals a stage's tasks in turn (a file of 17 ranges would give one
    worker 9 and the other 8, and the run waits for the 9th); 1 on runners that hand tasks to
    whichever worker is free."""
    return local_worker_processes(options) or 1


def csv_range_settings(options: PipelineOptions) -> dict[str, int | None]:
    """ConvertConfig's two CSV range fields for a run with these options.

    Raises:
        UsageError: as csv_range_bytes.
    """
    return {
        "csv_range_bytes": csv_range_bytes(options),
        "csv_range_multiple": csv_range_multiple(options),
    }


def _unknown_beam_args(args: Sequence[str]) -> list[str]:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for cls in _all_option_classes():
        add_option_arguments(cls, parser)
    _, unknown = parser.parse_known_args(list(args))
    return unknown


def _all_option_classes() -> list[type]:
    found, stack = [], [PipelineOptions]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


def uses_default_runner(options: PipelineOptions) -> bool:
    """Whether the user named no runner (recordforge then runs Beam's FnApiRunner in process)."""
    return options.view_as(StandardOptions).runner is None


def default_runner(progress_seconds: float | None = None):
    """Beam's FnApiRunner: local, in-process or multi-process, with no download (unlike Prism).

    With `progress_seconds`, the runner itself reports the job's metrics while `run()` runs it,
    asking its workers every `progress_seconds` (docs/design.md, "Progress")."""
    return fn_api_runner(progress_seconds)
