"""A corpus of misbehaving upstreams: each answer must end exactly where its HTTP/1.1 framing says.

The upstream is a raw asyncio server on 127.0.0.1 that writes, byte for byte, what a
case scripts in answer to the first request, then answers every later request with
``NEXT``. Each case asserts two things:

- what the client of that first request receives (status, headers, body, and whether
  the body was marked complete), through the forwarder's ASGI interface;
- that the next request, from an unrelated client, gets ``NEXT`` whole. The pool has one
  connection, so a connection put back mid-message (the bytes past an answer parsed as
  the start of the next one) would be handed to that client: this is the poisoned reuse
  of issue 25, attack 5.

Where bytes past the end of an answer were written, the connection that carried them
must have been closed by the proxy (the upstream sees its end) and the next request
must arrive on a new connection. The last test runs the headline case through the
``statecodec proxy`` process and real HTTP clients (on main, the victim got the 302).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_calls import http_scope
from fixtures_proxy import modern_request, proxy_command
from processes import await_line, spawn, stop

from statecodec import KeyRing
from statecodec.proxy import Timeouts, UpstreamApp

NEXT = b'{"next":true}'
NEXT_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n" + NEXT
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
CHUNKED_OK = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
SECOND = b"HTTP/1.1 302 Found\r\nLocation: http://attacker.example/\r\nContent-Length: 0\r\n\r\n"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@dataclass(frozen=True)
class Case:
    """What the upstream writes for the first request, and what its client must get.

    ``writes`` go out one after another, each after the first once the client has been
    sent body bytes (so they arrive in a read of their own, after the answer's head was
    handed over); ``status`` 502 means the clean error answer. ``reason``: the
    ``upstream_framing`` record expected in the log (``None``: no such record). ``closed``: the
    proxy must close the connection that carried the answer (bytes past its end, or an
    answer that cannot be followed); ``False`` means it must be reused.
    """

    writes: tuple[bytes, ...]
    status: int
    body: bytes = b""
    complete: bool = True
    closed: bool = True
    method: str = "POST"
    absent: tuple[bytes, ...] = ()
    reason: str | None = "bytes_after_answer"


def refused(answer: bytes, reason: str) -> Case:
    """An answer the proxy cannot follow: its client gets the clean 502, its connection is closed."""
    return Case((answer,), 502, reason=reason)


CASES: dict[str, Case] = {
    # Bytes past the end of a complete answer (attack 5): the answer is relayed as its
    # framing delimits it, the rest is never parsed as an answer, the connection is closed.
    "content-length-then-a-second-response": Case((OK + SECOND,), 200, b"{}", absent=(b"location",)),
    "content-length-then-the-start-of-a-response": Case(
        (OK + b"HTTP/1.1 302 Found\r\nLocation: http://attacker.example/\r\n",),
        200,
        b"{}",
        absent=(b"location",),
    ),
    "content-length-then-crlf": Case((OK + b"\r\n",), 200, b"{}"),
    "content-length-then-a-lone-lf": Case((OK + b"\n",), 200, b"{}"),
    "content-length-then-garbage": Case((OK + b"XYZ",), 200, b"{}"),
    "chunked-then-a-second-response": Case((CHUNKED_OK + SECOND,), 200, b"{}", absent=(b"location",)),
    "chunked-then-crlf": Case((CHUNKED_OK + b"\r\n",), 200, b"{}"),
    "a-second-response-in-a-later-write": Case((OK, SECOND), 200, b"{}", absent=(b"location",)),
    "connection-close-then-more-bytes": Case(
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}" + SECOND,), 200, b"{}"
    ),
    # HEAD, 204 and 304 have no body whatever their headers say.
    "head-then-the-body-its-length-announces": Case(
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",), 200, b"", method="HEAD"
    ),
    "head-then-a-chunked-body": Case(
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",),
        200,
        b"",
        method="HEAD",
    ),
    "head-then-crlf": Case((b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n\r\n",), 200, b"", method="HEAD"),
    "204-then-a-body": Case((b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n{}",), 204, b""),
    "304-with-a-length-and-no-body": Case(
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",), 304, b"", closed=False, reason=None
    ),
    # Interim answers: skipped, their fields never become the final answer's.
    "103-without-a-reason-phrase": Case(
        (b"HTTP/1.1 103\r\nLink: </x.css>; rel=preload\r\n\r\nHTTP/1.1 200\r\nContent-Length: 2\r\n\r\n{}",),
        200,
        b"{}",
        closed=False,
        reason=None,
        absent=(b"link",),
    ),
    "100-with-a-body": refused(b"HTTP/1.1 100 Continue\r\nContent-Length: 2\r\n\r\n{}" + OK, "invalid_http"),
    "101-switching-protocols": refused(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        "switched_protocols",
    ),
    # Length: repeated, conflicting or malformed Content-Length, or one with Transfer-Encoding.
    "content-length-repeated-equal": refused(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", "invalid_http"
    ),
    "content-length-conflicting": refused(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", "invalid_http"
    ),
    "content-length-list": refused(b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\n{}", "invalid_http"),
    "content-length-signed": refused(b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}", "invalid_http"),
    "transfer-encoding-and-content-length": refused(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "invalid_http",
    ),
    "content-length-and-transfer-encoding": refused(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "invalid_http",
    ),
    "transfer-encoding-not-chunked": refused(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n{}", "transfer_coding"
    ),
    "transfer-encoding-chunked-then-gzip": refused(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n{}", "transfer_coding"
    ),
    "transfer-encoding-chunked-twice": refused(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "transfer_coding",
    ),
    # Chunks: invalid sizes, sizes past 64 bits, data without its CRLF.
    "chunk-size-not-hex": refused(CHUNKED_HEAD + b"zz\r\n{}\r\n0\r\n\r\n", "invalid_http"),
    "chunk-size-negative": refused(CHUNKED_HEAD + b"-2\r\n{}\r\n0\r\n\r\n", "invalid_http"),
    "chunk-size-overflow": refused(CHUNKED_HEAD + b"1" + b"0" * 17 + b"\r\n{}\r\n0\r\n\r\n", "invalid_http"),
    "chunk-size-with-a-space": refused(CHUNKED_HEAD + b"2 \r\n{}\r\n0\r\n\r\n", "invalid_http"),
    "chunk-data-longer-than-its-size": refused(CHUNKED_HEAD + b"2\r\n{}XX\r\n0\r\n\r\n", "invalid_http"),
    "a-stream-whose-later-chunk-is-invalid": Case(
        (CHUNKED_HEAD + b"7\r\ndata: 1\r\n", b"zz\r\n"),
        200,
        b"data: 1",
        complete=False,
        reason="invalid_http",
    ),
    # Trailers: valid framing, never turned into response headers.
    "chunked-trailers-with-set-cookie": Case(
        (CHUNKED_HEAD + b"2\r\n{}\r\n0\r\nSet-Cookie: sid=attacker\r\nX-Trailer: 1\r\n\r\n",),
        200,
        b"{}",
        closed=False,
        reason=None,
        absent=(b"set-cookie", b"x-trailer"),
    ),
    "chunked-trailers-in-a-later-write": Case(
        (CHUNKED_HEAD + b"2\r\n{}\r\n0\r\n", b"Set-Cookie: sid=attacker\r\n\r\n"),
        200,
        b"{}",
        closed=False,
        reason=None,
        absent=(b"set-cookie",),
    ),
    # Heads that are not HTTP/1.1.
    "an-http-2-status-line": refused(b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", "http_version"),
    "obs-fold": refused(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\n{}", "invalid_http"),
    "space-before-the-colon": refused(b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\n{}", "invalid_http"),
    "bare-lf-line-ends": refused(b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}", "invalid_http"),
    "a-head-that-never-ends": refused(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 200_000, "head_too_large"),
    "interim-answers-without-end": refused(
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" * 5000, "head_too_large"
    ),
}


@dataclass
class Upstream:
    """The scripted server's record: what it received, on how many connections, which ended."""

    case: Case
    url: str = ""
    connections: int = 0
    requests: list[int] = field(default_factory=list)  # the connection number of each request
    ended: dict[int, asyncio.Event] = field(default_factory=dict)  # set when the proxy closed it
    relayed: asyncio.Event = field(default_factory=asyncio.Event)  # the client has had body bytes


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """Read one request (these carry a length or no body): its head, None at the end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))
    return head


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[[Case], Any]]:
    servers: list[asyncio.Server] = []

    async def make(case: Case) -> Upstream:
        script = Upstream(case)

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await _read_request(reader)
            if head is not None and head.startswith(b"OPTIONS *"):  # a proxy asking if it answers
                writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                writer.close()
                return
            script.connections += 1
            number = script.connections
            script.ended[number] = ended = asyncio.Event()
            try:
                while head is not None:
                    first = not script.requests
                    script.requests.append(number)
                    for n, data in enumerate(case.writes if first else (NEXT_ANSWER,)):
                        if n:  # a later write: once the client has had the first bytes of body
                            await asyncio.wait_for(script.relayed.wait(), 5)
                        writer.write(data)
                        await writer.drain()
                    head = await _read_request(reader)
                ended.set()  # the proxy closed the connection (it read to its end)
            except ConnectionError:
                ended.set()
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        servers.append(server)
        script.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp"
        return script

    yield make
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("name", list(CASES))
async def test_an_upstream_answer_ends_where_its_framing_says(
    upstream: Callable[[Case], Any], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    case = CASES[name]
    script: Upstream = await upstream(case)
    app = UpstreamApp(script.url, max_connections=1, timeouts=Timeouts(read=3.0))
    caplog.set_level(logging.WARNING, "statecodec.proxy")
    try:
        status, headers, messages = await _exchange(app, case.method, script.relayed)
        if case.closed:  # the connection that carried it is ended by the proxy, not left in the pool
            await asyncio.wait_for(script.ended[1].wait(), 5)
        next_status, _, next_messages = await _exchange(app, "POST", asyncio.Event())
    finally:
        await app.aclose()
    body, complete = relayed(messages)
    framing = [
        getattr(r, "reason", None) for r in caplog.records if getattr(r, "event", None) == "upstream_framing"
    ]
    assert framing[:1] == ([case.reason] if case.reason else [])
    if case.status == 502:
        assert status == 502
        assert b"Upstream unavailable" in body
        assert any(getattr(r, "event", None) == "upstream_error" for r in caplog.records)
    else:
        assert (status, body, complete) == (case.status, case.body, case.complete)
    for name_ in case.absent:
        assert name_ not in {n.lower() for n, _ in headers}
    assert (next_status, relayed(next_messages)) == (200, (NEXT, True))  # no poisoned reuse
    assert script.requests == [1, 2] if case.closed else [1, 1]


def relayed(messages: list[dict[str, Any]]) -> tuple[bytes, bool]:
    """The body relayed and whether it was marked complete."""
    body = b"".join(m["body"] for m in messages)
    return body, bool(messages) and messages[-1]["more_body"] is False


async def _exchange(
    app: UpstreamApp, method: str, relayed: asyncio.Event
) -> tuple[int, list[tuple[bytes, bytes]], list[dict[str, Any]]]:
    """One request through the ASGI interface: status, response headers, body messages.

    ``relayed`` is set once a body message with bytes in it has been sent to the client.
    """
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b"" if method == "HEAD" else b"{}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message["body"]:
            relayed.set()

    await asyncio.wait_for(app(http_scope(method=method), receive, send), 30)
    start = sent[0]
    return (
        start["status"],
        list(start.get("headers", [])),
        [m for m in sent if m["type"] == "http.response.body"],
    )


async def test_through_the_proxy_process_a_second_response_reaches_no_client(
    upstream: Callable[[Case], Any], tmp_path: Path
) -> None:
    """Attack 5 on the wire: ``statecodec proxy`` (one upstream connection) in front of an upstream
    that answers 200 and, in the same write, a 302 with a ``Location``."""
    answer = b'{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}'
    first = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        len(answer),
        answer,
    )
    script: Upstream = await upstream(Case((first + SECOND,), 200))
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json())
    keys.chmod(0o600)
    command = proxy_command(
        script.url,
        keys=keys,
        replay="memory:",
        mode="sign",
        jwks=None,
        extra=["--max-connections", "1", "--log-format", "json"],
    )
    log_path = tmp_path / "proxy.log"
    proc = spawn(command, log_path)
    try:
        base = await asyncio.to_thread(await_line, proc, "listening on ", log_path)
        body, headers = modern_request("tools/list", {})
        async with httpx.AsyncClient(timeout=30) as victim:
            hit = await victim.post(base + "/mcp", content=body, headers=headers)
        await asyncio.wait_for(script.ended[1].wait(), 10)  # the proxy closed that connection
        async with httpx.AsyncClient(timeout=30) as bystander:  # an unrelated client
            after = await bystander.post(base + "/mcp", content=body, headers=headers)
    finally:
        stop(proc)
    assert (hit.status_code, hit.content, hit.headers.get("location")) == (200, answer, None)
    assert (after.status_code, after.content) == (200, NEXT)
    assert script.requests == [1, 2]
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert [r.get("reason") for r in records if r.get("event") == "upstream_framing"] == [
        "bytes_after_answer"
    ]
