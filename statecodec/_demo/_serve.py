"""Serve one ASGI app on a socket and announce ``READY <url>`` (for the example servers)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from .._net import bind_socket


async def serve_http(app: Any, host: str, port: int, *, keep_alive: int = 5) -> None:
    """Serve ``app`` at ``/mcp``; print ``READY <url>`` once listening (port 0 picks one).

    Test fixtures start example servers as subprocesses and wait for that line, so the
    port they connect to is the one actually bound. ``keep_alive``: seconds an idle
    connection stays open (uvicorn's ``timeout_keep_alive``).
    """
    sock = bind_socket(host, port)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=keep_alive)
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        print(f"READY http://{host}:{sock.getsockname()[1]}/mcp", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()
