"""Progress at the launcher: the pipeline's counters (transforms/progress.py), polled from the
running job's Beam metrics and shown as bars on a terminal or as a status line elsewhere.

What a runner reports while the job runs differs (docs/design.md, "Progress"): the Dask
runner, Dataflow and job services that report attempted metrics (Flink's) report live;
FnApiRunner runs the whole pipeline inside `Pipeline.run()`, so the local run's runner reports
the figures itself meanwhile (transforms/internals.py's `fn_api_runner`); Beam's own Python job
service answers metrics only once the job is done, so there the figures appear when it ends.
Nothing is shown that the runner did not report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from apache_beam.metrics.metric import MetricsFilter

from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.planning.sharding import human_size
from recordforge.transforms.internals import forget_cached_metrics
from recordforge.transforms.progress import (
    BYTES_PLANNED,
    BYTES_WRITTEN,
    IMAGES_PROBED,
    INPUTS_LISTED,
    LOGGER,
    NAMESPACE,
    RECORDS_PLANNED,
    RECORDS_WRITTEN,
)

# A terminal's bars follow the job closely; a log gets a line at a steady, readable pace.
BAR_POLL_SECONDS = 0.5
STATUS_LINE_SECONDS = 10.0
# Seconds between updates of bars and status lines alike, instead of the above.
INTERVAL_VARIABLE = "RECORDFORGE_PROGRESS_SECONDS"
# The local runner asks its workers for figures at least this often, so that a status line
# shows fresh ones.
_LOCAL_ASK_SECONDS = 1.0

_JOIN_SECONDS = 5.0

CONVERT_PHASES = ("listing", "probing", "writing")
PLAN_PHASES = ("listing", "probing")
RESHARD_PHASES = ("writing",)


@dataclass(frozen=True)
class PhaseState:
    """One phase's figures: done of total (total None while unknown), and bytes for writing."""

    name: str
    done: int
    total: int | None
    unit: str
    done_bytes: int | None = None
    total_bytes: int | None = None


def phase_states(counters: dict[str, int], phases=CONVERT_PHASES) -> list[PhaseState]:
    """The phases the counters have reached, in order."""
    planned = counters.get(RECORDS_PLANNED)
    listed = counters.get(INPUTS_LISTED)
    states = []
    if "listing" in phases and listed is not None:
        # Known whole once the planner has run: it needs every input.
        states.append(
            PhaseState("listing", listed, listed if planned is not None else None, "inputs")
        )
    if "probing" in phases and IMAGES_PROBED in counters:
        states.append(PhaseState("probing", counters[IMAGES_PROBED], listed, "images"))
    if "writing" in phases and planned is not None:
        states.append(
            PhaseState(
                "writing",
                counters.get(RECORDS_WRITTEN, 0),
                planned,
                "records",
                counters.get(BYTES_WRITTEN, 0),
                counters.get(BYTES_PLANNED),
            )
        )
    return states


def read_counters(result) -> dict[str, int] | None:
    """recordforge's counters as the runner reports them now (summed over steps); None when
    the runner keeps no metrics."""
    forget_cached_metrics(result)
    try:
        metrics = result.metrics()
        found = metrics.query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except NotImplementedError:
        return None
    counters: dict[str, int] = {}
    for item in found:
        # Live figures are "attempted" (Dataflow, Flink); finished ones also "committed".
        value = max(item.committed or 0, item.attempted or 0)
        counters[item.key.metric.name] = counters.get(item.key.metric.name, 0) + value
    return counters


class ProgressMonitor:
    """Polls a running job's counters from a thread and hands them to a display."""

    def __init__(self, display, poll_seconds: float) -> None:
        self._display = display
        self._poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def local_ask_seconds(self) -> float:
        """How often the local runner asks its workers for their figures."""
        return min(self._poll_seconds, _LOCAL_ASK_SECONDS)

    def watch(self, result) -> None:
        """Poll `result.metrics()` (a PipelineResult's, or a local runner's) until finished."""
        self._thread = threading.Thread(
            target=self._poll, args=(result,), name="recordforge-progress", daemon=True
        )
        self._thread.start()

    def _poll(self, result) -> None:
        shown: dict[str, int] = {}
        while not self._stop.wait(self._poll_seconds):
            try:
                counters = read_counters(result)
            except Exception:  # noqa: BLE001  (a lost poll is not the run's failure)
                continue
            if counters:
                # Never backwards while running: a bundle read as it ends, or a retried one,
                # can report less than before.
                shown = {name: max(value, shown.get(name, 0)) for name, value in counters.items()}
                self._display.update(shown)

    def finish(self, result) -> None:
        """The run finished: its final figures."""
        self._halt()
        try:
            counters = read_counters(result)
        except Exception:  # noqa: BLE001  (the run succeeded; its figures are extra)
            counters = None
        self._display.finish(counters or {})

    def abandon(self) -> None:
        """The run failed or was stopped: close the display, no final figures."""
        self._halt()
        self._display.close()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # Not forever: a poll stuck on a job service that went away must not hold the
            # launcher (the thread is a daemon).
            self._thread.join(timeout=_JOIN_SECONDS)


def monitor(
    *, stream: TextIO | None = None, phases=CONVERT_PHASES, bars: bool | None = None
) -> ProgressMonitor:
    # (`stream` is looked up when called: pytest and notebooks replace sys.stderr.)
    """Bars when `stream` (stderr) is a terminal or a notebook's (tqdm's notebook bars), else a
    status line every STATUS_LINE_SECONDS."""
    stream = stream or sys.stderr
    notebook = stream is sys.stderr and _in_notebook()
    interval = _interval_from_environment()
    if bars is None:
        bars = notebook or stream.isatty()
    if bars:
        return ProgressMonitor(Bars(stream, phases, notebook), interval or BAR_POLL_SECONDS)
    return ProgressMonitor(StatusLines(stream, phases), interval or STATUS_LINE_SECONDS)


def _interval_from_environment() -> float | None:
    """RECORDFORGE_PROGRESS_SECONDS, when set.

    Raises:
        UsageError: it is not a number of seconds above 0.
    """
    text = os.environ.get(INTERVAL_VARIABLE, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise UsageError(f"{INTERVAL_VARIABLE}={text!r}: expected a number of seconds above 0")
    return seconds


class Bars:
    """A tqdm bar per phase: done/total, rate and ETA; the writing bar adds bytes."""

    def __init__(self, stream: TextIO, phases, notebook: bool = False) -> None:
        self._stream = stream
        self._phases = phases
        self._notebook = notebook
        self._bars: dict[str, object] = {}
        self._log_lines_above = contextlib.ExitStack()

    def _bar(self, state: PhaseState):
        bar = self._bars.get(state.name)
        if bar is None:
            if not self._bars and not self._notebook:
                from tqdm.contrib.logging import logging_redirect_tqdm

                # recordforge's log lines (a shard written, ...) go above the bars, not
                # through them, while the bars are shown.
                self._log_lines_above.enter_context(logging_redirect_tqdm([LOGGER]))
            if self._notebook:
                from tqdm.auto import tqdm
            else:
                from tqdm import tqdm
            bar = self._bars[state.name] = tqdm(
                desc=f"{state.name:<8}",
                total=state.total,
                unit=f" {state.unit}",
                file=self._stream,
                position=len(self._bars),
                # A terminal that reports no size (0 x 0) gets 80 x 24, not hidden bars.
                ncols=None if self._notebook else shutil.get_terminal_size().columns,
                nrows=None if self._notebook else shutil.get_terminal_size().lines,
                leave=True,
            )
        return bar

    def update(self, counters: dict[str, int]) -> None:
        for state in phase_states(counters, self._phases):
            bar = self._bar(state)
            if state.total is not None and bar.total != state.total:
                bar.total = state.total
            if state.done_bytes is not None:
                bar.set_postfix_str(_bytes_of(state), refresh=False)
            bar.update(state.done - bar.n)

    def finish(self, counters: dict[str, int]) -> None:
        if not self._bars:
            # Nothing came while the job ran (the runner reports at the end): the figures,
            # not bars whose rates would be made up.
            StatusLines(self._stream, self._phases).finish(counters)
            return
        self.update(counters)
        self.close()

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._log_lines_above.close()


class StatusLines:
    """One line every STATUS_LINE_SECONDS while the figures move, and one at the end."""

    def __init__(self, stream: TextIO, phases) -> None:
        self._stream = stream
        self._phases = phases
        self._first_seen: dict[str, tuple[float, int]] = {}  # phase -> (when, done then)
        self._last: dict[str, int] | None = None

    def update(self, counters: dict[str, int]) -> None:
        if counters != self._last:
            self._last = counters
            self._write(counters, final=False)

    def finish(self, counters: dict[str, int]) -> None:
        self._write(counters, final=True)

    def close(self) -> None:
        pass

    def _write(self, counters: dict[str, int], *, final: bool) -> None:
        states = phase_states(counters, self._phases)
        if not states:
            return
        now = time.monotonic()
        for state in states:
            self._first_seen.setdefault(state.name, (now, state.done))
        parts = [_phrase(state) for state in states]
        current = states[-1]
        since, done_then = self._first_seen[current.name]
        if not final and now > since and current.done > done_then:
            rate = (current.done - done_then) / (now - since)
            parts.append(f"{rate:,.1f} {current.unit}/s")
            if current.total:
                left = (current.total - current.done) / rate
                parts.append(f"about {_duration(left)} left")
        word = "done" if final else "progress"
        print(f"recordforge: {word}: {'; '.join(parts)}", file=self._stream, flush=True)


_VERBS = {"listing": "listed", "probing": "probed", "writing": "wrote"}


def _phrase(state: PhaseState) -> str:
    done = f"{state.done:,}"
    if state.total is not None and state.name != "listing":
        done += f" of {state.total:,}"
    text = f"{_VERBS[state.name]} {done} {state.unit}"
    if state.done_bytes is not None:
        text += f" ({_bytes_of(state)})"
    return text


def _bytes_of(state: PhaseState) -> str:
    total = f"/{human_size(state.total_bytes)}" if state.total_bytes is not None else ""
    return f"{human_size(state.done_bytes)}{total}"


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02}:{seconds:02}" if hours else f"{minutes}:{seconds:02}"


def library_monitor(progress: bool | None, phases=CONVERT_PHASES) -> ProgressMonitor | None:
    """The monitor of a library call's `progress`: True shows it (bars on a terminal or in a
    notebook, else status lines), False nothing, None bars where there is a terminal or a
    notebook and nothing elsewhere (a library prints nothing unasked)."""
    if progress is False:
        return None
    if progress is None and not (_in_notebook() or sys.stderr.isatty()):
        return None
    return monitor(phases=phases)


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules
