"""Progress of a run as Beam metrics: counters the DoFns update, which the launcher polls.

A counter is updated once per batch, shard or bundle, never per record: Beam aggregates them
across workers, and runners report them to the launcher (pipelines/progress.py). Workers also
log their own running count now and then, for runners whose metrics arrive only at the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from apache_beam.metrics import Metrics

LOGGER = logging.getLogger("recordforge")
_INTERVAL_SECONDS = 10.0

NAMESPACE = "recordforge"
# Inputs found: image files listed, CSV rows read (each row is an input).
INPUTS_LISTED = "inputs_listed"
# Image candidates probed, usable or not (out of INPUTS_LISTED for image runs).
IMAGES_PROBED = "images_probed"
# What the planner placed in shards: records and their framed bytes.
RECORDS_PLANNED = "records_planned"
BYTES_PLANNED = "bytes_planned"
# Of those, the records written to a shard or quarantined while writing, and their planned
# (framed, uncompressed) bytes: they end equal to the planned figures.
RECORDS_WRITTEN = "records_written"
BYTES_WRITTEN = "bytes_written"


def counter(name: str):
    """One of recordforge's progress counters."""
    return Metrics.counter(NAMESPACE, name)


class Progress:
    """Counts events in one DoFn instance; logs the running count at most every 10 seconds.

    Also feeds a Beam metrics counter (`counter`), and, when `phase` names one, the phase's
    progress counter (INPUTS_LISTED, ...), which the launcher shows.
    """

    def __init__(self, counter_name: str, verb: str, noun: str, phase: str | None = None) -> None:
        self._counter = counter(counter_name)
        self._phase = counter(phase) if phase and phase != counter_name else None
        self._verb, self._noun = verb, noun
        self._count = 0
        self._last_log = time.monotonic()

    def add(self, n: int = 1) -> None:
        self._count += n
        self._counter.inc(n)
        if self._phase is not None:
            self._phase.inc(n)
        now = time.monotonic()
        if now - self._last_log >= _INTERVAL_SECONDS:
            self._last_log = now
            LOGGER.info("%s %s %s so far (this worker)", self._verb, f"{self._count:,}", self._noun)


def count_planned(layouts: Mapping) -> Mapping:
    """Publish the planned records and bytes of {split: SplitLayout}; returns `layouts`."""
    counter(RECORDS_PLANNED).inc(sum(layout.plan.stats.num_records for layout in layouts.values()))
    counter(BYTES_PLANNED).inc(sum(layout.plan.stats.total_bytes for layout in layouts.values()))
    return layouts
