"""Serving an ASGI application on a bound socket with uvicorn: written once, for every server statecodec runs.

The proxy (:mod:`statecodec.proxy`), its admin listener and the demo's instances all
serve an application on a socket bound beforehand (:func:`statecodec._net.bind_socket`:
no other process can take the port in between, port 0 picks a free one). Two ways:

- in the foreground until SIGINT/SIGTERM (:func:`serve_announcing`), telling the caller
  the URL once connections are accepted;
- embedded beside other work on the same event loop (:class:`EmbeddedServer`, started as
  a task and awaited with :func:`wait_started`): uvicorn then installs no signal handlers,
  because its owner handles the signals and stops it itself.

Needs uvicorn (the ``proxy`` or ``mcp`` extra); only the modules that serve import this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from ._net import socket_url


def quiet_config(app: Any, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for a statecodec server: ``options`` on top of what all of them share.

    No logging configuration of uvicorn's own (``log_config=None``): its records reach the
    process's handlers, which ``statecodec proxy`` sets (text or JSON), instead of a stderr
    handler of uvicorn's in another format. No access log: it would log every request
    path, and the servers' own records carry what an operator needs without any token.
    No ``Server`` and ``Date`` headers (the proxy lets the upstream's through unchanged),
    and no ``X-Forwarded-*`` reading: nothing here sits behind a proxy it could trust.
    """
    shared: dict[str, Any] = {
        "log_config": None,
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "date_header": False,
        "proxy_headers": False,
    }
    return uvicorn.Config(app, **{**shared, **options})


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: its owner handles SIGINT/SIGTERM and stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def wait_started(
    server: uvicorn.Server,
    task: asyncio.Task[None],
    *,
    timeout: float,
    what: str,
    failure: Callable[[str], Exception] = RuntimeError,
    deadline: float | None = None,
) -> None:
    """Return once ``server`` (running as ``task``) accepts connections.

    Raises what stopped the task if it ended while starting, else ``failure(text)``;
    ``failure(text)`` too when it has not started within ``timeout`` seconds (or by
    ``deadline``, a ``time.monotonic()`` instant shared by several servers started together).
    """
    deadline = time.monotonic() + timeout if deadline is None else deadline
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise failure(f"{what} stopped while starting")
        if time.monotonic() > deadline:
            raise failure(f"{what} did not start within {timeout:g}s")
        await asyncio.sleep(0.02)


async def serve_announcing(
    server: uvicorn.Server, sock: socket.socket, on_ready: Callable[[str], None] | None
) -> None:
    """Serve on ``sock`` until uvicorn stops; ``on_ready(url)`` once it accepts connections."""

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        if on_ready is not None:
            on_ready(socket_url(sock))

    announcer = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()
