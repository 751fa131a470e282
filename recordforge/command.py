"""The `recordforge` program, with Ctrl-C and SIGTERM handled from its first instant.

Importing Apache Beam takes seconds; a signal during that time must end the program with one
line and the conventional status (130 for SIGINT, 143 for SIGTERM), not a traceback, and so
must one during the run (pipelines/cli.py says what was kept). This module imports nothing
heavy before the handlers are in place.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time

from recordforge import lean_imports, worker_forks
from recordforge.transforms.core.errors import Stopped, WorkerLost
from recordforge.transforms.internals import (
    FN_API_LOST_WORKER,
    FORK_WORKERS,
    fork_server_command,
)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # the stop signal taken, once
_lost: list[str] = []  # a worker process that died, as the thread watching it said
_installed: list[bool] = []


def handle_stops() -> None:
    """From now on SIGINT and SIGTERM raise Stopped in the main thread, after this process's
    worker processes are killed; worker processes started later ignore both signals.

    A Ctrl-C in a terminal goes to every process of the foreground group, Beam's worker
    processes too, which would die printing their own tracebacks. So the signals are blocked
    in every thread (threads inherit the mask) and set to be ignored, a disposition that
    Beam's `/bin/sh -c python ...` workers inherit (a shell keeps an ignored signal ignored,
    and Python then installs no handler); on Linux a blocked signal is queued even so, and a
    watcher thread takes it with sigwait. The watcher kills the workers (the runner, unwinding,
    would wait for them forever), then wakes the main thread with SIGUSR2, whose handler
    raises Stopped. A second signal ends the program at once (a repeat of the first within a
    second is the same stop: GNU timeout signals its child, then its process group).

    A worker process that dies on its own (killed, out of memory) ends the run the same way,
    with WorkerLost: the runner may wait forever for the bundle it had.
    """
    if _installed:
        return
    _installed.append(True)
    threading.excepthook = _thread_failed
    if not hasattr(signal, "pthread_sigmask") or not hasattr(signal, "sigwait"):
        for signum in _STOP_SIGNALS:  # elsewhere: plain handlers
            signal.signal(signum, _raise_stopped)
        return
    signal.signal(signal.SIGUSR2, _raise_taken)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    threading.Thread(target=_watch, name="recordforge-stops", daemon=True).start()


# A repeat of the first stop signal this soon after it is the same stop, not a second one:
# GNU timeout signals its child and then its whole process group, the child again.
_SAME_STOP_SECONDS = 1.0


def _watch() -> None:
    first_taken = 0.0
    while True:
        signum = signal.sigwait(_STOP_SIGNALS)
        if _received and signum == _received[0]:
            if time.monotonic() - first_taken < _SAME_STOP_SECONDS:
                continue
        if _received:
            print(
                f"recordforge: stopped again by {Stopped(signum).name}; exiting at once",
                file=sys.stderr,
                flush=True,
            )
            stop_worker_processes()
            os._exit(128 + signum)
        _received.append(signum)
        first_taken = time.monotonic()
        _end_the_run()


def _thread_failed(args) -> None:
    """A thread's uncaught exception: into the log (-v shows it), not onto the terminal. The
    runner's threads that watch worker processes fail so when a worker dies; the main thread
    reports the run's end once, in one line."""
    logging.getLogger("recordforge").debug(
        "thread %s failed",
        args.thread.name if args.thread else "?",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
    text = str(args.exc_value)
    if FN_API_LOST_WORKER in text and not (_received or _lost):
        _lost.append(text.splitlines()[0][:200])
        _end_the_run()


def _end_the_run() -> None:
    stop_worker_processes()
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)


def received_stop() -> Stopped | WorkerLost | None:
    """The stop this program received (or the worker it lost), if any: code that wraps
    exceptions (Beam's DoFn runner re-raises one raised inside a DoFn as a RuntimeError) is
    told apart so."""
    if _received:
        return Stopped(_received[0])
    return WorkerLost(_lost[0]) if _lost else None


def _raise_taken(signum, frame) -> None:
    taken = received_stop()
    if taken is not None:
        raise taken


def _raise_stopped(signum, frame) -> None:
    _received.append(signum)
    stop_worker_processes()
    raise Stopped(signum)


def stop_worker_processes() -> None:
    """Kill this process's descendants (SIGKILL: at once, and without their own tracebacks).

    Linux only (it reads /proc); elsewhere a runner's worker processes are left to end when
    their connection to this one closes.
    """
    try:
        entries = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return
    children: dict[int, list[int]] = {}
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: the command name may hold spaces and parentheses.
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(parent, []).append(pid)
    found, pending = [], [os.getpid()]
    while pending:
        for child in children.get(pending.pop(), ()):
            found.append(child)
            pending.append(child)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def asks_for_worker_processes(argv: list[str]) -> bool:
    """Whether the arguments ask the local runner for worker processes (`--workers N`, N > 1,
    or Beam's `--direct_running_mode=multi_processing`) and name no other runner: read before
    the arguments are parsed, to start the workers' fork server early (it is only a head
    start: the run starts its own when none was started)."""
    if any(arg == "--runner" or arg.startswith("--runner=") for arg in argv):
        return False
    for index, arg in enumerate(argv):
        value = None
        if arg == "--workers" and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("--workers="):
            value = arg.partition("=")[2]
        if value is not None and value.isdigit() and int(value) > 1:
            return True
        if arg in ("--direct_running_mode=multi_processing", "--direct_running_mode"):
            following = argv[index + 1] if index + 1 < len(argv) else ""
            if arg.endswith("=multi_processing") or following == "multi_processing":
                return True
    return False


# What says where a run goes (pipelines/runner.py, chooses_where_it_runs): with any of them the
# program does not guess.
_PLACEMENT_FLAGS = ("--runner", "--workers", "--direct_num_workers", "--direct_running_mode")


def may_choose_worker_processes(argv: list[str]) -> bool:
    """A guess, before the arguments are parsed, whether `recordforge convert` will run in
    worker processes by recordforge's own choice (pipelines/local_workers.py): no argument
    says where it runs, none names a remote path, and the existing local folders and CSV files
    among them (the output's excepted) hold enough bytes. The program then starts the fork
    server early, as for `--workers N`. A wrong guess costs a fork server ended unused, or the
    head start."""
    if not argv or argv[0] != "convert":
        return False
    if any(arg.startswith(_PLACEMENT_FLAGS) for arg in argv):
        return False
    given = [arg for arg in argv[1:] if not arg.startswith("-")]
    if any("://" in arg for arg in given):
        return False
    outputs = {argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag in ("-o", "--output")}
    inputs = [arg for arg in given if arg not in outputs]
    folders = [arg for arg in inputs if os.path.isdir(arg)]
    tables = [arg for arg in inputs if arg.lower().endswith(".csv") and os.path.isfile(arg)]
    if not folders and not tables:
        return False
    from recordforge.pipelines.local_workers import workers_for_folders, workers_for_tables

    # Tables first: a table's size is one stat, a folder's needs a walk.
    if tables and workers_for_tables(tables) > 1:
        return True
    return bool(folders) and workers_for_folders(folders, remember=True) > 1


_finished: list[int] = []  # the status main() returns, once it has returned


def _end_without_teardown() -> None:
    """The last exit handler (registered first): end the process with main()'s status without
    the interpreter's teardown, which frees Beam's million objects one by one (about a second
    of a short run, and longer on a busy machine). The other exit handlers (Beam's, a job's
    cleanup) have run by then; logging's, registered before this one, is run here."""
    if not _finished:  # main() raised: the usual exit, traceback and all
        return
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(_finished[0])


def main() -> int:
    atexit.register(_end_without_teardown)
    handle_stops()
    argv = sys.argv[1:]
    # This process is recordforge's own: it keeps out the modules no command uses, before Beam
    # is imported (recordforge/lean_imports.py).
    lean_imports.refuse(lean_imports.unused_by_command(argv))
    if FORK_WORKERS and (asks_for_worker_processes(argv) or may_choose_worker_processes(argv)):
        # The workers' fork server imports Beam on another core while this process does.
        worker_forks.prestart(fork_server_command())
    try:
        try:
            with lean_imports.loading_without_collections():
                from recordforge.pipelines.cli import main as cli_main
        except Stopped as stop:
            print(
                f"recordforge: stopped by {stop.name} before starting; nothing was written",
                file=sys.stderr,
            )
            _finished.append(stop.exit_status)
            return stop.exit_status
        status = cli_main()
        _finished.append(status)
        return status
    finally:
        worker_forks.close_prestarted()


if __name__ == "__main__":
    sys.exit(main())
