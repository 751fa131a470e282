"""A dask.distributed cluster on this machine for the `recordforge-dask` method.

    with DaskCluster(workers=2) as cluster:
        ... recordforge convert ... --runner dask --dask_client_address cluster.address

A scheduler and `workers` one-thread workers (`dask worker --nthreads 1 --nworkers 1`), all
listening on 127.0.0.1 only (dashboards too), started from this interpreter's environment and
stopped, process groups and all, when the block ends. The cluster lives for the whole
benchmark, so the first Dask run is the one that pays Beam's import on each worker (the JSON
marks it, `first_on_cluster`). Its processes are not in a run's process tree: `cpu_s()` and
`rss_mb()` read them, and the harness adds the CPU a run cost them to its cpu_s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil

_LOCAL = ("--dashboard-address", "127.0.0.1:0")  # a dashboard binds every interface otherwise


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class DaskCluster:
    def __init__(self, workers: int, work_dir: str, log=print) -> None:
        self.workers = workers
        self.work_dir = work_dir
        self.address = f"127.0.0.1:{_free_port()}"
        self._log = log
        self._processes: list[subprocess.Popen] = []
        self.runs = 0  # Dask runs so far on this cluster

    def __enter__(self) -> DaskCluster:
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        # Workers import recordforge as installed, never from a source tree on PYTHONPATH.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        port = self.address.rpartition(":")[2]
        try:
            scheduler = [dask, "scheduler", "--host", "127.0.0.1", "--port", port, *_LOCAL]
            self._start("scheduler", scheduler, env)
            for i in range(self.workers):
                folder = os.path.join(self.work_dir, f"dask-worker-{i}")
                self._start(
                    f"worker-{i}",
                    [dask, "worker", self.address, "--host", "127.0.0.1", "--nthreads", "1"]
                    + ["--nworkers", "1", *_LOCAL, "--local-directory", folder],
                    env,
                )
            from distributed import Client

            with Client(self.address, timeout=60) as client:
                client.wait_for_workers(self.workers, timeout=120)
        except BaseException:
            self.stop()
            raise
        self._log(f"dask: scheduler and {self.workers} one-thread workers at {self.address}")
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _start(self, name: str, command: list[str], env: dict) -> None:
        log = open(os.path.join(self.work_dir, f"dask-{name}.log"), "wb")  # noqa: SIM115
        self._processes.append(
            subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )
        log.close()

    def stop(self) -> None:
        for process in reversed(self._processes):
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 30
        for process in self._processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes.clear()

    def _members(self) -> list[psutil.Process]:
        members = []
        for process in self._processes:
            try:
                root = psutil.Process(process.pid)
                members += [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
        return members

    def cpu_s(self) -> float:
        """User + system CPU seconds of the scheduler's and workers' processes so far."""
        total = 0.0
        for member in self._members():
            try:
                times = member.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def rss_mb(self) -> float:
        """The cluster's processes' resident memory now (MiB)."""
        total = 0
        for member in self._members():
            try:
                total += member.memory_info().rss
            except psutil.Error:
                continue
        return total / (1 << 20)
