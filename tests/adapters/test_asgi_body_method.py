"""What the middleware tells its application of the body it read: the JSON-RPC method, in the scope.

The proxy's forwarder decides whether a POST opens a long-lived stream by the body's
method; behind the middleware it takes the method the middleware read
(``scope["extensions"][BODY_METHOD]``) instead of reading the body again. The key is set
only where the body was read as one strict JSON-RPC message, and a server's own extensions
are kept beside it. The application is a raw ASGI app recording its scope; the codec, keys
and replay store are real.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from statecodec import KeyRing, StateCodec
from statecodec.adapters.asgi import BODY_METHOD, RequestStateMiddleware
from statecodec.replay import MemoryReplayStore

_ABSENT = "absent"
LISTEN = "subscriptions/listen"


def _body(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


async def _extensions_seen(method: str, path: str, body: bytes) -> dict[str, Any]:
    """The ``extensions`` of the scope the application behind the middleware gets."""
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["extensions"])
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    codec = StateCodec(KeyRing.generate(), replay=MemoryReplayStore())
    middleware = RequestStateMiddleware(app, codec, audience="deploy", passthrough_paths=["/health"])
    headers = [(b"host", b"testserver"), (b"content-length", b"%d" % len(body))]
    server_extensions: dict[str, Any] = {"http.response.trailers": {}}
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "headers": headers,
        "extensions": server_extensions,
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    assert sent[0]["status"] == 202
    (extensions,) = seen
    assert extensions["http.response.trailers"] == {}  # the server's own, kept
    assert server_extensions == {"http.response.trailers": {}}  # and its dict left as it was
    return extensions


@pytest.mark.parametrize(
    ("method", "path", "body", "read"),
    [
        ("POST", "/mcp", _body({"id": 1, "method": LISTEN, "params": {}}), LISTEN),
        ("POST", "/mcp", b'{"jsonrpc":"2.0","id":1,"method":"subscriptions\\/listen"}', LISTEN),
        ("POST", "/mcp", _body({"id": 1, "method": "tools/list"}), "tools/list"),
        ("POST", "/mcp", _body({"method": "notifications/initialized"}), "notifications/initialized"),
        ("POST", "/mcp", _body({"id": 1, "result": {}}), None),  # a client's answer names no method
        ("POST", "/mcp", b"", _ABSENT),  # nothing read
        ("GET", "/mcp", b"", _ABSENT),
        ("POST", "/health", _body({"id": 1, "method": LISTEN}), _ABSENT),  # not read as MCP
    ],
    ids=["listen", "an_escaped_slash", "list", "notification", "answer", "empty", "get", "passthrough"],
)
async def test_the_application_is_told_the_method_read_from_the_body(
    method: str, path: str, body: bytes, read: str | None
) -> None:
    extensions = await _extensions_seen(method, path, body)
    assert extensions.get(BODY_METHOD, _ABSENT) == read
