"""FnApiRunner's worker processes forked from one process that has already imported them.

A multi-process run's workers each used to be a fresh interpreter importing Beam and
recordforge's transforms, seconds of CPU per worker on every run (docs/performance.md). Here
one server process (`python -m recordforge.worker --fork-server`) imports them once, at the
start of the run, and forks a worker for each request: a worker starts in milliseconds.

The standard library's `multiprocessing` forkserver does the same, but it re-imports the
caller's `__main__` in every child: a user's script that calls `recordforge.convert` without
an `if __name__ == "__main__":` guard would start again in each worker. So the protocol is
this module's: JSON lines over the server's stdin and stdout.

    launcher -> server   {"request": N, "env": {...}}      fork a worker with these variables
    server -> launcher   {"request": N, "pid": P}          forked
    server -> launcher   {"pid": P, "exit": CODE}          reaped; CODE as subprocess's returncode

The server exits, killing the workers still running (and reporting their exits), when its
stdin closes (the run ended, or
the launcher died). Its workers are its children, so the launcher's process tree holds them
(recordforge/command.py kills that tree on a stop signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

FORK_SERVER_FLAG = "--fork-server"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

# A process should not fork while other threads run: a lock one of them holds stays held in
# the child. Importing Beam starts two native threads, OpenBLAS's pool (numpy) and the
# background thread of Arrow's bundled jemalloc; these variables keep both from starting in
# the server (a user's own setting wins). Workers use neither BLAS nor that allocator's thread.
_SINGLE_THREADED_IMPORTS = {
    "OPENBLAS_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}


class ForkServerGone(RuntimeError):
    """The fork server ended before the worker did (killed, or failed to start)."""


# What the server and its workers write to stderr: Beam's SDK worker prints the traceback of
# every failed bundle there, a user's refused run included, which the launcher reports in one
# line of its own. So their lines go to this logger, at debug level (`recordforge -v` shows
# them), not straight onto the launcher's terminal.
WORKER_OUTPUT = logging.getLogger("recordforge.workers")


class ForkServer:
    """The launcher's side: starts the server and runs workers through it, thread-safely."""

    def __init__(self, command: list[str]) -> None:
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**_SINGLE_THREADED_IMPORTS, **os.environ},
        )
        self._relay = threading.Thread(
            target=_relay_lines,
            args=(self._process.stderr,),
            name="recordforge-worker-output",
            daemon=True,
        )
        self._relay.start()
        self._writing = threading.Lock()
        self._lock = threading.Lock()
        self._next_request = 0
        self._forked: dict[int, int] = {}  # request -> pid
        self._exits: dict[int, int] = {}  # pid -> exit code
        self._gone = False
        self._changed = threading.Condition(self._lock)
        self._reader = threading.Thread(target=self._read, name="recordforge-forks", daemon=True)
        self._reader.start()

    def run_worker(self, env: dict[str, str]) -> int:
        """Fork a worker with `env` added to the server's environment, wait for it to end and
        return its exit code (negative: the signal that killed it).

        Raises:
            ForkServerGone: the server ended before the worker did.
        """
        with self._writing:  # not under self._lock, which the reader of replies needs
            request = self._next_request
            self._next_request += 1
            line = json.dumps({"request": request, "env": env}) + "\n"
            try:
                self._process.stdin.write(line.encode())
                self._process.stdin.flush()
            except (BrokenPipeError, ValueError) as error:
                raise ForkServerGone("the fork server of the worker processes ended") from error
        with self._lock:
            while request not in self._forked and not self._gone:
                self._changed.wait()
            pid = self._forked.get(request)
            while pid is not None and pid not in self._exits and not self._gone:
                self._changed.wait()
            if pid is None or pid not in self._exits:
                worker = "forking the worker" if pid is None else f"its worker {pid} ended"
                raise ForkServerGone(
                    f"the fork server of the worker processes ended before {worker}"
                )
            return self._exits.pop(pid)

    def close(self) -> None:
        """End the server (and any worker still running) and wait for it."""
        with contextlib.suppress(OSError, ValueError):
            self._process.stdin.close()
        self._process.wait()
        self._reader.join()
        self._relay.join()

    def _read(self) -> None:
        for line in self._process.stdout:
            message = json.loads(line)
            with self._lock:
                if "request" in message:
                    self._forked[message["request"]] = message["pid"]
                else:
                    self._exits[message["pid"]] = message["exit"]
                self._changed.notify_all()
        with self._lock:
            self._gone = True
            self._changed.notify_all()


def _relay_lines(stream) -> None:
    for line in stream:
        WORKER_OUTPUT.debug("%s", line.decode(errors="replace").rstrip())


# A fork server started before the run that takes it (`prestart`): the `recordforge` program
# starts it first thing when its arguments ask for worker processes, so that the server's
# import of Beam runs on another core while the launcher imports Beam and builds the pipeline.
_prestarted: list[ForkServer] = []


def prestart(command: list[str]) -> None:
    """Start a fork server now for the run that will `take_prestarted()` it."""
    if not _prestarted:
        _prestarted.append(ForkServer(command))


def take_prestarted() -> ForkServer | None:
    """The server `prestart` started, if any; the caller closes it."""
    return _prestarted.pop() if _prestarted else None


def close_prestarted() -> None:
    """End a prestarted server that no run took (the program failed before running one)."""
    server = take_prestarted()
    if server is not None:
        server.close()


def serve(run_worker: Callable[[], None]) -> NoReturn:
    """The server's side: read requests on stdin until it closes, forking a child for each
    that sets the request's environment variables and calls `run_worker()`; then end the
    process."""
    requests = os.dup(0)
    replies = os.dup(1)
    # The workers' own stdin and stdout are not the protocol's pipes.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)

    server = os.getpid()
    running: set[int] = set()
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ, "requests")
    selector.register(wake_read, selectors.EVENT_READ, "children")
    pending = b""
    open_requests = True
    while open_requests:
        for key, _ in selector.select():
            if key.data == "children":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
                _reap(running, replies)
                continue
            data = os.read(requests, 65536)
            if not data:
                open_requests = False
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                message = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    for fd in (requests, replies, wake_read, wake_write):
                        os.close(fd)
                    _run_child(message["env"], run_worker, server)
                running.add(pid)
                _reply(replies, {"request": message["request"], "pid": pid})
        _reap(running, replies)
    for pid in running:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    _reap(running, replies, block=True)
    # Ended without the interpreter's own teardown: with Beam's thousands of modules loaded it
    # takes about a second, which the launcher would wait for at the end of every run.
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


def _run_child(env: dict[str, str], run_worker: Callable[[], None], server: int) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _end_with(server)
    os.environ.update(env)
    code = 0
    try:
        run_worker()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _end_with(server: int) -> None:
    """Have the kernel kill this worker when the server, its parent, dies (Linux's
    PR_SET_PDEATHSIG): the launcher kills its process tree when a run stops, and a worker
    orphaned by a killed server would no longer be in it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the worker ends with its connection
        return
    if os.getppid() != server:  # the server died before the request took effect
        os._exit(1)


def _reap(running: set[int], replies: int, block: bool = False) -> None:
    """Report the exits of the workers that have ended (with `block`, of all of them)."""
    while running:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        running.discard(pid)
        _reply(replies, {"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


def _reply(replies: int, message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    with contextlib.suppress(BrokenPipeError):
        while data:
            data = data[os.write(replies, data) :]
