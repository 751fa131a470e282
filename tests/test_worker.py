"""recordforge's worker entry point for FnApiRunner's worker processes (recordforge.worker)."""

from __future__ import annotations

import subprocess
import sys

import apache_beam as beam
from apache_beam.portability import python_urns
from apache_beam.transforms.environments import SubprocessSDKEnvironment

from recordforge.lean_imports import UNUSED_IN_WORKERS
from recordforge.transforms import internals
from recordforge.transforms.internals import use_recordforge_workers, worker_commands

# What a worker process imports before it serves bundles, and what it keeps out.
_PROBE = """
import sys
from recordforge.lean_imports import UNUSED_IN_WORKERS, refuse
refuse(UNUSED_IN_WORKERS)
import apache_beam.runners.worker.sdk_worker_main
import apache_beam.io.gcp.gcsfilesystem  # gs:// inputs stay readable
import recordforge.transforms.convert, recordforge.transforms.write
print(sorted(n for n in sys.modules
             if any(n == u or n.startswith(u + ".") for u in UNUSED_IN_WORKERS)))
try:
    import pandas.core.frame  # the package is refused first
except ModuleNotFoundError as error:
    print("refused:", error.name)
"""


def test_a_worker_runs_beam_and_recordforge_without_the_refused_modules():
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "refused: pandas"]
    # Beam prints nothing about the missing connectors (they are optional to it).
    assert "Traceback" not in result.stderr


def test_the_refused_modules_are_installed_so_refusing_them_matters():
    import importlib.util

    installed = [name for name in UNUSED_IN_WORKERS if importlib.util.find_spec(name)]
    assert "pandas" in installed and "google.cloud.bigquery" in installed


def _proto(command: str):
    pipeline = beam.Pipeline()
    _ = pipeline | beam.Create([1]) | beam.Map(lambda x: x)
    environment = SubprocessSDKEnvironment.from_command_string(command)
    return pipeline.to_runner_api(default_environment=environment)


def _commands(proto) -> set[bytes]:
    return {e.payload for e in proto.components.environments.values() if e.payload}


def _urns(proto) -> set[str]:
    return {e.urn for e in proto.components.environments.values() if e.payload}


def test_beams_default_worker_command_becomes_recordforges_forked_workers():
    beam_command, lean_command = worker_commands()
    proto = _proto(beam_command)
    assert use_recordforge_workers(proto) >= 1
    assert _commands(proto) == {lean_command.encode()}
    assert lean_command.endswith(" -m recordforge.worker")
    assert _urns(proto) == {internals.FORKED_WORKERS_URN}  # this machine runs Linux


def test_without_fork_each_worker_is_started_with_recordforges_command(monkeypatch):
    monkeypatch.setattr(internals, "FORK_WORKERS", False)
    beam_command, lean_command = worker_commands()
    proto = _proto(beam_command)
    assert use_recordforge_workers(proto) >= 1
    assert _commands(proto) == {lean_command.encode()}
    assert _urns(proto) == {python_urns.SUBPROCESS_SDK}


def test_a_worker_command_the_user_chose_is_left_alone():
    proto = _proto(f"{sys.executable} -m my.own.worker")
    assert use_recordforge_workers(proto) == 0
    assert _commands(proto) == {f"{sys.executable} -m my.own.worker".encode()}


# The `recordforge` program run in this interpreter; then which refusable modules it loaded,
# and whether the modules it loaded were frozen (lean_imports.loading_without_collections).
_PROGRAM = """
import gc
import sys
from recordforge import command
from recordforge.lean_imports import UNUSED_IN_WORKERS
sys.argv = ["recordforge", *sys.argv[1:]]
code = command.main()
loaded = sorted({u for u in UNUSED_IN_WORKERS for n in sys.modules
                 if n == u or n.startswith(u + ".")})
print(code, loaded, gc.get_freeze_count() > 100_000)
"""


def _program(tmp_path, *args) -> str:
    result = subprocess.run(
        [sys.executable, "-c", _PROGRAM, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    # Nothing printed about the refused modules (Beam's warnings would reach the terminal).
    assert "Traceback" not in result.stderr and "WARNING" not in result.stderr, result.stderr
    return result.stdout.splitlines()[-1]


def test_the_program_converts_without_the_modules_no_command_uses(tmp_path):
    from conftest import make_image

    make_image(tmp_path / "photos" / "cats" / "0.jpg", "JPEG", size=(40, 30), seed=0)
    out = tmp_path / "out"
    assert _program(tmp_path, "convert", tmp_path / "photos", "--output", out) == "0 [] True"
    assert (out / "dataset_info.json").is_file()


def test_the_program_keeps_the_dataflow_client_for_a_dataflow_run(tmp_path):
    # Without --project and the rest the run is refused before it starts (status 2), after
    # Beam, which loads the Dataflow client with its runners, was imported.
    line = _program(
        tmp_path, "convert", tmp_path, "--output", "gs://b/out", "--runner", "DataflowRunner"
    )
    assert line == "2 ['google.cloud.dataflow', 'google.cloud.dataflow_v1beta3'] True", line


# Loading inside the block: no collection runs, what it made is frozen, the collector is as
# it was (checked in a process of its own: freezing in this one would keep pytest's garbage).
_LOADING = """
import gc
from recordforge.lean_imports import loading_without_collections
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info))
{before}
with loading_without_collections():
    import apache_beam.runners.worker.sdk_worker_main
    inside = len(collections)
print(inside, gc.get_freeze_count() > 100_000, gc.isenabled())
"""


def test_modules_load_without_collections_and_are_frozen_after():
    for before, enabled_after in (("", "True"), ("gc.disable()", "False")):
        result = subprocess.run(
            [sys.executable, "-c", _LOADING.format(before=before)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["0", "True", enabled_after]


def test_worker_processes_start_with_the_modules_they_loaded_frozen():
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    def frozen(_):
        import gc

        return gc.get_freeze_count() > 100_000

    options = PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    with beam.Pipeline(runner=internals.fn_api_runner(), options=options) as pipeline:
        assert_that(pipeline | beam.Create([1, 2]) | beam.Map(frozen), equal_to([True, True]))
