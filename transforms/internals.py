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
import itertools
import re
import sys
import threading
from collections.abc import Callable, Iterator

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
    # pipelines/dask_tasks.py runs a bundle as Beam's own DoFn runner does.
    "OutputHandler": ("apache_beam.runners.common", "_OutputHandler"),
    "DoFnContext": ("apache_beam.runners.common", "DoFnContext"),
    "DoFnInvoker": ("apache_beam.runners.common", "DoFnInvoker"),
    "DoFnSignature": ("apache_beam.runners.common", "DoFnSignature"),
    "Receiver": ("apache_beam.runners.common", "Receiver"),
    "SideInputMap": ("apache_beam.transforms.sideinputs", "SideInputMap"),
    # Beam's DaskRunner, the class pipelines/dask_runner.py extends, and the placeholders its
    # overrides put in the graph, which that runner translates.
    "BeamDaskRunner": ("apache_beam.runners.dask.dask_runner", "DaskRunner"),
    "DaskOptions": ("apache_beam.runners.dask.dask_runner", "DaskOptions"),
    "dask_overrides": ("apache_beam.runners.dask.overrides", "dask_overrides"),
    "DaskCreate": ("apache_beam.runners.dask.overrides", "_Create"),
    "DaskReshuffle": ("apache_beam.runners.dask.overrides", "_Reshuffle"),
    "DaskGroupByKeyOnly": ("apache_beam.runners.dask.overrides", "_GroupByKeyOnly"),
    "DaskGroupAlsoByWindow": ("apache_beam.runners.dask.overrides", "_GroupAlsoByWindow"),
    "DaskFlattenTransform": ("apache_beam.runners.dask.overrides", "_Flatten"),
    # pipelines/dask_metrics.py: a Dask bundle's counters land in a container the runner reads,
    # found through the thread's state sampler (state_sampler below) as on Beam's own workers.
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


def fn_api_runner(progress_seconds: float | None = None, **runner_arguments):
    """Beam's FnApiRunner: local, in-process or multi-process.

    Its worker processes (`--direct_running_mode=multi_processing`) start with recordforge's
    worker entry point (`recordforge.worker`) instead of Beam's own, which runs the
    same SDK worker without importing the connectors a conversion never uses.

    With `progress_seconds`, one whose `metrics()` also answers while `run()` runs the job
    (Beam's answers only from the result `run()` returns): the bundles finished so far and
    the running ones' figures, asked of the workers every `progress_seconds`.
    """
    _require_tested_beam()
    if progress_seconds is None:
        return _lean_workers_fn_api_runner_class()(**runner_arguments)
    return _live_fn_api_runner_class()(progress_seconds, **runner_arguments)


# The module FnApiRunner's worker processes run (`python -m WORKER_MODULE`).
WORKER_MODULE = "recordforge.worker"


def worker_commands() -> tuple[str, str]:
    """The command line Beam's FnApiRunner gives its worker processes in multi-processing mode
    (spelt as fn_runner.FnApiRunner.run_pipeline spells it), and recordforge's."""
    beam = f"{sys.executable} -m apache_beam.runners.worker.sdk_worker_main"
    return beam, f"{sys.executable} -m {WORKER_MODULE}"


# The environment of worker processes forked by recordforge's fork server (a recordforge URN:
# FnApiRunner looks up the worker handler of an environment by its URN).
FORKED_WORKERS_URN = "recordforge:env:forked_python_workers:v1"


def run_sdk_worker(argv: list[str]) -> None:
    """Beam's SDK worker: connects to the runner named in its environment variables and runs
    the bundles the runner sends until the runner closes the connection."""
    import_sdk_worker().main(argv)


def import_sdk_worker():
    """Beam's SDK worker module (imported by the fork server before it forks workers)."""
    from apache_beam.runners.worker import sdk_worker_main

    install_quick_state_sampler()  # for good: the process is a worker of recordforge's
    return sdk_worker_main


class _SharedPatch:
    """A patch of a dependency's module, in place while any run that needs it is active.

    Runs may overlap (library calls from several threads): the first to start installs the
    patch, the last to end removes it. Each run installing and restoring its own would leave
    the patch in place for good when they end in another order than they started.
    """

    def __init__(self, install: Callable[[], Callable[[], None]]) -> None:
        self._install = install  # installs the patch, returns what removes it
        self._lock = threading.Lock()
        self._users = 0
        self._remove: Callable[[], None] | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with self._lock:
            if not self._users:
                self._remove = self._install()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if not self._users:
                    self._remove()
                    self._remove = None


def _replaced(module, name: str, replacement) -> Callable[[], None]:
    """Set `module.name` to `replacement`; return what puts the original back."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    return lambda: setattr(module, name, original)


# Beam's state sampler times each step of a bundle (Beam's msecs metrics) from a thread that
# sleeps between samples, the sleeps growing to its period (200 ms by default); stopping it at
# the end of every bundle joins that thread, so waits out the sleep in progress
# (statesampler_fast.pyx: StateSampler.stop), on average half a period for a bundle longer
# than a second (docs/performance.md, "The end of every bundle"). Sampled at this period,
# a bundle ends within it.
STATE_SAMPLING_PERIOD_MS = 10


@functools.cache
def _quick_state_sampler_class() -> type:
    _require_tested_beam()
    from apache_beam.runners.worker import statesampler

    class QuickStateSampler(statesampler.StateSampler):
        """Beam's state sampler, at STATE_SAMPLING_PERIOD_MS unless told otherwise."""

        def __init__(
            self, prefix, counter_factory, sampling_period_ms=STATE_SAMPLING_PERIOD_MS
        ) -> None:
            super().__init__(prefix, counter_factory, sampling_period_ms)

    return QuickStateSampler


@functools.cache
def _quick_samplers_while_runs() -> _SharedPatch:
    """`statesampler.StateSampler`, which `bundle_processor.BundleProcessor` looks up when it
    is made, as QuickStateSampler while a run of recordforge's FnApiRunner lasts."""
    from apache_beam.runners.worker import statesampler

    return _SharedPatch(
        lambda: _replaced(statesampler, "StateSampler", _quick_state_sampler_class())
    )


def install_quick_state_sampler() -> None:
    """For good, in a process that is recordforge's worker (and the processes forked from it):
    the bundle processors Beam creates sample at STATE_SAMPLING_PERIOD_MS."""
    from apache_beam.runners.worker import statesampler

    statesampler.StateSampler = _quick_state_sampler_class()


def state_sampler(prefix: str, counter_factory):
    """A state sampler of its own (a Dask task's): Beam's, stopping within
    STATE_SAMPLING_PERIOD_MS."""
    return _quick_state_sampler_class()(prefix, counter_factory)


@functools.cache
def _lean_workers_fn_api_runner_class() -> type:
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    class LeanWorkersFnApiRunner(fn_runner.FnApiRunner):
        """FnApiRunner whose worker processes run recordforge's worker entry point.

        Beam picks the workers' command inside `run_pipeline` (from --direct_running_mode)
        and writes it into the pipeline proto's environment: an environment that runs Beam's
        default command gets recordforge's here, just before the proto runs. Any other
        environment (a command the user chose) is left as it is.
        """

        def run_via_runner_api(self, pipeline_proto, options):
            with contextlib.ExitStack() as run:
                run.enter_context(_quick_samplers_while_runs().active())
                if use_recordforge_workers(pipeline_proto) and FORK_WORKERS:
                    run.enter_context(forked_workers())
                return super().run_via_runner_api(pipeline_proto, options)

    _forked_worker_handler_class()
    return LeanWorkersFnApiRunner


# Workers are forked on Linux only: elsewhere (macOS) system libraries are not safe to use in a
# child forked without exec (CPython's multiprocessing spawns there), and each worker starts
# as its own `python -m recordforge.worker` process, as Beam starts its own.
FORK_WORKERS = sys.platform.startswith("linux")


def use_recordforge_workers(pipeline_proto) -> int:
    """Make the environments of `pipeline_proto` that run Beam's default worker command run
    recordforge's workers instead, forked by its fork server (FORKED_WORKERS_URN) where
    FORK_WORKERS; returns how many it changed."""
    from apache_beam.portability import python_urns

    beam, lean = (command.encode() for command in worker_commands())
    changed = 0
    for environment in pipeline_proto.components.environments.values():
        if environment.urn == python_urns.SUBPROCESS_SDK and environment.payload == beam:
            if FORK_WORKERS:
                environment.urn = FORKED_WORKERS_URN
            environment.payload = lean
            changed += 1
    return changed


_fork_servers: list = []  # the fork server of the run in progress (one FnApiRunner run at a time)


def fork_server_command() -> list[str]:
    """The command of the fork server of FORKED_WORKERS_URN's workers."""
    from recordforge.worker_forks import FORK_SERVER_FLAG

    return [sys.executable, "-m", WORKER_MODULE, FORK_SERVER_FLAG]


@contextlib.contextmanager
def forked_workers() -> Iterator[None]:
    """While the block runs, a fork server (recordforge/worker_forks.py) is up for the
    FORKED_WORKERS_URN environments' workers (the one the program prestarted, if any); it is
    ended (with any worker left) after."""
    from recordforge.worker_forks import ForkServer, take_prestarted

    server = take_prestarted() or ForkServer(fork_server_command())
    _fork_servers.append(server)
    try:
        yield
    finally:
        _fork_servers.remove(server)
        server.close()


@functools.cache
def _forked_worker_handler_class() -> type:
    """FnApiRunner's worker handler for FORKED_WORKERS_URN: Beam's SubprocessSdkWorkerHandler
    with SubprocessSdkWorker.run's steps, the worker process forked rather than started."""
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc, endpoints_pb2
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    from apache_beam.utils import thread_pool_executor
    from google.protobuf import json_format, text_format

    from recordforge.worker_forks import ForkServerGone

    @worker_handlers.WorkerHandler.register_environment(FORKED_WORKERS_URN, bytes)
    class ForkedWorkerHandler(worker_handlers.GrpcWorkerHandler):
        def __init__(self, command, state, provision_info, grpc_server) -> None:
            super().__init__(state, provision_info, grpc_server)

        def start_worker(self) -> None:
            server = _fork_servers[-1]
            self.worker_thread = threading.Thread(
                name="run_worker", target=self._run_worker, args=(server,)
            )
            self.worker_thread.start()

        def stop_worker(self) -> None:
            self.worker_thread.join()

        def _run_worker(self, server) -> None:
            logging_server = grpc.server(
                thread_pool_executor.shared_unbounded_instance(),
                options=[
                    ("grpc.http2.max_pings_without_data", 0),
                    ("grpc.http2.max_ping_strikes", 0),
                ],
            )
            logging_port = logging_server.add_insecure_port("127.0.0.1:0")
            logging_server.start()
            beam_fn_api_pb2_grpc.add_BeamFnLoggingServicer_to_server(
                local_job_service.BeamFnLoggingServicer(), logging_server
            )
            env = {
                "CONTROL_API_SERVICE_DESCRIPTOR": text_format.MessageToString(
                    endpoints_pb2.ApiServiceDescriptor(url=self.control_address)
                ),
                "LOGGING_API_SERVICE_DESCRIPTOR": text_format.MessageToString(
                    endpoints_pb2.ApiServiceDescriptor(url=f"127.0.0.1:{logging_port}")
                ),
                "PIPELINE_OPTIONS": json_format.MessageToJson(
                    self.provision_info.provision_info.pipeline_options
                ),
            }
            if self.worker_id:
                env["WORKER_ID"] = self.worker_id
            try:
                try:
                    code = server.run_worker(env)
                except ForkServerGone as gone:
                    raise RuntimeError(f"{FN_API_LOST_WORKER} unknown: {gone}") from gone
                if code:
                    # The text Beam's own handler raises, which recordforge/command.py reads.
                    raise RuntimeError(f"{FN_API_LOST_WORKER} {code}")
            finally:
                logging_server.stop(0)

    return ForkedWorkerHandler


class _RunningBundles:
    """The MonitoringInfos of a FnApiRunner run so far: each stage's finished bundles, and the
    latest progress of the bundles running now (all of one stage: FnApiRunner executes one
    stage's bundle, or its parallel parts, at a time).

    A running bundle's figures are dropped when its stage's bundle finishes and its final
    figures are added: a report that arrives for a bundle already ended is ignored, so nothing
    is counted twice. Only user metrics are kept (Beam's own, per PCollection and transform,
    are many, and the run's result holds them all).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finished: dict[str, list] = {}  # stage -> consolidated MonitoringInfos
        self._stage: str | None = None
        self._running: dict[str, list] = {}  # bundle (instruction id) -> its latest figures
        self._ended: set[str] = set()

    def start(self, stage: str) -> None:
        with self._lock:
            self._stage = stage

    def progress(self, instruction_id: str, infos) -> None:
        infos = _user_metrics(infos)
        if not infos:  # not started yet, or already gone: nothing to show
            return
        with self._lock:
            if instruction_id not in self._ended:
                self._running[instruction_id] = list(infos)

    def ended(self, instruction_id: str) -> None:
        with self._lock:
            self._ended.add(instruction_id)

    def finished(self, stage: str, infos) -> None:
        from apache_beam.metrics.monitoring_infos import consolidate

        infos = _user_metrics(infos)
        with self._lock:
            self._finished[stage] = list(consolidate([*self._finished.get(stage, ()), *infos]))
            self._ended.update(self._running)
            self._running.clear()

    def by_stage(self) -> dict[str, list]:
        from apache_beam.metrics.monitoring_infos import consolidate

        with self._lock:
            stages = dict(self._finished)
            if self._running:
                running = [info for infos in self._running.values() for info in infos]
                stages[self._stage] = list(consolidate([*stages.get(self._stage, ()), *running]))
        return stages


def _user_metrics(infos) -> list:
    from apache_beam.metrics.monitoring_infos import is_user_monitoring_info

    return [info for info in infos if is_user_monitoring_info(info)]


# Worker handlers (by id) of bundles running now -> the run's _RunningBundles.
_REPORTING_HANDLERS: dict[int, _RunningBundles] = {}


@functools.cache
def _live_fn_api_runner_class() -> type:
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner, worker_handlers

    beam_requester = fn_runner.ProgressRequester

    class ReportingProgressRequester(beam_requester):
        """Beam's requester of a running bundle's progress (it asks gRPC workers every
        `progress_request_frequency`), handing the answers to the run's _RunningBundles:
        Beam's bundle manager gives it no callback."""

        def __init__(self, worker_handler, instruction_id, frequency, callback=None) -> None:
            self._bundles = _REPORTING_HANDLERS.get(id(worker_handler))
            if self._bundles is not None and callback is None:
                bundles = self._bundles

                def callback(response) -> None:
                    bundles.progress(instruction_id, response.monitoring_infos)

            super().__init__(worker_handler, instruction_id, frequency, callback)

        def __exit__(self, *exc_info) -> None:
            super().__exit__(*exc_info)
            if self._bundles is not None:
                self._bundles.ended(self._instruction_id)

    # While any live run lasts, Beam's bundle managers use ReportingProgressRequester (the
    # name they look up when a bundle starts); for other runs it acts as Beam's.
    requesters_reporting = _SharedPatch(
        lambda: _replaced(fn_runner, "ProgressRequester", ReportingProgressRequester)
    ).active

    class InProcessPoller:
        """Asks in-process workers for the progress of the bundles they run, from a thread.

        An in-process worker runs a bundle inside the request that starts it, so Beam's
        requester only starts once the bundle is done; here the running bundles are found in
        the worker's cache of bundle processors and asked with Beam's progress request.
        """

        def __init__(self, handlers, bundles: _RunningBundles, seconds: float) -> None:
            self._workers = [
                h for h in handlers if type(h) is worker_handlers.EmbeddedWorkerHandler
            ]
            self._bundles = bundles
            self._seconds = seconds
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._poll, name="recordforge-bundle-progress", daemon=True
            )
            self._requests = itertools.count()

        def __enter__(self):
            if self._workers:
                self._thread.start()
            return self

        def __exit__(self, *exc_info) -> None:
            # Joined before the bundle's final figures are added: no late report follows.
            self._stop.set()
            if self._workers:
                self._thread.join()

        def _poll(self) -> None:
            while not self._stop.wait(self._seconds):
                for handler in self._workers:
                    try:
                        self._ask(handler)
                    except Exception:  # noqa: BLE001  (a bundle ending meanwhile; next time)
                        continue

        def _ask(self, handler) -> None:
            running = list(handler.worker.bundle_processor_cache.active_bundle_processors)
            for instruction_id in running:
                request = beam_fn_api_pb2.InstructionRequest(
                    # Its own id: the handler numbers requests without one, unlocked.
                    instruction_id=f"recordforge-progress-{next(self._requests)}",
                    process_bundle_progress=beam_fn_api_pb2.ProcessBundleProgressRequest(
                        instruction_id=instruction_id
                    ),
                )
                response = handler.push(request).get()
                self._bundles.progress(
                    instruction_id, response.process_bundle_progress.monitoring_infos
                )

    class LiveFnApiRunner(_lean_workers_fn_api_runner_class()):
        """FnApiRunner whose `metrics()` reports the job `run()` is running (one run each)."""

        def __init__(self, progress_seconds: float, **runner_arguments) -> None:
            # Beam's bundle managers ask gRPC workers this often (its public argument).
            super().__init__(progress_request_frequency=progress_seconds, **runner_arguments)
            self._progress_seconds = progress_seconds
            self._bundles = _RunningBundles()

        def metrics(self):
            return fn_runner.FnApiMetrics(self._bundles.by_stage(), user_metrics_only=True)

        def monitoring_infos(self) -> list:
            """The user metrics so far, as MonitoringInfos."""
            return [info for infos in self._bundles.by_stage().values() for info in infos]

        def run_stages(self, stage_context, stages):
            with requesters_reporting():
                return super().run_stages(stage_context, stages)

        def _execute_bundle(self, runner_execution_context, bundle_context_manager, bundle_input):
            stage = bundle_context_manager.stage.name
            handlers = bundle_context_manager.worker_handlers
            self._bundles.start(stage)
            for handler in handlers:
                _REPORTING_HANDLERS[id(handler)] = self._bundles
            try:
                with InProcessPoller(handlers, self._bundles, self._progress_seconds):
                    result = super()._execute_bundle(
                        runner_execution_context, bundle_context_manager, bundle_input
                    )
            finally:
                for handler in handlers:
                    _REPORTING_HANDLERS.pop(id(handler), None)
            self._bundles.finished(stage, result.process_bundle.monitoring_infos)
            return result

    return LiveFnApiRunner


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
    with _DOFNS_INSPECTED_ONCE.active():
        yield


def _inspect_dofns_once() -> Callable[[], None]:
    from apache_beam.transforms import userstate

    original = userstate.get_dofn_specs
    answers: dict[int, tuple] = {}  # id(dofn) -> (dofn, (state specs, timer specs))

    def inspected_once(dofn):
        known = answers.get(id(dofn))
        if known is None:
            known = answers[id(dofn)] = (dofn, original(dofn))
        state_specs, timer_specs = known[1]
        return set(state_specs), set(timer_specs)  # callers get their own sets, as before

    return _replaced(userstate, "get_dofn_specs", inspected_once)


# Beam's job service asks its jobs' runners this often for the figures of running bundles.
_JOB_SERVICE_ASK_SECONDS = 1.0


@contextlib.contextmanager
def job_service_reporting_running_jobs() -> Iterator[None]:
    """While active, Beam's Python job service (`local_job_service`) runs each job on the
    FnApiRunner of `fn_api_runner(progress_seconds)` and answers `GetJobMetrics` for a running
    job with its figures so far, as attempted metrics (what Flink's job service does); Beam's
    answers nothing until the job is done, then the committed final figures, as before.
    """
    _require_tested_beam()
    with _JOB_SERVICE_REPORTING.active():
        yield


def _report_running_jobs() -> Callable[[], None]:
    from apache_beam.portability.api import beam_job_api_pb2
    from apache_beam.runners.portability import local_job_service

    job_class, servicer = local_job_service.BeamJob, local_job_service.LocalJobServicer
    invoke_runner, job_metrics = job_class._invoke_runner, servicer.GetJobMetrics

    def invoke_live_runner(job):
        job.set_state(beam_job_api_pb2.JobState.RUNNING)
        job.recordforge_runner = fn_api_runner(
            _JOB_SERVICE_ASK_SECONDS, provision_info=job._provision_info
        )
        return job.recordforge_runner.run_via_runner_api(
            job._pipeline_proto, job.pipeline_options()
        )

    def metrics_while_running(service, request, context=None):
        job = service._jobs.get(request.job_id)
        runner = getattr(job, "recordforge_runner", None)
        if job is None or job.result is not None or runner is None:
            return job_metrics(service, request, context)
        return beam_job_api_pb2.GetJobMetricsResponse(
            metrics=beam_job_api_pb2.MetricResults(attempted=runner.monitoring_infos())
        )

    job_class._invoke_runner, servicer.GetJobMetrics = invoke_live_runner, metrics_while_running

    def restore() -> None:
        job_class._invoke_runner, servicer.GetJobMetrics = invoke_runner, job_metrics

    return restore


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
    with _GRPC_ON_LOOPBACK.active():
        yield


def _grpc_on_loopback() -> Callable[[], None]:
    import grpc

    original = grpc.server

    def loopback_server(*args, **kwargs):
        server = original(*args, **kwargs)
        add_port = server.add_insecure_port
        server.add_insecure_port = lambda address: add_port(_loopback(address))
        return server

    return _replaced(grpc, "server", loopback_server)


_DOFNS_INSPECTED_ONCE = _SharedPatch(_inspect_dofns_once)
_JOB_SERVICE_REPORTING = _SharedPatch(_report_running_jobs)
_GRPC_ON_LOOPBACK = _SharedPatch(_grpc_on_loopback)


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
# What Dask's client raises for the tasks of a run whose scheduler it lost.
LOST_SCHEDULER_TEXTS = ("scheduler-connection-lost",)
# What Beam's DoFn runner appends to the message of an exception it re-raises.
_STEP_SUFFIX = " [while running"


def lost_job_service_detail(error: BaseException) -> str | None:
    """What a portable runner's job service that went away (or stopped answering) left in this
    one exception, else None: Beam raises the gRPC error of its connection as it is."""
    import grpc

    if isinstance(error, grpc.FutureTimeoutError):  # gone before the job was submitted
        return "it no longer answers"
    if isinstance(error, grpc.RpcError) and callable(getattr(error, "code", None)):
        code = error.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            details = (error.details() or "").strip().splitlines() or [""]
            return f"{code.name}: {details[0][:200]}"
    return None


def failed_step(message: str) -> str | None:
    """The step Beam's DoFn runner named in an exception's message ("A/B/C/ParDo(_Fn)"), or
    None."""
    found = re.search(re.escape(_STEP_SUFFIX) + r" '([^'\n]+)'\]", message)
    return found.group(1) if found else None


def without_step_suffix(message: str) -> str:
    """An exception's message without the step Beam's DoFn runner appended to it."""
    return message.split(_STEP_SUFFIX)[0]
