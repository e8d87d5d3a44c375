"""``/livez``, ``/readyz`` and ``/metrics`` as one small ASGI application.

Mount it anywhere (``Mount("/ops", app=ops.app(health))`` in Starlette, or serve it on a
listener of its own as ``statecodec proxy --admin-listen`` does): paths are read
relative to the mount point (``root_path``). It answers ``GET`` and ``HEAD`` only, and
never reads a request body.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from ._health import Health
from ._metrics import exposition

if TYPE_CHECKING:  # types only: serving these endpoints needs none of the middleware
    from ..adapters.asgi import ASGIApp, Receive, Scope, Send

_TEXT: Final = [(b"content-type", b"text/plain; charset=utf-8")]
_JSON: Final = [(b"content-type", b"application/json")]
_NO_STORE: Final = (b"cache-control", b"no-store")


def app(health: Health, *, metrics: bool = True) -> ASGIApp:
    """The operations endpoints of one server as an ASGI application.

    - ``GET /livez``: 200 ``ok`` while the process serves;
    - ``GET /readyz``: 200 when every check of ``health`` passes, else 503; the JSON body
      names each failing check and says why (:meth:`Health.acheck`);
    - ``GET /metrics`` (unless ``metrics=False``): Prometheus text, or OpenMetrics when
      the scraper asks for it (needs ``prometheus-client``: ``statecodec[ops]``).
    """

    async def endpoints(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = _relative(scope)
        if path not in ("/livez", "/readyz") and not (metrics and path == "/metrics"):
            await _answer(send, scope, 404, _TEXT, b"not found\n")
        elif scope["method"] not in ("GET", "HEAD"):
            await _answer(send, scope, 405, [*_TEXT, (b"allow", b"GET, HEAD")], b"method not allowed\n")
        elif path == "/livez":
            await _answer(send, scope, 200, _TEXT, b"ok\n")
        elif path == "/readyz":
            readiness = await health.acheck()
            body = json.dumps(readiness.to_dict(), separators=(",", ":")).encode() + b"\n"
            await _answer(send, scope, readiness.status, _JSON, body)
        else:
            accept = ", ".join(
                value.decode("latin-1")
                for name, value in scope.get("headers", ())
                if name.lower() == b"accept"
            )
            body, content_type = exposition(health, accept)
            await _answer(send, scope, 200, [(b"content-type", content_type.encode("latin-1"))], body)

    return endpoints


def _relative(scope: Scope) -> str:
    path: str = scope.get("path", "/")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


async def _answer(
    send: Send, scope: Scope, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    length = (b"content-length", str(len(body)).encode("ascii"))
    await send({"type": "http.response.start", "status": status, "headers": [*headers, _NO_STORE, length]})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message: Any = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
