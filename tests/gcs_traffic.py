"""An HTTP proxy in front of the storage emulator that counts the bytes of each object download.

The emulator does not say what it served. Clients pointed at this proxy (STORAGE_EMULATOR_HOST)
reach the emulator through it unchanged; for every media download (`alt=media`) it records the
object and the body's length, so a test can tell how much of a file a run actually fetched.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import re
import threading
import urllib.parse
from collections.abc import Iterator

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


def _downloaded_object(path: str) -> str | None:
    """`bucket/name` when a request path is a media download (JSON API), else None."""
    url = urllib.parse.urlsplit(path)
    if "media" not in urllib.parse.parse_qs(url.query).get("alt", ()):
        return None
    # .../storage/v1/b/<bucket>/o/<name> (its slashes as they are, or percent-encoded)
    match = _OBJECT_PATH.search(url.path)
    return None if match is None else f"{match['bucket']}/{urllib.parse.unquote(match['name'])}"


def _handler(upstream: tuple[str, int], downloads: Downloads):
    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep clients' connections alive, as the emulator does

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.headers.get("Transfer-Encoding"):
                raise RuntimeError("chunked request bodies are not forwarded by this proxy")
            body = self.rfile.read(length) if length else None
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
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

        def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
            pass  # the emulator's log has the requests

    return Forward


@contextlib.contextmanager
def counting_proxy(upstream_endpoint: str) -> Iterator[tuple[str, Downloads]]:
    """Serve a counting proxy of `upstream_endpoint` (http://127.0.0.1:PORT) on 127.0.0.1.

    Yields its endpoint and the Downloads it records; stops it on exit.
    """
    upstream = urllib.parse.urlsplit(upstream_endpoint)
    downloads = Downloads()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), _handler((upstream.hostname, upstream.port), downloads)
    )
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="gcs-traffic", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host}:{port}", downloads
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
