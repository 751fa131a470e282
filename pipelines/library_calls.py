"""What recordforge's library calls (convert, plan, verify, reshard, load) do around their work:
their switches checked, and the caller's logging left as it was."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from recordforge.transforms.core.errors import UsageError


def check_switches(**switches) -> None:
    """Raise UsageError for a switch that is not True or False: a string such as "no" is true
    to Python, and would turn the switch on. (A switch whose None means "the default" is
    checked only when it is not None.)"""
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise UsageError(f"{name} is True or False, got {value!r}")


@contextlib.contextmanager
def logging_as_found() -> Iterator[None]:
    """While a call runs, a root logger without handlers holds a NullHandler, removed after.

    Beam configures the root logger whenever pipeline options are made (`logging.basicConfig()`
    in PipelineOptions): that left a handler behind, so that the caller's own later
    `basicConfig` did nothing, and it printed Beam's log of a failure that the call raises as
    an exception. A caller who configured logging keeps it as configured; recordforge's own
    messages are on the "recordforge" logger.
    """
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeHandler(placeholder)
