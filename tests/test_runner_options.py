"""--runner shorthands, --worker_pool and --workers: what they stand for, and the mistakes caught
early."""

from __future__ import annotations

import re

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    StandardOptions,
)
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from conftest import is_loopback

from recordforge.pipelines import runner
from recordforge.pipelines.runner import (
    CSV_RANGE_BYTES,
    beam_options,
    csv_range_multiple,
    csv_range_settings,
    how_it_runs,
    runner_args,
)
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.internals import dofns_inspected_once

PORTABLE = "apache_beam.runners.portability.portable_runner.PortableRunner"
DASK = "recordforge.pipelines.dask_runner.DaskRunner"


@pytest.mark.parametrize(
    ("runner", "worker_pool", "expected"),
    [
        (None, None, []),
        ("dask", None, [f"--runner={DASK}"]),
        ("DaskRunner", None, [f"--runner={DASK}"]),
        # Beam's own DaskRunner loses tagged outputs; asked for by name, the fixed one runs.
        ("apache_beam.runners.dask.dask_runner.DaskRunner", None, [f"--runner={DASK}"]),
        ("portable", None, [f"--runner={PORTABLE}"]),
        (
            "portable",
            "127.0.0.1:50000",
            [
                f"--runner={PORTABLE}",
                "--environment_type=EXTERNAL",
                "--environment_config=127.0.0.1:50000",
            ],
        ),
        # Names recordforge does not shorten go to Beam as they are.
        (
            "FlinkRunner",
            "localhost:50000",
            [
                "--runner=FlinkRunner",
                "--environment_type=EXTERNAL",
                "--environment_config=localhost:50000",
            ],
        ),
        ("DataflowRunner", None, ["--runner=DataflowRunner"]),
        ("spark", None, ["--runner=spark"]),
        ("my.module.MyRunner", None, ["--runner=my.module.MyRunner"]),
    ],
)
def test_runner_args_expand_the_short_forms(runner, worker_pool, expected):
    assert runner_args(runner, worker_pool) == expected


@pytest.mark.parametrize(
    ("runner", "worker_pool", "phrase"),
    [
        ("dusk", None, "unknown runner 'dusk'"),
        (None, "127.0.0.1:50000", "--worker_pool is for portable runners"),
        ("dask", "127.0.0.1:50000", "--worker_pool is for portable runners"),
        ("portable", "50000", "--worker_pool wants HOST:PORT"),
        ("portable", "host:port", "--worker_pool wants HOST:PORT"),
    ],
)
def test_runner_mistakes_are_usage_errors(runner, worker_pool, phrase):
    with pytest.raises(UsageError, match=phrase):
        runner_args(runner, worker_pool)


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        (None, []),
        (1, []),
        (2, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),
        (16, ["--direct_num_workers=16", "--direct_running_mode=multi_processing"]),
    ],
)
def test_workers_stand_for_beams_local_worker_flags(workers, expected):
    assert runner_args(None, None, workers) == expected


@pytest.mark.parametrize(
    ("runner", "workers", "beam_args", "phrase"),
    [
        (None, 0, [], "a count of 1 or more, got 0"),
        (None, -2, [], "a count of 1 or more, got -2"),
        ("dask", 2, [], "--workers is for the local runner"),
        ("DataflowRunner", 1, [], "--workers is for the local runner"),
        (None, 2, ["--direct_num_workers=4"], "give --workers or Beam's --direct_num_workers,"),
        (
            None,
            1,
            ["--direct_running_mode=multi_processing", "--direct_num_workers", "2"],
            "Beam's --direct_num_workers and --direct_running_mode, not both",
        ),
    ],
)
def test_workers_mistakes_are_usage_errors(runner, workers, beam_args, phrase):
    with pytest.raises(UsageError, match=re.escape(phrase)):
        runner_args(runner, None, workers, beam_args)


def test_more_workers_than_the_cores_can_start_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(runner, "usable_cores", lambda: 2)
    assert "--direct_num_workers=32" in runner_args(None, None, 32)
    with pytest.raises(
        UsageError,
        match=re.escape("--workers 33 is more than 16 worker processes for each of the 2 cores"),
    ):
        runner_args(None, None, 33)


@pytest.mark.parametrize(
    ("args", "how"),
    [
        ([], "in this process"),
        (
            ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
            "in 2 worker processes",
        ),
        (["--direct_num_workers=2"], "in this process"),
        (["--runner=DataflowRunner"], "on DataflowRunner"),
        ([f"--runner={DASK}"], "on DaskRunner"),
    ],
)
def test_how_it_runs_in_words(args, how):
    assert how_it_runs(PipelineOptions(args)) == how


@pytest.mark.parametrize(
    ("args", "multiple"),
    [
        ([], 1),
        (["--direct_num_workers=3", "--direct_running_mode=multi_processing"], 3),
        (["--direct_num_workers=2"], 1),
        ([f"--runner={DASK}"], 1),  # Dask hands tasks to whichever worker is free
    ],
)
def test_a_split_csv_files_ranges_come_in_rounds_of_the_local_worker_processes(args, multiple):
    assert csv_range_multiple(PipelineOptions(args)) == multiple


def test_a_runs_csv_range_settings_are_its_range_size_and_its_round():
    workers = PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    assert csv_range_settings(workers) == {
        "csv_range_bytes": CSV_RANGE_BYTES,
        "csv_range_multiple": 2,
    }
    assert csv_range_settings(PipelineOptions([])) == {
        "csv_range_bytes": None,
        "csv_range_multiple": 1,
    }


def test_unknown_runner_lists_the_known_ones():
    with pytest.raises(UsageError) as caught:
        runner_args("dusk", None)
    assert "dask, portable" in str(caught.value) and "DataflowRunner" in str(caught.value)


def test_dask_options_are_known_once_the_runner_is_named():
    options = beam_options([*runner_args("dask", None), "--dask_client_address=127.0.0.1:8786"])
    assert options.view_as(StandardOptions).runner == DASK
    assert options.get_all_options()["address"] == "127.0.0.1:8786"


def test_dask_without_a_scheduler_address_is_a_usage_error():
    with pytest.raises(UsageError, match="--dask_client_address HOST:PORT"):
        beam_options(runner_args("dask", None))


def test_portable_needs_a_job_endpoint():
    with pytest.raises(UsageError, match="--job_endpoint HOST:PORT"):
        beam_options(runner_args("portable", "127.0.0.1:50000"))
    options = beam_options(
        [*runner_args("portable", "127.0.0.1:50000"), "--job_endpoint=127.0.0.1:8099"]
    )
    portable = options.view_as(PortableOptions)
    assert portable.job_endpoint == "127.0.0.1:8099"
    assert portable.environment_type == "EXTERNAL"
    assert portable.environment_config == "127.0.0.1:50000"


def test_convert_help_names_the_runners(cli):
    result = cli("convert", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for phrase in ("--runner NAME", "'dask'", "--dask_client_address", "'portable'"):
        assert phrase in text
    assert "--worker_pool HOST:PORT" in text


def test_convert_with_dask_but_no_address_stops_before_anything_is_written(
    photo_folder, tmp_path, cli
):
    out = tmp_path / "out"
    result = cli("convert", photo_folder, "-o", out, "--runner", "dask")
    assert result.returncode == 2
    assert "--runner dask needs --dask_client_address" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_plan_takes_the_runner_options_too(photo_folder, cli):
    result = cli("plan", photo_folder, "--runner", "dusk")
    assert result.returncode == 2 and "unknown runner 'dusk'" in result.stderr


@pytest.mark.parametrize("value", ["team=vision", '{"team": "vision"}'])
def test_dataflow_job_labels_given_as_labels_point_to_beams_label(photo_folder, cli, value):
    result = cli("plan", photo_folder, "--labels", value)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is not a label mode" in result.stderr and "--label KEY=VALUE" in result.stderr


def test_beams_label_reaches_the_dataflow_options(photo_folder, tmp_path):
    from recordforge.pipelines.api import pipeline_options
    from recordforge.pipelines.cli import command_parser

    args, beam_args = command_parser("convert").parse_known_args(
        [str(photo_folder), "-o", str(tmp_path / "out"), "--labels", "folder"]
        + ["--label", "team=vision", "--label", "stage=dev"]
    )
    options = pipeline_options(args, beam_args).view_as(GoogleCloudOptions)
    assert args.labels == "folder"
    assert options.labels == ["team=vision", "stage=dev"]


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.7", False),
        ("::ffff:192.0.2.7", False),
    ],
)
def test_the_listener_check_tells_loopback_from_every_interface(address, loopback):
    assert is_loopback(address) is loopback


class _CountsSeen(beam.DoFn):
    def process(self, element):
        yield element


_SEEN = beam.DoFn.StateParam(userstate.CombiningValueStateSpec("seen", sum))


class _KeepsState(beam.DoFn):
    def process(self, element, seen=_SEEN):
        seen.add(1)
        yield element


def test_beam_looks_into_each_dofn_once_while_it_runs_a_pipeline(monkeypatch):
    inspected = []
    real = userstate.get_dofn_specs

    def counting(dofn):
        inspected.append(dofn)
        return real(dofn)

    monkeypatch.setattr(userstate, "get_dofn_specs", counting)
    with dofns_inspected_once():
        with beam.Pipeline(runner=FnApiRunner()) as p:
            keyed = p | beam.Create([("a", 1), ("a", 2), ("b", 3)])
            _ = keyed | "Plain" >> beam.ParDo(_CountsSeen())
            stateful = keyed | "Stateful" >> beam.ParDo(_KeepsState())
            assert_that(stateful, equal_to([("a", 1), ("a", 2), ("b", 3)]))
        # Beam still tells a stateful DoFn from a plain one.
        assert userstate.is_stateful_dofn(_KeepsState())
        assert not userstate.is_stateful_dofn(_CountsSeen())
    assert len(inspected) == len({id(dofn) for dofn in inspected})
    assert userstate.get_dofn_specs is counting  # put back as it was
