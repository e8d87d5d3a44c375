"""One HTTP request through an ASGI app's interface, as uvicorn makes it: for the forwarder's tests.

The client sends ``chunks`` as the request's body messages, then stays connected (its
``receive`` waits forever, as a client that neither sends nor leaves); every message
the app sends back is kept in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from statecodec.adapters.asgi import ASGIApp


def http_scope(
    path: bytes = b"/mcp",
    method: str = "POST",
    headers: list[tuple[bytes, bytes]] | None = None,
    client: tuple[str, int] = ("127.0.0.1", 5555),
    **extra: Any,
) -> dict[str, Any]:
    """The scope of an HTTP request for ``path`` (raw, with no query unless ``extra`` says)."""
    return {
        "type": "http",
        "method": method,
        "scheme": "http",
        "path": path.decode(),
        "raw_path": path,
        "query_string": b"",
        "headers": headers or [],
        "client": client,
        **extra,
    }


async def exchange(
    app: ASGIApp, scope: dict[str, Any], chunks: list[bytes], timeout: float = 30
) -> list[dict[str, Any]]:
    """Every message ``app`` sends for a request whose body is ``chunks``; bounded by ``timeout``."""
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout)
    return sent


def bodies(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The response's body messages, in order."""
    return [m for m in sent if m["type"] == "http.response.body"]
