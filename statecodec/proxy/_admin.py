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
from collections.abc import AsyncIterator
from typing import Final

from .._net import socket_url
from .._serving import EmbeddedServer, quiet_config, wait_started
from ..adapters.asgi import ASGIApp

START_TIMEOUT: Final = 30.0


@contextlib.asynccontextmanager
async def admin_listener(app: ASGIApp, sock: socket.socket) -> AsyncIterator[str]:
    """Serve ``app`` on ``sock`` while the block runs; yields its URL once it accepts connections."""
    # No signal handlers: the proxy's own server handles SIGINT/SIGTERM.
    server = EmbeddedServer(quiet_config(app, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="statecodec-admin")
    try:
        await wait_started(server, task, timeout=START_TIMEOUT, what="the admin listener")
        yield socket_url(sock)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=10)
