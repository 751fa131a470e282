"""Every private API of a dependency that recordforge uses, and the Beam version it was written for.

Private means not in the dependency's documented interface: names with a leading underscore,
Beam's internal modules (`apache_beam.runners.common`, `.utils.windowed_value`, the Dask
runner's translation), functions replaced while a run lasts (`grpc.server`,
`userstate.get_dofn_specs`), attributes of objects the dependency hands out (a GCS reader's
`_blob`), and the text of the exceptions its runners raise. Nothing else in the package uses
any of them: tests/test_layering.py checks that no other module imports a private module.

Beam's internals were read in Beam 2.77 (TESTED_BEAM). Any other Beam is refused the first time
one of them is used, with UntestedBeamVersion (one line from the command, exit status 2),
rather than warned about: pyproject pins `apache-beam==2.77.0`, so only a deliberate override
reaches another version, and these internals decide where a DoFn's outputs go on Dask and what
Beam caches between stages; a change there could lose or mix records without an error, which
a warning in a worker's log would not stop. Upgrading Beam means reading each use below
against the new source, running the test suite, and then moving TESTED_BEAM.

argparse's privates (`_actions` and the action classes) belong to the standard library and are
unchanged since Python 3.2; grpc's and google-cloud-storage's objects are used only through
their public attributes, reached through Beam: neither gets a version check of its own.

This module imports nothing heavy: recordforge/command.py reads the lost-worker text before
Beam is imported. Beam's internal names load on first use (`from
recordforge.transforms.internals import WindowedValue` loads it then), after the version check.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
from collections.abc import Iterator

from recordforge.transforms.core.errors import UsageError

# The Beam release (major.minor) whose internals this module was written against.
TESTED_BEAM = "2.77"


class UntestedBeamVersion(UsageError):
    """The installed Beam is not the one whose internals recordforge was written for."""


def check_beam_version(found: str) -> None:
    """Refuse a Beam release other than TESTED_BEAM (patch releases of it are accepted).

    Raises:
        UntestedBeamVersion: `found` is another release.
    """
    if found.split(".")[:2] != TESTED_BEAM.split("."):
        raise UntestedBeamVersion(
            f"apache-beam {found} is installed, but recordforge uses internals of Beam "
            f"{TESTED_BEAM} that other releases may change; install apache-beam=={TESTED_BEAM}.*"
        )


@functools.cache
def _require_tested_beam() -> None:
    import apache_beam

    check_beam_version(apache_beam.__version__)


# Beam's internal names recordforge uses: the name here -> (module, name there).
_BEAM_NAMES = {
    # A finish_bundle output must carry its window (Beam's docs show these two for it).
    "WindowedValue": ("apache_beam.utils.windowed_value", "WindowedValue"),
    "MIN_TIMESTAMP": ("apache_beam.utils.timestamp", "MIN_TIMESTAMP"),
    # The local runner without Prism's download; not a public entry point.
    "FnApiRunner": ("apache_beam.runners.portability.fn_api_runner", "FnApiRunner"),
    # pipelines/dask_runner.py runs a bundle as Beam's own DoFn runner does.
    "OutputHandler": ("apache_beam.runners.common", "_OutputHandler"),
    "DoFnContext": ("apache_beam.runners.common", "DoFnContext"),
    "DoFnInvoker": ("apache_beam.runners.common", "DoFnInvoker"),
    "DoFnSignature": ("apache_beam.runners.common", "DoFnSignature"),
    "Receiver": ("apache_beam.runners.common", "Receiver"),
    "SideInputMap": ("apache_beam.transforms.sideinputs", "SideInputMap"),
    # Beam's DaskRunner, the class pipelines/dask_runner.py extends, and its translation.
    "BeamDaskRunner": ("apache_beam.runners.dask.dask_runner", "DaskRunner"),
    "DaskOptions": ("apache_beam.runners.dask.dask_runner", "DaskOptions"),
    "DaskRunnerResult": ("apache_beam.runners.dask.dask_runner", "DaskRunnerResult"),
    "dask_overrides": ("apache_beam.runners.dask.overrides", "dask_overrides"),
    "DaskReshuffle": ("apache_beam.runners.dask.overrides", "_Reshuffle"),
    "DASK_TRANSLATIONS": ("apache_beam.runners.dask.transform_evaluator", "TRANSLATIONS"),
    "DaskFlatten": ("apache_beam.runners.dask.transform_evaluator", "Flatten"),
    # pipelines/dask_metrics.py: a Dask bundle's counters land in a container the runner reads,
    # found through the thread's state sampler as on Beam's own workers.
    "StateSampler": ("apache_beam.runners.worker.statesampler", "StateSampler"),
    "CounterFactory": ("apache_beam.utils.counters", "CounterFactory"),
}


def __getattr__(name: str):
    """One of Beam's internal names (_BEAM_NAMES), loaded once the Beam version is checked."""
    where = _BEAM_NAMES.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _require_tested_beam()
    module, attribute = where
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


# --- Beam: bundles, runners, options ------------------------------------------------------


def in_global_window(value):
    """A finish_bundle output: `value` in the global window, at the earliest timestamp."""
    from apache_beam.transforms.window import GlobalWindow

    return __getattr__("WindowedValue")(value, __getattr__("MIN_TIMESTAMP"), [GlobalWindow()])


def fn_api_runner():
    """Beam's FnApiRunner: local, in-process or multi-process."""
    return __getattr__("FnApiRunner")()


def side_input_view(side) -> tuple[type, object]:
    """What SideInputMap needs to rebuild a side input's view (AsList, AsDict, ...)."""
    _require_tested_beam()
    return type(side), side._view_options()


def forget_cached_metrics(result) -> None:
    """Make a PortableRunner result's next `metrics()` ask the job service again: it keeps its
    first answer in the private `_metrics`, so polling would never see new figures."""
    _require_tested_beam()
    if hasattr(result, "_job_service") and hasattr(result, "_metrics"):
        result._metrics = None


def dask_bag_kwargs(dask_options: dict) -> dict:
    """The dask.bag arguments (npartitions, ...) among the Dask runner's options."""
    return __getattr__("DaskOptions")._extract_bag_kwargs(dask_options)


def add_option_arguments(options_class: type, parser: argparse.ArgumentParser) -> None:
    """Add one PipelineOptions subclass's flags to `parser`, as Beam assembles its own parser."""
    _require_tested_beam()
    options_class._add_argparse_args(parser)


@contextlib.contextmanager
def dofns_inspected_once() -> Iterator[None]:
    """While active, Beam looks for state and timer parameters in each DoFn object once.

    Beam looks for them (`userstate.get_dofn_specs`, a signature of each of a DoFn's ~30
    methods) when a ParDo is made, translated and validated, and again each time a stage
    starts: hundreds of times in a conversion, a sizeable share of building and running it on
    FnApiRunner. The answer depends only on the DoFn's methods, fixed once the object exists.
    Objects are told apart by identity (and kept alive while this is active, so that an
    identity is never reused), not by equality.
    """
    _require_tested_beam()
    from apache_beam.transforms import userstate

    original = userstate.get_dofn_specs
    answers: dict[int, tuple] = {}  # id(dofn) -> (dofn, (state specs, timer specs))

    def inspected_once(dofn):
        known = answers.get(id(dofn))
        if known is None:
            known = answers[id(dofn)] = (dofn, original(dofn))
        state_specs, timer_specs = known[1]
        return set(state_specs), set(timer_specs)  # callers get their own sets, as before

    userstate.get_dofn_specs = inspected_once
    try:
        yield
    finally:
        userstate.get_dofn_specs = original


# --- grpc: servers that Beam starts ------------------------------------------------------

# Addresses that mean "every interface"; local runs bind them to the loopback interface instead.
_WILDCARD_HOSTS = ("[::]", "0.0.0.0", "", "localhost", "[::1]")


def _loopback(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in _WILDCARD_HOSTS else address


@contextlib.contextmanager
def grpc_listeners_on_loopback() -> Iterator[None]:
    """While active, gRPC servers created in this process listen on 127.0.0.1 only.

    Beam's FnApiRunner (multi-process mode), its job service and worker pool bind `[::]:0`,
    i.e. every network interface, with no option to change it; a local conversion has no
    reason to accept connections from other machines. grpc's own API is public: what is relied
    on is that Beam creates its servers through `grpc.server` while this is active.
    """
    import grpc

    original = grpc.server

    def loopback_server(*args, **kwargs):
        server = original(*args, **kwargs)
        add_port = server.add_insecure_port
        server.add_insecure_port = lambda address: add_port(_loopback(address))
        return server

    grpc.server = loopback_server
    try:
        yield
    finally:
        grpc.server = original


# --- Beam's GCS filesystem ----------------------------------------------------------------


def gcs_object(reader):
    """The google-cloud-storage Blob behind a reader Beam's GCS filesystem opened (its
    metadata, loaded when the reader was opened: no request).

    Raises:
        AttributeError: `reader` is not such a reader (or Beam renamed the attribute).
    """
    return reader._blob


def open_gcs_reader(filesystem, path: str, read_buffer_size: int):
    """Open a gs:// object with the GcsIO that GCSFileSystem.open itself uses (the pipeline's
    credentials, project, retries), but with the given read buffer: Beam's filesystem API has
    no buffer size. Errors are those of GcsIO.open."""
    _require_tested_beam()
    return filesystem._gcsIO().open(path, "rb", read_buffer_size=read_buffer_size)


# --- argparse -------------------------------------------------------------------------------


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A parser's arguments (argparse lists them only in its private `_actions`)."""
    return parser._actions


def subcommand_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand of `parser`.

    Raises:
        KeyError: `parser` has no such subcommand.
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


def action_kind(action: argparse.Action) -> str:
    """How an option is given: "help", "repeated" (append), "switch" (store_true), "count",
    or "value"."""
    if isinstance(action, argparse._HelpAction):
        return "help"
    if isinstance(action, argparse._AppendAction):
        return "repeated"
    if isinstance(action, argparse._StoreTrueAction):
        return "switch"
    if isinstance(action, argparse._CountAction):
        return "count"
    return "value"


# --- the text of runners' exceptions --------------------------------------------------------

# What FnApiRunner's thread watching a worker process raises when that process dies.
FN_API_LOST_WORKER = "Worker subprocess exited with return code"
# What runners raise when a worker process dies (killed, out of memory) under a bundle.
LOST_WORKER_TEXTS = (
    FN_API_LOST_WORKER,  # FnApiRunner, multi-process
    "Channel closed prematurely",  # FnApiRunner: the worker's data channel
    "KilledWorker",  # Dask: a task's workers died too often
)
# What Beam's DoFn runner appends to the message of an exception it re-raises.
_STEP_SUFFIX = " [while running"


def without_step_suffix(message: str) -> str:
    """An exception's message without the step Beam's DoFn runner appended to it."""
    return message.split(_STEP_SUFFIX)[0]
