"""The forwarder's own HTTP/1.1 client against an upstream that answers byte for byte what a test scripts.

The upstream is a real TCP server on loopback (asyncio): it reads each request as it
arrives (head, then a body by length or chunked) and writes the scripted bytes back, so
the edge cases of HTTP/1.1 framing that a general server never produces on demand
(interim answers, bodies delimited by the connection's end, a truncated body, garbage)
are real bytes on a real socket. tests/proxy/test_proxy_forward.py covers the common cases.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgi_calls import bodies, exchange, http_scope
from pki import issue_server_cert, make_ca

from statecodec.proxy import Timeouts, UpstreamApp


@dataclass
class Received:
    head: bytes
    body: bytes


@dataclass
class Scripted:
    """Answers request n with ``answers[n]`` (bytes, then closes if ``close_after``)."""

    answers: list[bytes]
    close_after: set[int] = field(default_factory=set)
    received: list[Received] = field(default_factory=list)
    connections: int = 0
    url: str = ""


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    fields = {
        line.split(":", 1)[0].strip().lower(): line.split(":", 1)[1].strip() for line in lines[1:] if line
    }
    if fields.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
    else:
        body = await reader.readexactly(int(fields.get("content-length", "0")))
    return Received(head, body)


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[..., Scripted]]:
    servers: list[asyncio.Server] = []

    async def make(
        answers: list[bytes], close_after: set[int] | None = None, tls: ssl.SSLContext | None = None
    ) -> Scripted:
        script = Scripted(answers, close_after or set())

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            script.connections += 1
            try:
                while (request := await _read_request(reader)) is not None:
                    index = len(script.received)
                    script.received.append(request)
                    writer.write(script.answers[index])
                    await writer.drain()
                    if index in script.close_after:
                        break
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
        servers.append(server)
        scheme = "https" if tls is not None else "http"
        script.url = f"{scheme}://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp"
        return script

    yield make  # type: ignore[misc]
    for server in servers:
        server.close()
        await server.wait_closed()


def scope(method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return http_scope(method=method, headers=headers)


async def call(
    app: UpstreamApp, scope: dict[str, Any], chunks: list[bytes] | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """One request through the ASGI interface: the status and every body message sent."""
    sent = await exchange(app, scope, chunks if chunks is not None else [b"{}"])
    return sent[0]["status"], bodies(sent)


def body_of(messages: list[dict[str, Any]]) -> bytes:
    return b"".join(m["body"] for m in messages)


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def test_one_connection_carries_request_after_request(scripted: Callable[..., Any]) -> None:
    upstream = await scripted([OK, OK, OK])
    app = UpstreamApp(upstream.url)
    try:
        for _ in range(3):
            assert await call(app, scope()) == (
                200,
                [{"type": "http.response.body", "body": b"{}", "more_body": False}],
            )
    finally:
        await app.aclose()
    assert upstream.connections == 1


async def test_an_answer_with_connection_close_is_not_followed_on_its_connection(
    scripted: Callable[..., Any],
) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    upstream = await scripted([closing, OK], close_after={0})
    app = UpstreamApp(upstream.url)
    try:
        assert (await call(app, scope()))[0] == 200
        assert (await call(app, scope()))[0] == 200
    finally:
        await app.aclose()
    assert upstream.connections == 2


async def test_a_head_answer_ends_at_its_headers_whatever_length_it_declares(
    scripted: Callable[..., Any],
) -> None:
    upstream = await scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", OK])
    app = UpstreamApp(upstream.url)
    try:
        status, messages = await call(app, scope("HEAD"), [b""])
        assert (status, body_of(messages), messages[-1]["more_body"]) == (200, b"", False)
        assert (await call(app, scope()))[0] == 200  # on a new connection: the HEAD one is not reused
    finally:
        await app.aclose()
    assert upstream.received[0].head.startswith(b"HEAD /mcp HTTP/1.1\r\n")
    assert b"content-length" not in upstream.received[0].head.lower()  # no body, no length
    assert upstream.connections == 2


async def test_interim_answers_are_skipped(scripted: Callable[..., Any]) -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    upstream = await scripted([early + OK])
    app = UpstreamApp(upstream.url)
    try:
        status, messages = await call(app, scope())
    finally:
        await app.aclose()
    assert (status, body_of(messages)) == (200, b"{}")


async def test_a_body_delimited_by_the_end_of_the_connection_is_relayed_whole(
    scripted: Callable[..., Any],
) -> None:
    upstream = await scripted(
        [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + b'{"a": 1}'], {0}
    )
    app = UpstreamApp(upstream.url)
    try:
        status, messages = await call(app, scope())
    finally:
        await app.aclose()
    assert (status, body_of(messages), messages[-1]["more_body"]) == (200, b'{"a": 1}', False)


async def test_a_truncated_body_is_left_unfinished(scripted: Callable[..., Any]) -> None:
    upstream = await scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345"], {0})
    app = UpstreamApp(upstream.url)
    try:
        status, messages = await call(app, scope())
    finally:
        await app.aclose()
    assert status == 200
    assert not any(m["more_body"] is False for m in messages)  # never a complete-looking answer


@pytest.mark.parametrize(
    "answer",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        b"",  # closes without a word
    ],
)
async def test_an_upstream_that_answers_no_valid_http_is_a_502(
    scripted: Callable[..., Any], answer: bytes
) -> None:
    upstream = await scripted([answer], {0})
    app = UpstreamApp(upstream.url)
    try:
        status, messages = await call(app, scope())
    finally:
        await app.aclose()
    assert status == 502
    assert b"Upstream unavailable" in body_of(messages)


async def test_a_dead_upstream_is_a_502_carrying_the_requests_id_and_logged_with_its_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as sock:  # bound, never listening: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        app = UpstreamApp(url)
        request = b'{"jsonrpc":"2.0","id":7,"method":"tools/list"}'
        try:
            with caplog.at_level(logging.WARNING, logger="statecodec.proxy"):
                status, messages = await call(app, scope(), [request])
        finally:
            await app.aclose()
    assert status == 502
    assert json.loads(body_of(messages)) == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32603, "message": "Upstream unavailable"},
    }
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "upstream_error"]
    assert record.upstream == url  # type: ignore[attr-defined]
    assert url in record.getMessage()


async def test_a_silent_upstream_is_a_504(scripted: Callable[..., Any]) -> None:
    upstream = await scripted([b""])  # reads the request, never answers, keeps the connection
    app = UpstreamApp(upstream.url, timeouts=Timeouts(read=0.2))
    try:
        status, messages = await call(app, scope())
    finally:
        await app.aclose()
    assert status == 504
    assert b"Upstream timed out" in body_of(messages)
    assert b'"id":null' in body_of(messages)  # the request "{}" has no id


async def test_a_streamed_body_without_a_length_goes_chunked(scripted: Callable[..., Any]) -> None:
    upstream = await scripted([OK])
    app = UpstreamApp(upstream.url)
    try:
        assert (await call(app, scope(), [b'{"a":', b"", b"1}"]))[0] == 200
    finally:
        await app.aclose()
    assert upstream.received[0].body == b'{"a":1}'
    assert b"\r\nTransfer-Encoding: chunked\r\n" in upstream.received[0].head


@pytest.mark.parametrize(
    "header",
    [(b"x-note", b"a\r\nX-Injected: 1"), (b"x-note", b"a\nb"), (b"x-note", b"a\x00b"), (b"x note", b"a")],
)
async def test_a_header_that_would_split_the_request_is_refused_before_sending(
    scripted: Callable[..., Any], header: tuple[bytes, bytes]
) -> None:
    upstream = await scripted([OK])
    app = UpstreamApp(upstream.url)
    try:
        status, _ = await call(app, scope(headers=[header]))
    finally:
        await app.aclose()
    assert status == 400
    assert upstream.received == []


async def test_an_https_upstream_is_verified_against_the_given_trust(
    scripted: Callable[..., Any], tmp_path: Any
) -> None:
    ca = make_ca()
    cert, key = issue_server_cert(ca, "127.0.0.1").write(tmp_path, "upstream")
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    upstream = await scripted([OK, OK], tls=served)
    trusting = ssl.create_default_context(cadata=ca.cert_pem)
    app = UpstreamApp(upstream.url, tls=trusting)
    try:
        assert await call(app, scope()) == (
            200,
            [{"type": "http.response.body", "body": b"{}", "more_body": False}],
        )
    finally:
        await app.aclose()
    stranger = UpstreamApp(upstream.url)  # the system's trust store knows nothing of this CA
    try:
        assert (await call(stranger, scope()))[0] == 502
    finally:
        await stranger.aclose()
    assert len(upstream.received) == 1  # nothing was sent over the untrusted connection
