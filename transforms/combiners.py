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
