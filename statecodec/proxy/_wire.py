"""The JSON-RPC error bodies the proxy answers itself (a refused Host, a dead upstream, a shed stream).

One writer for all of them, from the boundary's :class:`~statecodec.boundary.WireError`:
its code, message and data, and its HTTP status.
"""

from __future__ import annotations

from ..adapters.asgi import Send, dumps
from ..boundary import WireError


async def respond_error(send: Send, request_id: object, error: WireError) -> None:
    """Answer ``error`` with HTTP ``error.status``, as the JSON-RPC error of request ``request_id``."""
    body = dumps({"jsonrpc": "2.0", "id": request_id, "error": error.error()})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
