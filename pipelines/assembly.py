"""Pipeline assembly: build the Beam pipeline for a config and run it on the chosen runner."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.pipelines.progress import ProgressMonitor
from recordforge.pipelines.runner import default_runner, uses_default_runner
from recordforge.transforms.convert import ConvertConfig, ConvertToTFRecords, PlanDataset
from recordforge.transforms.core.tfrecord.inputs import TFRecordInput
from recordforge.transforms.examples import ExamplesConfig, ReadTFRecordFiles, WriteExamples
from recordforge.transforms.internals import dofns_inspected_once, grpc_listeners_on_loopback


def build_pipeline(pipeline: beam.Pipeline, config: ConvertConfig):
    """Add the conversion to `pipeline`; returns the PCollection holding the manifest dict."""
    return pipeline | "ConvertToTFRecords" >> ConvertToTFRecords(config)


def build_reshard_pipeline(
    pipeline: beam.Pipeline, config: ExamplesConfig, inputs: tuple[TFRecordInput, ...]
):
    """Add resharding `inputs` to `pipeline`; returns the PCollection holding the manifest."""
    return pipeline | "Reshard" >> WriteExamples(config, ReadTFRecordFiles(config, inputs))


def build_plan_pipeline(pipeline: beam.Pipeline, config: ConvertConfig, report_path: str):
    """Add planning only to `pipeline`; the plan report is written to `report_path`."""
    return pipeline | "PlanDataset" >> PlanDataset(config, report_path)


def run_pipeline(
    options: PipelineOptions,
    build: Callable[[beam.Pipeline], object],
    *,
    wait: bool = True,
    progress: ProgressMonitor | None = None,
) -> None:
    """Build and run a pipeline; FnApiRunner unless the options name a runner.

    With `wait` (the default) it returns when the pipeline has finished; without, as soon as the
    runner has accepted it (FnApiRunner runs it to the end either way). A `progress` monitor
    shows the job's counters while it runs, and the final ones.

    Raises whatever the runner raises when the pipeline fails.
    """
    local = uses_default_runner(options)
    # FnApiRunner runs the whole job inside `run()`: the launcher polls the runner meanwhile.
    live_local = local and wait and progress is not None
    runner = default_runner(progress.local_ask_seconds if live_local else None) if local else None
    with grpc_listeners_on_loopback(), dofns_inspected_once():
        pipeline = beam.Pipeline(runner=runner, options=options)
        build(pipeline)
        if live_local:
            progress.watch(runner)
        result = None
        try:
            # A runner may waive Beam's check that the pipeline survives its proto form (a
            # round trip through it, ~0.3-0.7 s of the launcher): the Dask runner, which
            # never sends the proto anywhere.
            result = pipeline.run(getattr(pipeline.runner, "test_runner_api", "AUTO"))
            if not wait:
                return
            if progress is not None and not live_local:
                progress.watch(result)
            result.wait_until_finish()
        except BaseException:
            if progress is not None:
                progress.abandon()
            # Stopped (a signal) or failed: a runner that runs the job elsewhere (a job
            # service, a Dask cluster) is told to stop it too.
            if result is not None:
                with contextlib.suppress(Exception):
                    result.cancel()
            raise
        if progress is not None:
            progress.finish(result)
