"""Beam metrics for the Dask runner: counted in each bundle, sent to the launcher as events.

Beam's DaskRunner keeps no metrics (its result's `metrics()` raises NotImplementedError), and
a DoFn's `Metrics.counter(...).inc()` goes nowhere outside a metrics container. Here each dask
task (a fused stage: bundles of several transforms) counts into a container per transform and
sends their running totals, every second while it runs and once when it ends, as a dask event
(`Worker.log_event`) on a topic of its run; the launcher's client subscribes to the topic and
keeps the latest totals of each (task, transform): a task that dask runs again sends under the
same key, so a retry replaces the totals, never adds.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator

from apache_beam.metrics.execution import MetricKey, MetricResult, MetricsContainer
from apache_beam.metrics.metric import MetricResults
from apache_beam.metrics.metricbase import MetricName

from recordforge.transforms.internals import CounterFactory, state_sampler

_PUBLISH_SECONDS = 1.0


def new_topic() -> str:
    """A topic of its own for one run: runs sharing a cluster do not mix their counts."""
    return f"recordforge-metrics-{uuid.uuid4().hex}"


class TaskMetrics:
    """While active, the Beam counters of the bundles this thread runs go to `topic`, one
    metrics container per step (`step(...)` around each bundle): a dask task runs a fused
    stage, several bundles of several transforms."""

    def __init__(self, topic: str | None) -> None:
        self._topic = topic
        self._containers: dict[str, MetricsContainer] = {}
        self._worker = self._task = None
        if topic is not None:
            import distributed

            try:
                self._worker = distributed.get_worker()
                self._task = str(self._worker.get_current_task())
            except ValueError:  # not on a dask worker (dask's local schedulers)
                self._worker = None
        self._stop = threading.Event()
        self._sent: dict | None = None

    def __enter__(self) -> TaskMetrics:
        # Beam finds a DoFn's metrics container through the thread's state sampler.
        self._sampler = state_sampler("dask-task", CounterFactory())
        self._sampler.start()
        if self._worker is not None:
            self._publisher = threading.Thread(
                target=self._publish_every_second, name="recordforge-metrics", daemon=True
            )
            self._publisher.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._worker is not None:
            self._publisher.join()
        self._sampler.stop()
        if exc_info[0] is None:
            self._publish()

    @contextlib.contextmanager
    def step(self, step: str) -> Iterator[None]:
        """Counters incremented inside go to `step`'s container."""
        container = self._containers.get(step)
        if container is None:
            container = self._containers[step] = MetricsContainer(step)
        with self._sampler.scoped_state(step, "process", metrics_container=container):
            yield

    def _publish_every_second(self) -> None:
        while not self._stop.wait(_PUBLISH_SECONDS):
            try:
                self._publish()
            except RuntimeError:  # a DoFn added a counter or step meanwhile: next second
                continue

    def _publish(self) -> None:
        if self._worker is None:
            return
        steps = {}
        for step, container in list(self._containers.items()):
            counters = sorted(
                [key.metric.namespace, key.metric.name, value]
                for key, value in container.get_cumulative().counters.items()
            )
            if counters:
                steps[step] = counters
        if steps and steps != self._sent:
            self._sent = steps
            self._worker.log_event(self._topic, {"task": self._task, "steps": steps})


class TaskCounters:
    """The launcher's side: each task's latest counters from the run's events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[tuple[str, str], tuple[float, list]] = {}

    def add(self, event) -> None:
        """A dask event (timestamp, message), as `Client.subscribe_topic` hands them over."""
        timestamp, message = event
        with self._lock:
            for step, counters in message["steps"].items():
                key = (message["task"], step)
                known = self._tasks.get(key)
                if known is None or known[0] <= timestamp:
                    self._tasks[key] = (timestamp, counters)

    def results(self) -> DaskMetrics:
        totals: dict[MetricKey, int] = {}
        with self._lock:
            latest = list(self._tasks.items())
        for (_, step), (_, counters) in latest:
            for namespace, name, value in counters:
                key = MetricKey(step, MetricName(namespace, name))
                totals[key] = totals.get(key, 0) + value
        return DaskMetrics(totals)


class DaskMetrics(MetricResults):
    """Counters summed over tasks; others (distributions, gauges) are not collected."""

    def __init__(self, counters: dict[MetricKey, int]) -> None:
        self._counters = counters

    def query(self, filter=None):
        counters = [
            MetricResult(key, value, value)
            for key, value in self._counters.items()
            if self.matches(filter, key)
        ]
        return {
            self.COUNTERS: counters,
            self.DISTRIBUTIONS: [],
            self.GAUGES: [],
            self.STRINGSETS: [],
            self.BOUNDED_TRIES: [],
            self.HISTOGRAMS: [],
        }
