"""The Dask runner's translation (pipelines/dask_plan.py, dask_tasks.py and the driver in
dask_runner.py), without a cluster.

The planner's stages and exchanges are checked on small pipelines, and whole pipelines run
through the runner's driver with a client that runs each task at once in this process (the
same task functions a worker runs, the same picks, side inputs and exchange decisions; the
indexes come from index tasks, as when no event arrives). Beam's `assert_that` checks the
results inside the pipeline. The runs on a real scheduler and workers, byte for byte against
the in-process output, are in tests/test_runners.py.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from recordforge.pipelines import dask_plan, dask_runner
from recordforge.transforms.internals import dask_overrides


class _Future:
    def __init__(self, key, value=None, error=None):
        self.key, self._value, self._error = key, value, error
        self.status = "finished" if error is None else "error"

    def result(self):
        if self._error is not None:
            raise self._error
        return self._value

    def add_done_callback(self, callback):
        callback(self)


def _resolved(value):
    if isinstance(value, _Future):
        return value.result()
    if type(value) in (list, tuple):
        return type(value)(_resolved(v) for v in value)
    return value


class _InProcessClient:
    """What the driver uses of a dask.distributed Client; tasks run when submitted."""

    status = "running"

    def __init__(self, threads=None):
        self.threads = threads or {"tcp://127.0.0.1:1": 1, "tcp://127.0.0.1:2": 1}
        self.submitted: list[tuple[str, dict]] = []

    def nthreads(self):
        return self.threads

    def submit(self, function, *args, key=None, pure=True, **placement):
        self.submitted.append((key, placement))
        try:
            return _Future(key, function(*_resolved(list(args))))
        except Exception as error:  # noqa: BLE001  (the future holds it, as dask's does)
            return _Future(key, error=error)

    def subscribe_topic(self, topic, handler):
        pass

    def unsubscribe_topic(self, topic):
        pass

    def cancel(self, futures):
        pass

    def run(self, function, *args):
        """Every worker's answer: here, this process's (its tasks have all ended)."""
        return {address: function(*args) for address in self.threads}


def _planned(build) -> dask_plan.Planner:
    pipeline = beam.Pipeline(options=PipelineOptions([]))
    build(pipeline)
    pipeline.replace_all(dask_overrides())
    planner = dask_plan.Planner()
    pipeline.visit(planner)
    return planner


def _run(build, partitions=4, client=None) -> _InProcessClient:
    client = client or _InProcessClient()
    planner = _planned(build)
    driver = dask_runner._Driver(client, client.threads, planner, partitions, None, None)
    driver.run()  # in this thread
    if driver.error is not None:
        raise driver.error
    return client


class _Tagged(beam.DoFn):
    """Even numbers to the main output, odd ones to `odd`, and a count per bundle."""

    def start_bundle(self):
        self.seen = 0

    def process(self, n):
        self.seen += 1
        yield n if n % 2 == 0 else beam.pvalue.TaggedOutput("odd", n)

    def finish_bundle(self):
        from recordforge.transforms.internals import in_global_window

        yield beam.pvalue.TaggedOutput("seen", in_global_window(self.seen))


def test_consecutive_pardos_run_as_one_stage_and_an_exchange_starts_a_new_one():
    planner = _planned(
        lambda p: (
            p
            | beam.Create(range(10))
            | "A" >> beam.Map(lambda n: (n % 3, n))
            | "B" >> beam.Map(lambda kv: kv)
            | beam.GroupByKey()
            | "C" >> beam.Map(lambda kv: kv)
        )
    )
    create, grouped = planner.stages
    assert [s.full_label for s in create.steps] == ["A", "B"]  # window reification skipped
    assert [s.full_label for s in grouped.steps] == ["C"]
    assert isinstance(grouped.source, dask_plan.ExchangeSource)
    assert create.splits == [(0, 2, dask_plan.GROUP)]


def test_a_pardo_whose_side_input_comes_from_its_own_stage_starts_a_stage():
    def build(p):
        numbers = p | beam.Create(range(10)) | "Double" >> beam.Map(lambda n: 2 * n)
        total = numbers | beam.CombineGlobally(sum)
        numbers | "Share" >> beam.Map(lambda n, t: n / t, beam.pvalue.AsSingleton(total))

    planner = _planned(build)
    share = next(s for s in planner.stages if s.steps and s.steps[0].full_label == "Share")
    assert isinstance(share.source, dask_plan.PiecesSource)  # not fused into Double's


@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_a_pipeline_gives_the_same_results_whatever_the_partitions(partitions):
    def build(p):
        numbers = p | beam.Create(range(100))
        parts = numbers | beam.ParDo(_Tagged()).with_outputs("odd", "seen", main="even")
        spread = parts.even | beam.Reshuffle()
        total = parts.odd | "SumOdd" >> beam.CombineGlobally(sum)
        shifted = spread | "Shift" >> beam.Map(
            lambda n, t: (n % 5, n + t), beam.pvalue.AsSingleton(total)
        )
        grouped = shifted | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
        odd_sum = sum(range(1, 100, 2))
        expected = [
            (k, sorted(n + odd_sum for n in range(0, 100, 2) if n % 5 == k)) for k in range(5)
        ]
        assert_that(grouped, equal_to(expected), label="Grouped")
        seen = parts.seen | "Seen" >> beam.CombineGlobally(sum)
        assert_that(seen, equal_to([100]), label="EveryElementSeenOnce")
        both = (parts.even, parts.odd) | beam.Flatten() | "Count" >> beam.combiners.Count.Globally()
        assert_that(both, equal_to([100]), label="Flattened")

    _run(build, partitions)


def test_a_failing_dofn_fails_the_run():
    def fail(n):
        raise ValueError(f"bad {n}")

    with pytest.raises(ValueError, match="bad"):
        _run(lambda p: p | beam.Create([1]) | beam.Map(fail))


def test_new_partitions_are_dealt_over_the_workers():
    client = _run(lambda p: p | beam.Create(range(8)) | beam.Map(lambda n: n), partitions=4)
    placed = [placement["workers"] for _, placement in client.submitted if placement]
    assert placed == [["tcp://127.0.0.1:1"], ["tcp://127.0.0.1:2"]] * 2


def test_keys_are_balanced_by_weight_over_the_partitions():
    planner = _planned(lambda p: None)
    driver = dask_runner._Driver(_InProcessClient(), {"w": 1}, planner, 2, None, None)
    shares = driver._balanced({1: 10, 2: 6, 3: 5, 4: 1})
    assert sorted(sorted(share) for share in shares) == [[1, 4], [2, 3]]  # 11 and 11
    assert driver._balanced({7: 1}) == [[7]]  # one key: one partition
