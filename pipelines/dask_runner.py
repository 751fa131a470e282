"""Beam's DaskRunner with the gaps fixed that a real pipeline falls into (Beam 2.77).

Beam's own translation (apache_beam/runners/dask/transform_evaluator.py) runs simple
single-output pipelines but, for a pipeline like recordforge's:
- mixes a multi-output DoFn's outputs: every consumer of `.with_outputs(...)` receives the main
  and all tagged outputs together (`_ReadCsvFn` then got image paths);
- drops what `finish_bundle` emits (the feature and label tallies);
- materialises a side input inside each task that reads it, recomputing the side input's whole
  upstream graph there, once per task;
- computes only the pipeline's last branch.
This runner keeps Beam's Create, GroupByKey and Flatten and replaces the rest: a bundle's outputs
are (tag, value) pairs each consumer selects its tag from, collected after `finish_bundle`; side
inputs are ordinary graph dependencies, computed once; every branch that nothing else reads is
computed. Reshuffle repartitions the bag (Beam's is a no-op) into --dask_npartitions partitions,
by default one per worker thread of the cluster, so the work after it spreads over the workers
(more partitions only add dask tasks: every GroupByKey shuffles between all of them).

Beam's keeps no metrics; here each bundle counts into a metrics container whose counters reach
the launcher while the job runs (pipelines/dask_metrics.py), so `result.metrics()` works.

Like Beam's, it runs batch pipelines in the global window only, which is all recordforge uses.
The Beam internals it builds on come from recordforge.transforms.internals, which checks the
Beam release.
"""

from __future__ import annotations

import collections
import dataclasses

import apache_beam as beam
import dask
import dask.bag as db
from apache_beam import DoFn, pvalue
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.transforms.window import GlobalWindow

from recordforge.pipelines.dask_metrics import BundleMetrics, DaskMetrics, TaskCounters, new_topic
from recordforge.transforms.internals import (
    DASK_TRANSLATIONS,
    BeamDaskRunner,
    DaskFlatten,
    DaskOptions,
    DaskReshuffle,
    DoFnContext,
    DoFnInvoker,
    DoFnSignature,
    OutputHandler,
    Receiver,
    SideInputMap,
    WindowedValue,
    dask_bag_kwargs,
    dask_overrides,
    side_input_view,
)
from recordforge.transforms.internals import (
    DaskRunnerResult as BeamDaskRunnerResult,
)


class _Outputs:
    """A Receiver for each output tag, collecting (tag, value) pairs in emission order."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str | None, object]] = []

    def receiver(self, tag: str | None) -> _TagReceiver:
        return _TagReceiver(tag, self.pairs)


class _TagReceiver(Receiver):
    def __init__(self, tag: str | None, pairs: list) -> None:
        self.tag = tag
        self.pairs = pairs

    def receive(self, windowed_value: WindowedValue) -> None:
        self.pairs.append((self.tag, windowed_value.value))


class _TaggedReceivers(dict):
    def __init__(self, outputs: _Outputs) -> None:
        super().__init__()
        self._outputs = outputs

    def __missing__(self, tag):
        self[tag] = self._outputs.receiver(tag)
        return self[tag]


def _windowed(value) -> WindowedValue:
    if isinstance(value, WindowedValue):
        return value
    return WindowedValue(value, 0, (GlobalWindow(),))


def _run_bundle(items, fn, label, args, kwargs, metrics, side_specs, *side_values):
    """One dask partition as one Beam bundle; returns its outputs as (tag, value) pairs.

    Its Beam metrics go to the launcher: `metrics` is (the run's event topic, the transform's
    full label), see pipelines/dask_metrics.
    """
    outputs = _Outputs()
    receivers = _TaggedReceivers(outputs)
    handler = OutputHandler(
        window_fn=None,
        main_receivers=receivers[None],
        tagged_receivers=receivers,
        per_element_output_counter=None,
        output_batch_converter=None,
        process_yields_batches=False,
        process_batch_yields_elements=False,
    )
    side_inputs = [
        SideInputMap(view_class, view_options, [_windowed(v) for v in values])
        for (view_class, view_options), values in zip(side_specs, side_values, strict=True)
    ]
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn),
        handler,
        context=DoFnContext(label, state=None),
        side_inputs=side_inputs,
        input_args=list(args),
        input_kwargs=kwargs,
        user_state_context=None,
        bundle_finalizer_param=DoFn.BundleFinalizerParam(),
    )
    with BundleMetrics(*metrics):
        invoker.invoke_setup()
        invoker.invoke_start_bundle()
        for item in items:
            invoker.invoke_process(_windowed(item))
        invoker.invoke_finish_bundle()
        invoker.invoke_teardown()
    return outputs.pairs


def _concatenated(partitions: list[list]) -> list:
    return [value for partition in partitions for value in partition]


def _select(pairs, tag):
    return [value for pair_tag, value in pairs if pair_tag == tag]


@dataclasses.dataclass
class _TaggedBag:
    """A ParDo's output: one bag of (tag, value) pairs; each consumer selects its own tag."""

    pairs: db.Bag

    def output(self, tag: str | None) -> db.Bag:
        return self.pairs.map_partitions(_select, tag)


class _DaskBagVisitor(PipelineVisitor):
    def __init__(self, npartitions: int, bag_kwargs: dict, metrics_topic: str) -> None:
        self._metrics_topic = metrics_topic
        self.bags: dict[AppliedPTransform, db.Bag | _TaggedBag] = collections.OrderedDict()
        self._consumed: set[AppliedPTransform] = set()
        self._npartitions = npartitions
        self._bag_kwargs = bag_kwargs

    def sinks(self) -> list[db.Bag]:
        """The bags nothing reads: computing them all computes every branch of the pipeline
        (Beam's DaskRunner computes only the last one)."""
        sinks = [b for node, b in self.bags.items() if node not in self._consumed and b is not None]
        return [b.pairs if isinstance(b, _TaggedBag) else b for b in sinks]

    def _bag_of(self, value) -> db.Bag | None:
        self._consumed.add(value.producer)
        produced = self.bags.get(value.producer)
        if isinstance(produced, _TaggedBag):
            return produced.output(value.tag)
        return produced

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform = node.transform
        inputs = [v for v in node.inputs if not isinstance(v, pvalue.PBegin)]
        bags = [self._bag_of(v) for v in inputs]
        if isinstance(transform, DaskReshuffle):
            bag = bags[0]
            self.bags[node] = bag.repartition(npartitions=max(bag.npartitions, self._npartitions))
        elif type(transform) is beam.ParDo:
            self.bags[node] = self._pardo(node, bags[0])
        elif type(transform) in DASK_TRANSLATIONS:  # Create, GroupByKey, Flatten
            op = DASK_TRANSLATIONS[type(transform)](node, bag_kwargs=self._bag_kwargs)
            if isinstance(op, DaskFlatten):
                self.bags[node] = op.apply(bags)
            else:
                self.bags[node] = op.apply(bags[0] if bags else None)
        else:  # as in Beam's: other primitives pass their input on (GroupAlsoByWindow)
            self.bags[node] = bags[0] if len(bags) == 1 else None

    def _pardo(self, node: AppliedPTransform, bag: db.Bag) -> _TaggedBag:
        transform = node.transform
        args, kwargs = transform.raw_side_inputs
        side_specs, side_values = [], []
        for side in node.side_inputs:
            side_specs.append(side_input_view(side))
            # A whole-bag dependency, computed once and handed to every partition: from the
            # bag's partitions as they are (an optimized copy of its graph, which
            # `delayed(list)(bag)` makes, would list and probe the inputs again per side input).
            partitions = self._bag_of(side.pvalue).to_delayed(optimize_graph=False)
            side_values.append(dask.delayed(_concatenated)(partitions))
        pairs = bag.map_partitions(
            _run_bundle,
            transform.fn,
            transform.label,
            tuple(args),
            kwargs,
            (self._metrics_topic, node.full_label),
            side_specs,
            *side_values,
        )
        return _TaggedBag(pairs)


class DaskRunner(BeamDaskRunner):
    """Runs a batch pipeline on a dask.distributed cluster (--dask_client_address)."""

    def run_pipeline(self, pipeline, options):
        import dask.distributed as ddist

        dask_options = options.view_as(DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        bag_kwargs = dask_bag_kwargs(dask_options)
        client = ddist.Client(**dask_options)
        pipeline.replace_all(dask_overrides())
        npartitions = bag_kwargs.get("npartitions") or sum(client.nthreads().values()) or 1
        topic = new_topic()
        counters = TaskCounters()
        # Subscribed before the work is sent: the scheduler forwards every event of the run.
        client.subscribe_topic(topic, counters.add)
        visitor = _DaskBagVisitor(npartitions, bag_kwargs, topic)
        pipeline.visit(visitor)
        # Their results come back to this process: a pipeline's ends should be small (here, the
        # manifest).
        futures = client.compute(dask.optimize(*visitor.sinks()))
        return DaskRunnerResult(client, futures, counters)


@dataclasses.dataclass
class DaskRunnerResult(BeamDaskRunnerResult):
    """Beam's result, with the run's metrics (Beam's raises NotImplementedError): the counters
    of finished and running bundles, live while the run goes on."""

    counters: TaskCounters = dataclasses.field(default_factory=TaskCounters)

    def metrics(self) -> DaskMetrics:
        return self.counters.results()
