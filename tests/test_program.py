"""The `recordforge` program itself: how it treats the process it runs in."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from recordforge.pipelines import cli

_RUN_AS_PROGRAM = """
import gc, sys
from recordforge.command import main
sys.argv = ["recordforge", "--help"]
try:
    main()
except SystemExit:
    pass
print(gc.get_freeze_count(), file=sys.stderr)
"""


def test_the_program_keeps_the_collector_off_its_startup_objects():
    # Run as the program, Beam's ~0.5 M objects from the imports are loaded with the collector
    # off, then frozen: no collection walks them, and the exit does not free them one by one
    # (lean_imports.loading_without_collections).
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AS_PROGRAM], capture_output=True, text=True, check=True
    )
    assert int(done.stderr.strip().splitlines()[-1]) > 100_000


def test_a_caller_of_main_keeps_its_collector_as_it_is():
    before = gc.get_freeze_count()
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert gc.get_freeze_count() == before
