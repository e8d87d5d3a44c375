"""Tiny HTTP servers the tests write themselves, on a free loopback port, served in a thread.

For what has no real server to start (an identity provider's JWKS, a Kubernetes
TokenReview endpoint, an upstream that records or scripts its answers). ``with
Loopback(Handler) as server`` serves until the block ends, then shuts down and joins
its thread: nothing keeps listening after a test. And :func:`refusing_port`, a port where
connections are refused for as long as a test needs one.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses every connection until the block ends: bound, never listening.

    Held, not closed and reused: a number whose socket was closed is free for any server
    that starts meanwhile, and the test would then talk to it.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


class Quiet(BaseHTTPRequestHandler):
    """A handler that keeps the test output clean (no line per request on stderr)."""

    def log_message(self, *args: Any) -> None:
        pass

    def reply(
        self,
        status: int,
        body: bytes,
        media: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """One whole answer: status, ``Content-Type``, ``headers``, the length, then the body."""
        self.send_response(status)
        self.send_header("Content-Type", media)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def reply_json(self, status: int, document: Any) -> None:
        self.reply(status, json.dumps(document).encode())


class Loopback:
    """A ``ThreadingHTTPServer`` on 127.0.0.1, port 0, serving ``handler`` from a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port: int = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
