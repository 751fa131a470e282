"""The same conversion on every runner recordforge supports, compared byte for byte.

One small dataset (a CSV naming images, with a text label, a number column and bad rows) is
converted in process first; then with FnApiRunner's worker processes, on Beam's portable path (a
job service and an SDK worker pool started here as separate processes) and on a dask.distributed
cluster (a scheduler and two workers started here). Every output must equal the in-process one:
the same files, shards and error files byte for byte, and the same manifest apart from its
`created` time (the runner is not recorded in it, by design: the dataset does not depend on it).
Each server is started by the test that uses it, listens on 127.0.0.1 only (checked while the job
runs, for every process of every server and of the launcher) and is stopped, process group and
all, even when the test fails.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import RECORDFORGE, is_loopback, make_image, read_dataset

PYTHON = sys.executable
DASK = str(pathlib.Path(PYTHON).with_name("dask"))
SPLITS = ("--splits", "train=0.7,validation=0.15,test=0.15")
# ~60 small images (~140 KB): thresholds that give several shards per split.
SMALL_SHARDS = ("--min-shard-mb", "0.02", "--max-shard-mb", "0.04")
NUM_ROWS = 64  # 60 good images; a missing one, a corrupt one, a text file, a wrong field count


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> pathlib.Path:
    """data/rows.csv naming images in data/imgs, with a label, a weight and four bad rows."""
    root = tmp_path_factory.mktemp("runners") / "data"
    lines = ["path,label,weight"]
    for i in range(60):
        size = (30 + (i * 37) % 170, 30 + (i * 53) % 130)
        make_image(root / "imgs" / f"{i:03d}.jpg", "JPEG", size=size, seed=i)
        lines.append(f"imgs/{i:03d}.jpg,{('cat', 'dog', 'eel')[i % 3]},{i * 0.25}")
    (root / "imgs" / "corrupt.jpg").write_bytes(b"\xff\xd8 not really a jpeg" * 20)
    (root / "imgs" / "notes.txt").write_text("not a picture\n")
    lines += [
        "imgs/missing.jpg,cat,1.0",
        "imgs/corrupt.jpg,dog,2.0",
        "imgs/notes.txt,eel,3.0",
        "imgs/001.jpg,cat,1.0,extra",
    ]
    (root / "rows.csv").write_text("\n".join(lines) + "\n")
    return root / "rows.csv"


PLAIN_ROWS = 3000  # and one bad row


@pytest.fixture(scope="module")
def plain_table(tmp_path_factory) -> pathlib.Path:
    """A table without images (read column-wise, its records spilled and placed by reference)."""
    path = tmp_path_factory.mktemp("plain") / "plain.csv"
    lines = ["id,kind,score,note"]
    lines += [f"{i},{'abc'[i % 3]},{i / 7:.4f},{'n' * (i % 40)}" for i in range(PLAIN_ROWS)]
    lines.insert(500, "oops,a,1.0,wrong,field count")
    path.write_text("\n".join(lines) + "\n")
    return path


def _plain_args(table: pathlib.Path, out: pathlib.Path) -> list[str]:
    return ["convert", str(table), "-o", str(out), "--name", "ds", "--label-column", "kind"] + [
        *SPLITS,
        "--num-shards",
        "3",
    ]


def _converted_in_process(args: list[str], out: pathlib.Path) -> pathlib.Path:
    """`out` after an in-process `recordforge` run of `args`: the output runners must match."""
    result = subprocess.run([RECORDFORGE, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def plain_reference(plain_table, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("plain-reference") / "out"
    return _converted_in_process(_plain_args(plain_table, out), out)


def assert_same_plain_dataset(out: pathlib.Path, reference: pathlib.Path) -> None:
    """Byte for byte the in-process run's shards and errors; no spill file left behind."""
    want, expected = _assert_same_files(out, reference)
    assert len([name for name in want if ".tfrecord-" in name]) == 9
    assert (expected["num_records"], expected["errors"]["count"]) == (PLAIN_ROWS, 1)


def _convert_args(table: pathlib.Path, out: pathlib.Path) -> list[str]:
    return [
        "convert",
        str(table),
        "-o",
        str(out),
        "--name",
        "ds",
        "--image-column",
        "path",
        "--label-column",
        "label",
        *SPLITS,
        *SMALL_SHARDS,
    ]


@pytest.fixture(scope="module")
def reference(table, tmp_path_factory) -> pathlib.Path:
    """The in-process conversion every runner's output is compared with."""
    out = tmp_path_factory.mktemp("reference") / "out"
    return _converted_in_process(_convert_args(table, out), out)


def _files(out: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _assert_same_files(out: pathlib.Path, reference: pathlib.Path) -> tuple[dict, dict]:
    """Same files and bytes; the manifest may differ in its `created` time only.

    Returns the reference's files (manifest left out) and its manifest.
    """
    got, want = _files(out), _files(reference)
    assert sorted(got) == sorted(want)
    manifest, expected = (json.loads(f.pop("dataset_info.json")) for f in (got, want))
    assert manifest.pop("created") and expected.pop("created")
    assert manifest == expected
    for name in want:
        assert got[name] == want[name], f"{name} differs from the in-process run"
    return want, expected


def assert_same_dataset(out: pathlib.Path, reference: pathlib.Path) -> None:
    """Same files and bytes as the in-process run, read back whole by TensorFlow."""
    want, _ = _assert_same_files(out, reference)
    shards = [name for name in want if ".tfrecord-" in name]
    assert len(shards) > 3 and any(name.startswith("errors/") for name in want)
    # Read back with TensorFlow: every good row once, every bad row in the quarantine.
    info, splits = read_dataset(out)
    names = [r["image/filename"] for records in splits.values() for r in records]
    assert len(names) == len(set(names)) == info["num_records"] == 60
    assert info["num_inputs"] == NUM_ROWS == info["num_records"] + info["errors"]["count"]


# -- servers ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_env() -> dict[str, str]:
    """What server processes run with: this venv's executables first on PATH (Beam's worker pool
    starts SDK workers as plain `python`), and no PYTHONPATH, so recordforge comes from the
    installed package, not from the source tree."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(pathlib.Path(PYTHON).parent), env.get("PATH", "")])
    env["PYTHONWARNINGS"] = "ignore"
    return env


class Server:
    """A server process in its own process group, with its output in a log file."""

    def __init__(
        self, name: str, command: list[str], workdir: pathlib.Path, env: dict | None = None
    ) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=workdir,
                env=env or server_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_for_port(self, port: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited ({self.process.returncode}):\n{self.tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return
            time.sleep(0.2)
        pytest.fail(
            f"{self.name} did not listen on 127.0.0.1:{port} in {timeout:g} s\n{self.tail()}"
        )

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the whole group, then SIGKILL to what is left; never leaves a process."""
        group = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # workers the server started, if still there
        self.process.wait(timeout=10)


@pytest.fixture
def servers(tmp_path):
    """Starts servers for one test (`servers(name, command, env=None)`) and stops them all
    afterwards."""
    started: list[Server] = []
    workdir = tmp_path / "servers"
    workdir.mkdir()

    def start(name: str, command: list[str], env: dict | None = None) -> Server:
        server = Server(name, command, workdir, env)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


class ListenerWatch:
    """Samples, while a job runs, the TCP listeners of process trees (servers and launcher)."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = list(roots)
        self.seen: dict[tuple[str, int], str] = {}  # (ip, port) -> process command line
        self.descendants: dict[int, set[int]] = {root: set() for root in roots}
        self.commands: set[str] = set()  # command lines of the descendants
        self.processes: dict[int, tuple[int, str]] = {}  # descendant -> (parent, command line)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(0.05)

    def sample(self) -> None:
        for root in self.roots:
            with contextlib.suppress(psutil.Error):
                top = psutil.Process(root)
                children = top.children(recursive=True)
                self.descendants[root].update(child.pid for child in children)
                for child in children:
                    with contextlib.suppress(psutil.Error):
                        command = " ".join(child.cmdline())
                        self.commands.add(command)
                        # The latest: a child seen between its fork and its exec still
                        # shows its parent's command line (and an exiting one shows none).
                        if command or child.pid not in self.processes:
                            self.processes[child.pid] = (child.ppid(), command)
                for process in [top, *children]:
                    with contextlib.suppress(psutil.Error):
                        for conn in process.net_connections(kind="inet"):
                            if conn.status == psutil.CONN_LISTEN:
                                key = (conn.laddr.ip, conn.laddr.port)
                                self.seen[key] = " ".join(process.cmdline())[:120]

    def assert_loopback_only(self) -> None:
        assert self.seen, "no listener seen: the watch did not work"
        outside = {
            f"{ip}:{port}": cmd for (ip, port), cmd in self.seen.items() if not is_loopback(ip)
        }
        assert not outside, f"listeners outside 127.0.0.1: {outside}"


def run_watched(args: list[str], servers: list[Server], cwd: pathlib.Path, env: dict | None = None):
    """Run the recordforge command, watching the listeners of it and of the servers."""
    launcher = subprocess.Popen(
        [RECORDFORGE, *args],
        cwd=cwd,
        env={**server_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with ListenerWatch([launcher.pid, *(s.process.pid for s in servers)]) as watch:
        try:
            stdout, stderr = launcher.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            launcher.kill()
            stdout, stderr = launcher.communicate()
            logs = "\n".join(f"--- {s.name}\n{s.tail()}" for s in servers)
            pytest.fail(f"the conversion did not finish in 300 s\n{stderr}\n{logs}")
    assert launcher.returncode == 0, stderr + "\n".join(s.tail() for s in servers)
    return stdout, watch


# -- the runners -----------------------------------------------------------------------------


def test_multi_process_fn_api_runner_writes_the_in_process_bytes(table, reference, tmp_path):
    out = tmp_path / "out"
    multi = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")
    _, watch = run_watched([*_convert_args(table, out), *multi], [], tmp_path)
    assert_same_dataset(out, reference)
    watch.assert_loopback_only()
    # The workers are forked by recordforge's fork server, a child of the launcher running
    # recordforge's worker entry point; nothing runs Beam's (docs/performance.md).
    launcher = watch.roots[0]
    servers = [
        pid
        for pid, (parent, command) in watch.processes.items()
        if parent == launcher and command.endswith(" -m recordforge.worker --fork-server")
    ]
    assert len(servers) == 1, watch.processes
    workers = [pid for pid, (parent, _) in watch.processes.items() if parent == servers[0]]
    assert len(workers) == 2, watch.processes
    assert not [c for c in watch.commands if "sdk_worker_main" in c], sorted(watch.commands)


# Ranges of about 5 KB: the plain table (~90 KB) is read as ~18 tasks.
IN_RANGES = {"RECORDFORGE_CSV_RANGE_MB": "0.005"}


def test_multi_process_fn_api_runner_reads_one_csv_in_ranges(
    plain_table, plain_reference, tmp_path
):
    out = tmp_path / "out"
    run_watched([*_plain_args(plain_table, out), "--workers", "2"], [], tmp_path, IN_RANGES)
    assert_same_plain_dataset(out, plain_reference)


def portable_services(start_server, pool_env=None) -> tuple[int, int, list]:
    """Beam's job service and an SDK worker pool on 127.0.0.1, started through
    recordforge.pipelines.loopback with `start_server` (the `servers` fixture, which stops them):
    their ports, and the servers (the job service's first). `pool_env`: the pool's environment."""
    job_port, pool_port = free_port(), free_port()
    loopback = [PYTHON, "-m", "recordforge.pipelines.loopback"]
    job_service = start_server(
        "job-service",
        [*loopback, "apache_beam.runners.portability.local_job_service_main"]
        + ["--port", str(job_port)],
    )
    worker_pool = start_server(
        "worker-pool",
        [*loopback, "apache_beam.runners.worker.worker_pool_main"]
        + ["--service_port", str(pool_port)],
        pool_env,
    )
    job_service.wait_for_port(job_port)
    worker_pool.wait_for_port(pool_port)
    return job_port, pool_port, [job_service, worker_pool]


def test_portable_runner_with_job_service_and_worker_pool(
    table, reference, plain_table, plain_reference, tmp_path, servers
):
    job_port, pool_port, (job_service, worker_pool) = portable_services(servers)
    pool_before = {p.pid for p in psutil.Process(worker_pool.process.pid).children(recursive=True)}
    out = tmp_path / "out"
    portable = ["--runner", "portable", "--job_endpoint", f"127.0.0.1:{job_port}"]
    portable += ["--worker_pool", f"127.0.0.1:{pool_port}"]
    _, watch = run_watched(
        [*_convert_args(table, out), *portable], [job_service, worker_pool], tmp_path
    )
    assert_same_dataset(out, reference)
    watch.assert_loopback_only()
    # The code ran in SDK worker processes the pool started for the job (not in the job service
    # or the launcher), and they imported recordforge from the installed package: no source
    # tree on their path (their cwd is a temporary folder, PYTHONPATH is unset).
    started = watch.descendants[worker_pool.process.pid] - pool_before
    assert started, f"the worker pool started no SDK worker\n{worker_pool.tail()}"
    # A table without images: its spill files are written and read by the SDK workers.
    plain = tmp_path / "plain"
    run_watched([*_plain_args(plain_table, plain), *portable], [job_service, worker_pool], tmp_path)
    assert_same_plain_dataset(plain, plain_reference)


def test_a_job_service_that_dies_mid_run_is_one_line_and_the_previous_dataset_stays(
    table, reference, tmp_path, servers
):
    """The job service killed once it runs the job: Beam raised the gRPC error of its state
    stream (UNAVAILABLE), which the launcher printed as a 20-line traceback."""
    import shutil

    job_port, pool_port, (job_service, worker_pool) = portable_services(servers)
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    before = _files(out)
    portable = ["--runner", "portable", "--job_endpoint", f"127.0.0.1:{job_port}"]
    portable += ["--worker_pool", f"127.0.0.1:{pool_port}", "--overwrite", "--check-pixels"]
    with open(tmp_path / "stderr", "wb") as stderr:
        launcher = subprocess.Popen(
            [RECORDFORGE, *_convert_args(table, out), *portable],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        deadline = time.monotonic() + 120
        while "Running job" not in job_service.log.read_text(errors="replace"):
            assert launcher.poll() is None and time.monotonic() < deadline, job_service.tail()
            time.sleep(0.05)
        os.killpg(job_service.process.pid, signal.SIGKILL)
        launcher.wait(timeout=120)
    message = (tmp_path / "stderr").read_text()
    assert launcher.returncode == 1, message
    assert "Traceback" not in message, message
    assert (
        message.strip()
        .splitlines()[-1]
        .startswith("recordforge: failed: the runner lost its job service (")
    ), message
    assert f"{out} is as it was" in message
    assert _files(out) == before


def dask_cluster(start_server, tmp_path, env=None) -> tuple[int, list]:
    """A scheduler and two one-thread workers on 127.0.0.1, started with `start_server` (the
    `servers` fixture, which stops them): the scheduler's port, and the servers (the
    scheduler's first). `env`: the scheduler's environment."""
    from distributed import Client

    if not pathlib.Path(DASK).exists():
        pytest.fail(f"{DASK} is missing: install the test tools with pip install -e '.[test]'")
    port = free_port()
    local = ("--dashboard-address", "127.0.0.1:0")  # the dashboard binds every interface else
    scheduler = start_server(
        "dask-scheduler",
        [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), *local],
        env=env,
    )
    scheduler.wait_for_port(port)
    workers = [
        start_server(
            f"dask-worker-{i}",
            [DASK, "worker", f"127.0.0.1:{port}", "--host", "127.0.0.1", "--nthreads", "1"]
            + [*local, "--local-directory", str(tmp_path / f"worker-{i}")],
        )
        for i in range(2)
    ]
    with Client(f"127.0.0.1:{port}", timeout=60) as client:
        client.wait_for_workers(2, timeout=90)
    return port, [scheduler, *workers]


def test_dask_runner_on_a_scheduler_and_two_workers(
    table, reference, plain_table, plain_reference, tmp_path, servers
):
    from distributed import Client

    port, cluster = dask_cluster(servers, tmp_path)
    out = tmp_path / "out"
    dask = ["--runner", "dask", "--dask_client_address", f"127.0.0.1:{port}"]
    with Client(f"127.0.0.1:{port}", timeout=60) as client:
        client.wait_for_workers(2, timeout=90)
        addresses = set(client.scheduler_info()["workers"])
        client.get_task_stream()  # starts the scheduler's record of which worker ran what
        started = time.time()
        _, watch = run_watched([*_convert_args(table, out), *dask], cluster, tmp_path)
        tasks = client.get_task_stream(start=started)
        # A table without images: spilled, placed by reference and written on the workers;
        # then read in ranges, spread over both workers.
        plain = tmp_path / "plain"
        run_watched([*_plain_args(plain_table, plain), *dask], cluster, tmp_path)
        ranged = tmp_path / "ranged"
        run_watched([*_plain_args(plain_table, ranged), *dask], cluster, tmp_path, IN_RANGES)
    assert_same_plain_dataset(plain, plain_reference)
    assert_same_plain_dataset(ranged, plain_reference)
    assert_same_dataset(out, reference)
    watch.assert_loopback_only()
    used = collections.Counter(task["worker"] for task in tasks)
    assert set(used) == addresses and len(addresses) == 2, f"tasks per worker: {used}"
