"""An HTTP proxy in front of the storage emulator: counts downloads, enforces preconditions,
and fails requests on demand.

Clients pointed at this proxy (STORAGE_EMULATOR_HOST) reach the emulator through it. For every
media download (`alt=media`) it records the object and the body's length, so a test can tell how
much of a file a run actually fetched. The emulator ignores generation preconditions
(`ifGenerationMatch`), which Cloud Storage enforces and recordforge's lock relies on: with
`preconditions`, the proxy checks them itself, as Cloud Storage documents (0: the object must
not exist; N: its generation must be N; otherwise 412 Precondition Failed), and adds to each media
download the `X-Goog-Generation` header Cloud Storage sends and the emulator does not (the client
library takes a downloaded blob's generation from it, and without it the lock's conditional
delete became unconditional). And `Faults` makes it answer chosen requests with an error, as an
overloaded or failing service would.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import json
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

_OBJECT_PATH = re.compile(r"/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>.+)$")
# Headers that belong to one connection, not to the request or response carried over it.
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}


class Downloads:
    """Media downloads seen so far: per object (`bucket/name`), the body length of each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[str, list[int]] = collections.defaultdict(list)

    def record(self, obj: str, size: int) -> None:
        with self._lock:
            self._sizes[obj].append(size)

    def of(self, obj: str) -> list[int]:
        """The body length of each download of `obj` (`bucket/name`), in order."""
        with self._lock:
            return list(self._sizes.get(obj, ()))

    def clear(self) -> None:
        with self._lock:
            self._sizes.clear()


class Faults:
    """Which requests the proxy answers with an error instead of forwarding them.

    `fail(status, count=..., seconds=..., when=...)`: the next `count` requests (or all for
    `seconds`) for which `when(method, path)` holds get `status`. `failed` counts those answered
    so.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rule: tuple | None = None
        self.failed = 0

    def fail(
        self,
        status: int = 503,
        *,
        count: int | None = None,
        seconds: float | None = None,
        when: Callable[[str, str], bool] = lambda method, path: True,
    ) -> None:
        until = time.monotonic() + seconds if seconds is not None else None
        with self._lock:
            self._rule = (status, count, until, when)

    def clear(self) -> None:
        with self._lock:
            self._rule = None

    def status_for(self, method: str, path: str) -> int | None:
        with self._lock:
            if self._rule is None:
                return None
            status, count, until, when = self._rule
            if until is not None and time.monotonic() > until:
                self._rule = None
                return None
            if not when(method, path):
                return None
            if count is not None:
                if count <= 0:
                    self._rule = None
                    return None
                self._rule = (status, count - 1, until, when)
            self.failed += 1
            return status


def _precondition(method: str, path: str, body: bytes | None) -> tuple[str, str, int] | None:
    """(bucket, object, expected generation) of a request that carries ifGenerationMatch."""
    url = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(url.query)
    if "ifGenerationMatch" not in query:
        return None
    expected = int(query["ifGenerationMatch"][0])
    match = re.search(r"/b/(?P<bucket>[^/]+)/o(?:/(?P<name>.+))?$", url.path)
    if match is None:
        return None
    name = match["name"] and urllib.parse.unquote(match["name"])
    if not name and "name" in query:
        name = query["name"][0]
    if not name and body:
        found = re.search(rb'"name"\s*:\s*"([^"]+)"', body)
        name = found and json.loads(b'"' + found.group(1) + b'"')
    return (match["bucket"], name, expected) if name else None


def _downloaded_object(path: str) -> str | None:
    """`bucket/name` when a request path is a media download (JSON API), else None."""
    url = urllib.parse.urlsplit(path)
    if "media" not in urllib.parse.parse_qs(url.query).get("alt", ()):
        return None
    # .../storage/v1/b/<bucket>/o/<name> (its slashes as they are, or percent-encoded)
    match = _OBJECT_PATH.search(url.path)
    return None if match is None else f"{match['bucket']}/{urllib.parse.unquote(match['name'])}"


def _generation(upstream: tuple[str, int], bucket: str, name: str) -> int:
    """The object's generation in the emulator, 0 when it does not exist."""
    connection = http.client.HTTPConnection(*upstream, timeout=60)
    try:
        quoted = urllib.parse.quote(name, safe="")
        connection.request("GET", f"/storage/v1/b/{bucket}/o/{quoted}")
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    if response.status == 404:
        return 0
    return int(json.loads(payload)["generation"])


def _handler(upstream: tuple[str, int], downloads: Downloads, faults: Faults, preconditions: bool):
    checked = threading.Lock()  # a check and the request it guards, one at a time

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep clients' connections alive, as the emulator does

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.headers.get("Transfer-Encoding"):
                raise RuntimeError("chunked request bodies are not forwarded by this proxy")
            body = self.rfile.read(length) if length else None
            status = faults.status_for(self.command, self.path)
            if status is not None:
                self._reply(status, {"error": {"code": status, "message": "injected by a test"}})
                return
            condition = _precondition(self.command, self.path, body) if preconditions else None
            if condition is None:
                self._relay(body)
                return
            bucket, name, expected = condition
            with checked:
                if _generation(upstream, bucket, name) != expected:
                    error = {"code": 412, "message": "conditionNotMet", "errors": []}
                    self._reply(412, {"error": error})
                    return
                self._relay(body)

        def _reply(self, status: int, document: dict) -> None:
            payload = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _relay(self, body: bytes | None) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            connection = http.client.HTTPConnection(*upstream, timeout=60)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                payload = response.read()
            finally:
                connection.close()
            obj = _downloaded_object(self.path)
            if obj is not None and self.command == "GET":
                downloads.record(obj, len(payload))
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            if (
                preconditions
                and obj is not None
                and self.command == "GET"
                and response.status in (200, 206)
                and response.getheader("X-Goog-Generation") is None
            ):
                bucket, name = obj.split("/", 1)
                self.send_header("X-Goog-Generation", str(_generation(upstream, bucket, name)))
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

        def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
            pass  # the emulator's log has the requests

    return Forward


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # A client killed in the middle of a request (the fault tests kill runs) is expected.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def counting_proxy(upstream_endpoint: str) -> Iterator[tuple[str, Downloads]]:
    """Serve a counting proxy of `upstream_endpoint` (http://127.0.0.1:PORT) on 127.0.0.1.

    Yields its endpoint and the Downloads it records; stops it on exit.
    """
    with storage_proxy(upstream_endpoint) as (endpoint, downloads, _):
        yield endpoint, downloads


@contextlib.contextmanager
def storage_proxy(
    upstream_endpoint: str, *, preconditions: bool = False
) -> Iterator[tuple[str, Downloads, Faults]]:
    """Serve a proxy of `upstream_endpoint` (http://127.0.0.1:PORT) on 127.0.0.1.

    Yields its endpoint, the Downloads it records and the Faults it injects; stops it on exit.
    With `preconditions`, it enforces ifGenerationMatch as Cloud Storage does.
    """
    upstream = urllib.parse.urlsplit(upstream_endpoint)
    downloads = Downloads()
    faults = Faults()
    server = _Server(
        ("127.0.0.1", 0),
        _handler((upstream.hostname, upstream.port), downloads, faults, preconditions),
    )
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="gcs-traffic", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host}:{port}", downloads, faults
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def proxied_emulator(
    workdir, *, preconditions: bool = False
) -> Iterator[tuple[object, Downloads, Faults]]:
    """The storage emulator (its files in `workdir`) behind a `storage_proxy`, with this
    process's environment pointing at the proxy, so the programs it starts talk to it too.

    Yields (emulator, downloads, faults); restores the environment and stops both on exit.
    """
    import pytest
    from gcs_emulator import EMULATOR, INSTALL_HINT, running_emulator

    if not EMULATOR.exists():
        pytest.fail(f"gcp-storage-emulator is missing; {INSTALL_HINT}")
    with (
        running_emulator(workdir) as emulator,
        storage_proxy(emulator.endpoint, preconditions=preconditions) as (
            endpoint,
            downloads,
            faults,
        ),
        pytest.MonkeyPatch.context() as patch,
    ):
        for key, value in emulator.env.items():
            patch.setenv(key, value)
        patch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        yield emulator, downloads, faults
