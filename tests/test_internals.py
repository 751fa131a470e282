"""recordforge.transforms.internals refuses a Beam release other than the one it was written for."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import apache_beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from recordforge import errors
from recordforge.errors import UsageError
from recordforge.pipelines.runner import beam_options
from recordforge.transforms import internals
from recordforge.transforms.internals import TESTED_BEAM, UntestedBeamVersion, check_beam_version


@pytest.fixture
def beam_release(monkeypatch):
    """Set the Beam release the checks see; the real one is checked again afterwards."""

    def pretend(version: str) -> None:
        monkeypatch.setattr(apache_beam, "__version__", version)
        internals._require_tested_beam.cache_clear()

    yield pretend
    monkeypatch.undo()
    internals._require_tested_beam.cache_clear()


def test_the_installed_beam_is_the_tested_one():
    check_beam_version(apache_beam.__version__)
    assert apache_beam.__version__.startswith(TESTED_BEAM + ".")


@pytest.mark.parametrize("version", [f"{TESTED_BEAM}.0", f"{TESTED_BEAM}.3", f"{TESTED_BEAM}.0rc1"])
def test_patch_releases_of_the_tested_beam_are_accepted(version):
    check_beam_version(version)


@pytest.mark.parametrize("version", ["2.78.0", "2.76.1", "2.7.7", "3.77.0", "2.770.0"])
def test_other_beam_releases_are_refused(version):
    with pytest.raises(UntestedBeamVersion, match=rf"apache-beam {version} is installed"):
        check_beam_version(version)


def test_the_first_use_of_an_internal_refuses_an_untested_beam(beam_release):
    beam_release("2.78.0")
    with pytest.raises(UntestedBeamVersion) as refused:
        beam_options([])  # parsing Beam's flags uses PipelineOptions._add_argparse_args
    assert isinstance(refused.value, UsageError) and isinstance(refused.value, ValueError)
    assert errors.UntestedBeamVersion is UntestedBeamVersion  # public, with the others
    with pytest.raises(UntestedBeamVersion):
        internals.__getattr__("OutputHandler")  # the Dask runner's names load the same way
    with pytest.raises(UntestedBeamVersion):
        internals.fn_api_runner()
    with pytest.raises(UntestedBeamVersion):
        internals.fn_api_runner(progress_seconds=0.5)  # the local runner that reports live
    with pytest.raises(UntestedBeamVersion), internals.job_service_reporting_running_jobs():
        pass
    with pytest.raises(UntestedBeamVersion), internals.dofns_inspected_once():
        pass
    beam_release(apache_beam.version.__version__)
    assert beam_options([]) is not None


def test_internals_has_no_other_names():
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        internals.__getattr__("Nothing")


def test_the_command_refuses_an_untested_beam_in_one_line(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "t.csv").write_text("a\n1\n")
    output = tmp_path / "out"
    program = (
        "import sys, apache_beam\n"
        "apache_beam.__version__ = '2.78.0'\n"
        f"sys.argv = ['recordforge', 'convert', {str(tmp_path / 'in' / 't.csv')!r}, '--output', "
        f"{str(output)!r}]\n"
        "from recordforge.command import main\n"
        "sys.exit(main())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "recordforge: error: apache-beam 2.78.0 is installed, but recordforge uses internals "
        f"of Beam {TESTED_BEAM} that other releases may change; install "
        f"apache-beam=={TESTED_BEAM}.*"
    ]
    assert not output.exists()


@pytest.mark.parametrize(
    "beam_args", [[], ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]]
)
def test_bundles_are_sampled_at_the_quick_period_in_process_and_in_worker_processes(beam_args):
    # Beam's sampler at its own period makes every bundle's end wait up to 200 ms for the
    # sampling thread (internals.STATE_SAMPLING_PERIOD_MS); the run's own bundles must not.
    from apache_beam.runners.worker import statesampler
    from apache_beam.testing.util import assert_that, equal_to

    def sampling_period(_):
        from apache_beam.runners.worker import statesampler

        return statesampler.get_current_tracker().sampling_period_ms

    beam_sampler = statesampler.StateSampler
    with apache_beam.Pipeline(
        runner=internals.fn_api_runner(), options=PipelineOptions(beam_args)
    ) as pipeline:
        periods = pipeline | apache_beam.Create(range(4)) | apache_beam.Map(sampling_period)
        assert_that(periods, equal_to([internals.STATE_SAMPLING_PERIOD_MS] * 4))
    assert statesampler.StateSampler is beam_sampler  # Beam's own again after the run
    assert internals.STATE_SAMPLING_PERIOD_MS < statesampler.DEFAULT_SAMPLING_PERIOD_MS


def test_a_dask_task_samples_at_the_quick_period():
    from apache_beam.utils.counters import CounterFactory

    sampler = internals.state_sampler("dask-task", CounterFactory())
    assert sampler.sampling_period_ms == internals.STATE_SAMPLING_PERIOD_MS


def test_runs_that_overlap_leave_beams_and_grpcs_functions_as_they_found_them():
    # Library calls from two threads: each run saved what it found and put it back when it
    # ended, so the one that started second and ended last put the first one's patch back for
    # good (gRPC servers of the user's own code then listened on 127.0.0.1 only).
    import grpc
    from apache_beam.runners.portability import local_job_service
    from apache_beam.transforms import userstate

    def current():
        return (
            grpc.server,
            userstate.get_dofn_specs,
            local_job_service.BeamJob._invoke_runner,
            local_job_service.LocalJobServicer.GetJobMetrics,
        )

    originals = current()
    patches = (
        internals.grpc_listeners_on_loopback,
        internals.dofns_inspected_once,
        internals.job_service_reporting_running_jobs,
    )
    first, second = contextlib.ExitStack(), contextlib.ExitStack()
    for patch in patches:
        first.enter_context(patch())
    patched = current()
    assert all(now is not then for now, then in zip(patched, originals, strict=True))
    for patch in patches:
        second.enter_context(patch())
    first.close()
    assert current() == patched  # the second run still has them
    second.close()
    assert current() == originals
