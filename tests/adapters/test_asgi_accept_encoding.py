"""What the middleware's application is told about encodings: ``identity``, as the proxy's upstream.

An answer must come uncompressed to be inspected. A request without ``Accept-Encoding``
leaves a server free to choose any coding (RFC 9110, 12.5.3), so the header is not
dropped but replaced: the application sees exactly one ``Accept-Encoding: identity``,
whatever the client sent, the same header the proxy's forwarder sends its upstream
(tests/proxy/test_proxy_forward.py). The application is a raw ASGI app recording the
headers it gets; the codec, keys and replay store are real.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from statecodec import KeyRing, StateCodec
from statecodec.adapters.asgi import ACCEPT_IDENTITY, RequestStateMiddleware
from statecodec.replay import MemoryReplayStore

LIST = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()


async def _headers_seen(
    method: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> list[tuple[bytes, bytes]]:
    """The headers the application behind the middleware gets for this request."""
    seen: list[list[tuple[bytes, bytes]]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(list(scope["headers"]))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"jsonrpc": "2.0", "id": 1, "result": {}}'})

    codec = StateCodec(KeyRing.generate(), replay=MemoryReplayStore())
    middleware = RequestStateMiddleware(app, codec, audience="deploy")
    scope = {"type": "http", "method": method, "path": "/mcp", "raw_path": b"/mcp", "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    assert sent[0]["status"] == 200
    (headers_seen,) = seen
    return headers_seen


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
    seen = await _headers_seen(method, [(b"host", b"testserver"), *headers], body)
    encodings = [(name, value) for name, value in seen if name.lower() == b"accept-encoding"]
    assert encodings == [ACCEPT_IDENTITY] == [(b"accept-encoding", b"identity")]
    lengths = [value for name, value in seen if name.lower() in (b"content-length", b"transfer-encoding")]
    assert lengths == ([b"%d" % len(body)] if body else [])  # the framing is the middleware's too
    assert (b"host", b"testserver") in seen  # the rest as the client sent it
