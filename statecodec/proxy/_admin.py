"""The proxy's admin listener: ``/livez``, ``/readyz`` and ``/metrics`` on an address of their own.

Clients of the proxy never reach it (it has its own socket, usually on a private
interface), and it shares nothing with the request path but the process: the endpoints
are :func:`statecodec.ops.app`, served by a second uvicorn server on the same event loop.
That is deliberate for ``/livez``: a loop too busy to answer it is a proxy that is not
serving either.

With several worker processes (``PROMETHEUS_MULTIPROC_DIR`` set, see
:mod:`statecodec.ops`), run it in the supervising process: ``/metrics`` sums every
worker's counters from the shared directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Final

import uvicorn

from ..adapters.asgi import ASGIApp

START_TIMEOUT: Final = 30.0


class _AdminServer(uvicorn.Server):
    """uvicorn without signal handlers: the proxy's own server handles SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


@contextlib.asynccontextmanager
async def admin_listener(app: ASGIApp, sock: socket.socket) -> AsyncIterator[str]:
    """Serve ``app`` on ``sock`` while the block runs; yields its URL once it accepts connections."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
        date_header=False,
        proxy_headers=False,
    )
    server = _AdminServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="statecodec-admin")
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise RuntimeError("the admin listener stopped while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the admin listener did not start within {START_TIMEOUT:g}s")
            await asyncio.sleep(0.02)
        yield url_of(sock)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=10)
