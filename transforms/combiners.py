"""A CombineFn for accumulators that know how to add an input and merge with another."""

from __future__ import annotations

from collections.abc import Callable
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


class PartsCombineFn(beam.CombineFn):
    """Combines (part, value) inputs, each part with its own CombineFn, into {part: output}.

    Several global totals that are ready at the same point of a pipeline can share one global
    combine this way: each `CombineGlobally` adds a chain of steps (keying, combining, a default
    for empty input and its side input), and those steps cost the same whatever they combine.
    Every part has an output, its CombineFn's empty one when no input named it.

    Args:
        parts: {part name: the CombineFn for that part's values}.
    """

    def __init__(self, parts: dict[str, beam.CombineFn]) -> None:
        self._parts = dict(parts)

    def setup(self, *args, **kwargs):
        for fn in self._parts.values():
            fn.setup(*args, **kwargs)

    def teardown(self, *args, **kwargs):
        for fn in self._parts.values():
            fn.teardown(*args, **kwargs)

    def create_accumulator(self):
        return {part: fn.create_accumulator() for part, fn in self._parts.items()}

    def add_input(self, accumulator, element):
        part, value = element
        accumulator[part] = self._parts[part].add_input(accumulator[part], value)
        return accumulator

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        return {
            part: fn.merge_accumulators([a[part] for a in accumulators])
            for part, fn in self._parts.items()
        }

    def compact(self, accumulator):
        return {part: fn.compact(accumulator[part]) for part, fn in self._parts.items()}

    def extract_output(self, accumulator):
        return {part: fn.extract_output(accumulator[part]) for part, fn in self._parts.items()}
