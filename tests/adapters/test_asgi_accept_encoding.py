"""What the middleware's application is told: ``identity`` encoding, as the proxy's upstream, and
the JSON-RPC method the middleware read from the body.

An answer must come uncompressed to be inspected. A request without ``Accept-Encoding``
leaves a server free to choose any coding (RFC 9110, 12.5.3), so the header is not
dropped but replaced: the application sees exactly one ``Accept-Encoding: identity``,
whatever the client sent, the same header the proxy's forwarder sends its upstream
(tests/proxy/test_proxy_forward.py).

The proxy's forwarder decides whether a POST opens a long-lived stream by the body's
method; behind the middleware it takes the method the middleware read
(``scope["extensions"][BODY_METHOD]``) instead of reading the body again. The key is set
only where the body was read as one strict JSON-RPC message, and a server's own extensions
are kept beside it.

The application is a raw ASGI app recording the scope it gets; the codec, keys and replay
store are real.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from statecodec import KeyRing, StateCodec
from statecodec.adapters.asgi import ACCEPT_IDENTITY, BODY_METHOD, RequestStateMiddleware
from statecodec.replay import MemoryReplayStore

LIST = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()


async def _scope_seen(
    method: str, headers: list[tuple[bytes, bytes]], body: bytes, path: str = "/mcp", **extra: Any
) -> dict[str, Any]:
    """The scope the application behind the middleware gets for this request."""
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"jsonrpc": "2.0", "id": 1, "result": {}}'})

    codec = StateCodec(KeyRing.generate(), replay=MemoryReplayStore())
    middleware = RequestStateMiddleware(app, codec, audience="deploy", passthrough_paths=["/health"])
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "headers": headers}
    scope.update(extra)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    assert sent[0]["status"] == 200
    (scope_seen,) = seen
    return scope_seen


@pytest.mark.parametrize(
    ("method", "headers", "body"),
    [
        ("POST", [(b"Accept-Encoding", b"gzip, br"), (b"content-length", b"%d" % len(LIST))], LIST),
        ("POST", [(b"content-length", b"%d" % len(LIST))], LIST),
        (
            "POST",
            [(b"accept-encoding", b"br"), (b"accept-encoding", b"gzip"), (b"transfer-encoding", b"chunked")],
            LIST,
        ),
        ("GET", [(b"accept", b"text/event-stream")], b""),
        ("GET", [(b"accept-encoding", b"identity"), (b"accept-encoding", b"*")], b""),
    ],
    ids=["replaced", "added", "repeated_with_a_new_length", "added_to_a_get", "repeated_identity"],
)
async def test_the_application_is_asked_for_identity_whatever_the_client_sent(
    method: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    seen = (await _scope_seen(method, [(b"host", b"testserver"), *headers], body))["headers"]
    encodings = [(name, value) for name, value in seen if name.lower() == b"accept-encoding"]
    assert encodings == [ACCEPT_IDENTITY] == [(b"accept-encoding", b"identity")]
    lengths = [value for name, value in seen if name.lower() in (b"content-length", b"transfer-encoding")]
    assert lengths == ([b"%d" % len(body)] if body else [])  # the framing is the middleware's too
    assert (b"host", b"testserver") in seen  # the rest as the client sent it


_ABSENT = "absent"
LISTEN_METHOD = "subscriptions/listen"


def _body(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


@pytest.mark.parametrize(
    ("method", "path", "body", "read"),
    [
        ("POST", "/mcp", _body({"id": 1, "method": LISTEN_METHOD, "params": {}}), LISTEN_METHOD),
        ("POST", "/mcp", b'{"jsonrpc":"2.0","id":1,"method":"subscriptions\\/listen"}', LISTEN_METHOD),
        ("POST", "/mcp", LIST, "tools/list"),
        ("POST", "/mcp", _body({"method": "notifications/initialized"}), "notifications/initialized"),
        ("POST", "/mcp", _body({"id": 1, "result": {}}), None),  # a client's answer names no method
        ("POST", "/mcp", b"", _ABSENT),  # nothing read
        ("GET", "/mcp", b"", _ABSENT),
        ("POST", "/health", _body({"id": 1, "method": LISTEN_METHOD}), _ABSENT),  # not read as MCP
    ],
    ids=["listen", "an_escaped_slash", "list", "notification", "answer", "empty", "get", "passthrough"],
)
async def test_the_application_is_told_the_method_read_from_the_body(
    method: str, path: str, body: bytes, read: str | None
) -> None:
    server_extensions: dict[str, Any] = {"http.response.trailers": {}}
    headers = [(b"host", b"testserver"), (b"content-length", b"%d" % len(body))]
    extensions = (await _scope_seen(method, headers, body, path, extensions=server_extensions))["extensions"]
    assert extensions.get(BODY_METHOD, _ABSENT) == read
    assert extensions["http.response.trailers"] == {}  # the server's own, kept
    assert server_extensions == {"http.response.trailers": {}}  # and its dict left as it was
