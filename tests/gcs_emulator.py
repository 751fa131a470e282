"""A Google Cloud Storage emulator (gcp-storage-emulator) for the tests, on 127.0.0.1.

Beam's GCS filesystem builds a google-cloud-storage client, which talks to the emulator when
STORAGE_EMULATOR_HOST is set. Beam first asks google.auth for default credentials; without any,
every process spends ~30 s probing the metadata server before going anonymous. A dummy
authorized-user file with an unexpired token answers at once and is never refreshed.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

EMULATOR = pathlib.Path(sys.executable).with_name("gcp-storage-emulator")
INSTALL_HINT = "install the test tools: .venv/bin/pip install -e '.[test]' (gcp-storage-emulator)"
PROJECT = "recordforge-test"


@dataclass(frozen=True)
class Emulator:
    """A running emulator: its address and the environment that points clients at it."""

    endpoint: str  # http://127.0.0.1:PORT
    env: dict[str, str]

    def client(self):
        """A google-cloud-storage client of the emulator (anonymous, as the emulator allows)."""
        from google.cloud import storage

        return storage.Client(project=PROJECT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(endpoint: str, process: subprocess.Popen, log: pathlib.Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the storage emulator exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(endpoint + "/", timeout=2) as response:
                if response.status == 200:
                    return
        time.sleep(0.2)
    raise RuntimeError(f"the storage emulator did not answer in 60 s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def running_emulator(workdir: pathlib.Path) -> Iterator[Emulator]:
    """Start the emulator (in memory, 127.0.0.1, a free port); stop it on exit."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    credentials = workdir / "dummy-credentials.json"
    credentials.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "recordforge-tests",
                "client_secret": "unused",
                "refresh_token": "unused",
                # A token that never expires: google.auth never tries to refresh it (offline).
                "token": "emulator",
                "expiry": "2999-01-01T00:00:00Z",
            }
        )
    )
    env = {
        "STORAGE_EMULATOR_HOST": endpoint,
        "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
        "GOOGLE_CLOUD_PROJECT": PROJECT,
    }
    log = workdir / "emulator.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [str(EMULATOR), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_up(endpoint, process, log)
        yield Emulator(endpoint, env)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
