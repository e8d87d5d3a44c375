"""Serve one ASGI app on a socket and announce ``READY <url>`` (for the example servers)."""

from __future__ import annotations

from typing import Any

import uvicorn

from .._net import bind_socket
from .._serving import serve_announcing


async def serve_http(app: Any, host: str, port: int, *, keep_alive: int = 5) -> None:
    """Serve ``app`` at ``/mcp``; print ``READY <url>`` once listening (port 0 picks one).

    Test fixtures start example servers as subprocesses and wait for that line, so the
    port they connect to is the one actually bound. ``keep_alive``: seconds an idle
    connection stays open (uvicorn's ``timeout_keep_alive``).
    """
    sock = bind_socket(host, port)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=keep_alive)
    await serve_announcing(uvicorn.Server(config), sock, lambda url: print(f"READY {url}/mcp", flush=True))
