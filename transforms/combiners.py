"""CombineFns: one for accumulators that know how to add an input and merge with another, and
several global combines run as one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import apache_beam as beam


class TallyCombineFn(beam.CombineFn):
    """Combines inputs into a tally object with `merge(other)`, e.g. a LabelTally.

    Args:
        create: makes an empty tally.
        add: adds one input to a tally in place.
    """

    def __init__(self, create: Callable[[], Any], add: Callable[[Any, Any], None]) -> None:
        self._create = create
        self._add = add

    def create_accumulator(self):
        return self._create()

    def add_input(self, tally, element):
        self._add(tally, element)
        return tally

    def merge_accumulators(self, tallies):
        merged = self._create()
        for tally in tallies:
            merged.merge(tally)
        return merged

    def extract_output(self, tally):
        return tally


class _TaggedCombineFn(beam.CombineFn):
    """Several CombineFns side by side over (name, input) pairs: {name: output}."""

    def __init__(self, fns: Mapping[str, beam.CombineFn | Callable]) -> None:
        self._fns = {name: beam.CombineFn.maybe_from_callable(fn) for name, fn in fns.items()}

    def setup(self, *args, **kwargs):
        for fn in self._fns.values():
            fn.setup(*args, **kwargs)

    def create_accumulator(self):
        return {name: fn.create_accumulator() for name, fn in self._fns.items()}

    def add_input(self, accumulators, named_input):
        name, element = named_input
        accumulators[name] = self._fns[name].add_input(accumulators[name], element)
        return accumulators

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        return {
            name: fn.merge_accumulators([each[name] for each in accumulators])
            for name, fn in self._fns.items()
        }

    def compact(self, accumulators):
        return {name: fn.compact(accumulators[name]) for name, fn in self._fns.items()}

    def extract_output(self, accumulators):
        return {name: fn.extract_output(accumulators[name]) for name, fn in self._fns.items()}

    def teardown(self, *args, **kwargs):
        for fn in self._fns.values():
            fn.teardown(*args, **kwargs)


class CombineTogether(beam.PTransform):
    """Global combines of several PCollections as one: a global combine costs a runner a
    stage or two (and a round trip to every worker) whatever it combines, so the run's small
    tallies share one.

    Args:
        combines: {name: (a PCollection or a tuple of them, a CombineFn or a callable as
            CombineGlobally takes it)}; a tuple's PCollections are combined as one (not
            flattened first: each Flatten that a runner cannot fuse away is a stage of its own).
    Output: {name: PCollection holding the one output of that CombineFn over that input}.
    """

    def __init__(self, combines: Mapping[str, tuple[Any, beam.CombineFn | Callable]]) -> None:
        super().__init__()
        self._combines = dict(combines)

    def expand(self, pbegin):
        named = []
        for name, (inputs, _) in self._combines.items():
            for index, pcoll in enumerate(inputs if isinstance(inputs, tuple) else (inputs,)):
                named.append(
                    pcoll
                    | f"Name{name}{index}" >> beam.Map(lambda element, name=name: (name, element))
                )
        combined = (
            tuple(named)
            | "Inputs" >> beam.Flatten(pipeline=pbegin.pipeline)
            | "Combine"
            >> beam.CombineGlobally(
                _TaggedCombineFn({name: fn for name, (_, fn) in self._combines.items()})
            )
        )
        return {
            name: combined | f"Take{name}" >> beam.Map(lambda outputs, name=name: outputs[name])
            for name in self._combines
        }
