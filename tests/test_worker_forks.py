"""The fork server of FnApiRunner's worker processes (recordforge/worker_forks.py)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import make_image

from recordforge.worker_forks import FORK_SERVER_FLAG, ForkServer, ForkServerGone

# A fork server whose "worker" does what its environment says: exit with a code, print a
# variable, wait for others to start, or write its pid to a file and wait to be killed.
_TOY_SERVER = textwrap.dedent(
    """
    import os, sys, time
    from recordforge.worker_forks import serve

    def work():
        if "PIDFILE" in os.environ:
            with open(os.environ["PIDFILE"], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        if "BARRIER" in os.environ:  # wait for N workers to arrive, 60 s at most
            folder, count = os.environ["BARRIER"].rsplit(":", 1)
            open(os.path.join(folder, str(os.getpid())), "w").close()
            deadline = time.monotonic() + 60
            while len(os.listdir(folder)) < int(count):
                if time.monotonic() > deadline:
                    sys.exit(99)
                time.sleep(0.01)
        print(os.environ.get("SAY", ""), file=sys.stderr)
        sys.exit(int(os.environ.get("CODE", "0")))

    serve(work)
    """
)


@pytest.fixture
def toy_server():
    server = ForkServer([sys.executable, "-c", _TOY_SERVER])
    yield server
    server.close()


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for_file(path: pathlib.Path) -> int:
    deadline = time.monotonic() + 30
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.01)
    return int(path.read_text())


def test_a_worker_gets_its_environment_and_its_exit_code_comes_back(toy_server):
    assert toy_server.run_worker({"CODE": "0"}) == 0
    assert toy_server.run_worker({"CODE": "3"}) == 3
    assert toy_server.run_worker({"CODE": "0", "SAY": "hello"}) == 0


def test_workers_run_at_once_and_each_caller_gets_its_own_code(toy_server, tmp_path):
    # Each worker waits until all four have started (exit 99 if they never do): they can
    # only all succeed if they run side by side.
    codes: dict[int, int] = {}

    def run(code: int) -> None:
        codes[code] = toy_server.run_worker({"CODE": str(code), "BARRIER": f"{tmp_path}:4"})

    threads = [threading.Thread(target=run, args=(code,)) for code in (0, 1, 2, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == {0: 0, 1: 1, 2: 2, 5: 5}


def test_a_worker_killed_by_a_signal_reports_it_as_subprocess_does(toy_server, tmp_path):
    pidfile = tmp_path / "pid"
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(toy_server.run_worker({"PIDFILE": str(pidfile)}))
    )
    thread.start()
    os.kill(_wait_for_file(pidfile), signal.SIGKILL)
    thread.join(30)
    assert result == [-signal.SIGKILL]


def test_closing_the_server_ends_the_workers_still_running(tmp_path):
    server = ForkServer([sys.executable, "-c", _TOY_SERVER])
    pidfile = tmp_path / "pid"
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(server.run_worker({"PIDFILE": str(pidfile)}))
    )
    thread.start()
    worker = _wait_for_file(pidfile)
    server.close()
    thread.join(30)
    assert not _alive(worker)
    assert result == [-signal.SIGKILL]


def test_a_killed_server_fails_the_waiting_callers_and_takes_its_workers_along(tmp_path):
    server = ForkServer([sys.executable, "-c", _TOY_SERVER])
    pidfile = tmp_path / "pid"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run_worker({"PIDFILE": str(pidfile)})
        except ForkServerGone as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    worker = _wait_for_file(pidfile)
    os.kill(server._process.pid, signal.SIGKILL)
    thread.join(30)
    assert len(errors) == 1 and "ended" in str(errors[0])
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(worker), "the orphaned worker is still running"
    with pytest.raises(ForkServerGone):
        server.run_worker({"CODE": "0"})
    server.close()


def test_the_real_server_forks_from_a_single_thread():
    """After importing Beam and recordforge's transforms the server must still be one thread
    (a fork copies only the calling thread; a lock another one held would stay held)."""
    server = ForkServer([sys.executable, "-m", "recordforge.worker", FORK_SERVER_FLAG])
    try:
        # No runner to connect to: Beam's SDK worker fails at once, after the fork.
        assert server.run_worker({}) != 0
        threads = os.listdir(f"/proc/{server._process.pid}/task")
        assert len(threads) == 1, threads
    finally:
        server.close()


def test_a_script_without_a_main_guard_runs_once_with_worker_processes(tmp_path):
    """multiprocessing's own fork server would run the caller's __main__ again in each worker:
    a script calling recordforge.convert at its top level would start over in each."""
    photos = tmp_path / "photos"
    for index in range(6):
        make_image(photos / "cats" / f"{index}.jpg", "JPEG", size=(40, 30), seed=index)
    script = tmp_path / "convert_photos.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import recordforge
            print("script started", flush=True)
            dataset = recordforge.convert(
                {str(photos)!r},
                {str(tmp_path / "out")!r},
                beam_args=["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
            )
            print("records:", dataset.num_records)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["script started", "records: 6"], result.stdout


# The `recordforge` program with ForkServer recording, for each server it starts, whether the
# program had imported Apache Beam yet; then the names of the servers' processes still alive
# when the program has returned.
_COUNTED_PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    from recordforge import command, worker_forks

    started = []
    real_init = worker_forks.ForkServer.__init__

    def counting_init(self, command_line):
        real_init(self, command_line)
        started.append({"beam_loaded": "apache_beam" in sys.modules,
                         "pid": self._process.pid})

    worker_forks.ForkServer.__init__ = counting_init
    sys.argv = ["recordforge", *sys.argv[1:]]
    code = command.main()
    alive = [s["pid"] for s in started if os.path.exists(f"/proc/{s['pid']}")
             and open(f"/proc/{s['pid']}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    print(json.dumps({"code": code, "started": started, "alive": alive}))
    """
)


def _counted_run(tmp_path, *args) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _COUNTED_PROGRAM, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    import json

    return json.loads(result.stdout.splitlines()[-1]) | {"stderr": result.stderr}


def test_asked_for_workers_the_program_starts_their_fork_server_before_it_loads_beam(tmp_path):
    photos = tmp_path / "photos"
    for index in range(6):
        make_image(photos / "cats" / f"{index}.jpg", "JPEG", size=(40, 30), seed=index)
    run = _counted_run(tmp_path, "convert", photos, "--output", tmp_path / "out", "--workers", "2")
    assert run["code"] == 0, run["stderr"]
    # One server, started ahead of Beam's import and taken by the run (not a second one).
    assert [s["beam_loaded"] for s in run["started"]] == [False], run
    assert run["alive"] == [], "the run ends its fork server"
    assert (tmp_path / "out" / "dataset_info.json").is_file()


def test_a_prestarted_fork_server_that_no_run_takes_is_ended_before_the_program_returns(
    tmp_path,
):
    run = _counted_run(
        tmp_path,
        "convert",
        tmp_path / "no-such-folder",
        "--output",
        tmp_path / "out",
        "--workers",
        "2",
    )
    assert run["code"] == 2, run["stderr"]
    assert "no-such-folder" in run["stderr"]
    assert [s["beam_loaded"] for s in run["started"]] == [False], run
    assert run["alive"] == [], "the unused fork server outlived the program"


def test_in_process_runs_start_no_fork_server(tmp_path):
    photos = tmp_path / "photos"
    make_image(photos / "cats" / "0.jpg", "JPEG", size=(40, 30), seed=0)
    run = _counted_run(tmp_path, "convert", photos, "--output", tmp_path / "out", "--workers", "1")
    assert run["code"] == 0, run["stderr"]
    assert run["started"] == []


@pytest.mark.parametrize(
    ("argv", "asks"),
    [
        (["convert", "x", "--workers", "2"], True),
        (["convert", "x", "--workers=4"], True),
        (["convert", "x", "--workers", "1"], False),
        (["convert", "x", "--workers"], False),
        (["convert", "x", "--workers", "two"], False),
        (["convert", "x", "--direct_running_mode=multi_processing"], True),
        (["convert", "x", "--direct_running_mode", "multi_processing"], True),
        (["convert", "x", "--direct_running_mode=in_memory"], False),
        (["convert", "x", "--workers", "2", "--runner", "dask"], False),
        (["convert", "x", "--runner=portable", "--direct_running_mode=multi_processing"], False),
        (["convert", "x"], False),
    ],
)
def test_which_arguments_ask_for_worker_processes(argv, asks):
    from recordforge.command import asks_for_worker_processes

    assert asks_for_worker_processes(argv) is asks
