"""The forwarder (``UpstreamApp``) against a real HTTP upstream on loopback.

The upstream is a threaded ``http.server`` that records every request it receives (raw
path, headers, body) and answers what each test asks. The forwarder is called through
its ASGI interface, as uvicorn calls it; nothing on the network side is simulated.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgi_calls import bodies, exchange, http_scope
from loopback import Loopback, Quiet

from statecodec.proxy import Timeouts, UpstreamApp


@dataclass
class Seen:
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]


@dataclass
class EchoUpstream:
    """Records requests; answers with ``reply`` (status, headers, body chunks)."""

    seen: list[Seen] = field(default_factory=list)
    reply: tuple[int, list[tuple[str, str]], list[bytes]] = (
        200,
        [("Content-Type", "application/json")],
        [b"{}"],
    )
    stream_open: threading.Event = field(default_factory=threading.Event)
    stream_stopped: threading.Event = field(default_factory=threading.Event)
    url: str = ""


@pytest.fixture
def upstream() -> Iterator[EchoUpstream]:
    state = EchoUpstream()

    class Handler(Quiet):
        protocol_version = "HTTP/1.1"

        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                while (size := int(self.rfile.readline().strip(), 16)) > 0:
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
            else:
                body = self.rfile.read(length)
            state.seen.append(Seen(self.path, list(self.headers.items()), body))
            status, headers, chunks = state.reply
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            if self.path.startswith("/stream"):
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                state.stream_open.set()
                try:
                    for _ in range(2000):  # bounded: about 20 s of events at most
                        self.wfile.write(b"e\r\n: keep-alive\n\n\r\n")
                        self.wfile.flush()
                        if state.stream_stopped.wait(0.01):
                            return
                except OSError:  # the proxy dropped the connection: what the test waits for
                    state.stream_stopped.set()
                return
            self.send_header("Content-Length", str(sum(len(c) for c in chunks)))
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()

        do_GET = do_POST = _handle

    with Loopback(Handler) as server:
        state.url = f"{server.base}/mcp"
        try:
            yield state
        finally:
            state.stream_stopped.set()


def scope(
    path: bytes = b"/mcp", headers: list[tuple[bytes, bytes]] | None = None, **extra: Any
) -> dict[str, Any]:
    return http_scope(path, headers=headers, client=("10.0.0.7", 5555), **extra)


async def call(app: UpstreamApp, scope: dict[str, Any], chunks: list[bytes]) -> tuple[dict[str, Any], bytes]:
    """One request through the forwarder's ASGI interface: the response start and the body."""
    sent = await exchange(app, scope, chunks)
    assert sent[-1] == {"type": "http.response.body", "body": sent[-1]["body"], "more_body": False}
    return sent[0], b"".join(m.get("body", b"") for m in bodies(sent))


async def test_a_cookie_set_for_one_client_never_reaches_the_upstream_with_another(
    upstream: EchoUpstream,
) -> None:
    app = UpstreamApp(upstream.url)
    try:
        upstream.reply = (200, [("Set-Cookie", "session=alice-secret; Path=/")], [b"{}"])
        start, _ = await call(app, scope(headers=[(b"cookie", b"who=alice")]), [b"{}"])
        assert (b"Set-Cookie", b"session=alice-secret; Path=/") in start["headers"]  # relayed to alice
        upstream.reply = (200, [], [b"{}"])
        await call(app, scope(), [b"{}"])  # bob, without cookies
    finally:
        await app.aclose()
    assert upstream.seen[0].header("cookie") == ["who=alice"]
    assert upstream.seen[1].header("cookie") == []


async def test_headers_as_a_careful_reverse_proxy_sends_them(upstream: EchoUpstream) -> None:
    app = UpstreamApp(upstream.url)
    client_headers = [
        (b"host", b"proxy.example"),
        (b"Connection", b"keep-alive, X-Hop"),
        (b"x-hop", b"dropped"),
        (b"keep-alive", b"timeout=5"),
        (b"te", b"trailers"),
        (b"accept-encoding", b"gzip, br"),
        (b"expect", b"100-continue"),
        (b"x-forwarded-for", b"192.0.2.1"),
        (b"x-forwarded-host", b"spoofed"),
        (b"authorization", b"Bearer abc"),
        (b"mcp-session-id", b"s-1"),
        (b"content-length", b"7"),
    ]
    try:
        await call(app, scope(b"/mcp/a%20b", client_headers, query_string=b"x=1&y=%2F"), [b'{"a":', b"1}"])
    finally:
        await app.aclose()
    seen = upstream.seen[0]
    assert seen.path == "/mcp/a%20b?x=1&y=%2F"  # as the client sent it
    assert seen.body == b'{"a":1}'
    names = {name.lower() for name, _ in seen.headers}
    assert not names & {
        "x-hop",
        "keep-alive",
        "te",
        "expect",
        "user-agent",
        "accept",
        "content-type",
        "cookie",
    }
    assert seen.header("host") == ["proxy.example"]  # the client's: the upstream's own checks judge it
    assert seen.header("accept-encoding") == ["identity"]
    assert seen.header("x-forwarded-for") == ["192.0.2.1, 10.0.0.7"]
    assert seen.header("x-forwarded-host") == ["proxy.example"]
    assert seen.header("x-forwarded-proto") == ["http"]
    assert seen.header("authorization") == ["Bearer abc"]
    assert seen.header("mcp-session-id") == ["s-1"]
    assert seen.header("content-length") == ["7"]  # a streamed body keeps the client's length


async def test_a_request_without_host_gets_the_upstreams_authority(upstream: EchoUpstream) -> None:
    app = UpstreamApp(upstream.url)
    try:
        await call(app, scope(headers=[]), [b"{}"])  # HTTP/1.0 sends no Host; HTTP/1.1 needs one
    finally:
        await app.aclose()
    assert upstream.seen[0].header("host") == [upstream.url.split("/")[2]]


async def test_a_whole_body_is_sent_with_its_true_length(upstream: EchoUpstream) -> None:
    app = UpstreamApp(upstream.url)
    try:
        await call(app, scope(headers=[(b"content-length", b"999")]), [b'{"a":1}'])
    finally:
        await app.aclose()
    assert upstream.seen[0].body == b'{"a":1}'
    assert upstream.seen[0].header("content-length") == ["7"]


async def test_a_chunked_answer_is_relayed_whole(upstream: EchoUpstream) -> None:
    app = UpstreamApp(upstream.url)
    upstream.reply = (201, [("Content-Type", "application/json"), ("X-Up", "1")], [b'{"a":', b"2", b"}"])
    try:
        start, body = await call(app, scope(), [b"{}"])
    finally:
        await app.aclose()
    assert start["status"] == 201
    assert (b"X-Up", b"1") in start["headers"]
    assert body == b'{"a":2}'


async def test_a_stream_stops_being_read_when_the_client_goes_away(upstream: EchoUpstream) -> None:
    app = UpstreamApp(upstream.url, timeouts=Timeouts(read=10))
    upstream.reply = (200, [("Content-Type", "text/event-stream")], [])
    disconnect = asyncio.Event()
    events = 0

    async def receive() -> dict[str, Any]:
        if not getattr(receive, "sent", False):
            receive.sent = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b"", "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal events
        if message["type"] == "http.response.body" and message.get("body"):
            events += 1
            if events == 3:
                disconnect.set()  # the client leaves after three events

    try:
        await asyncio.wait_for(app(scope(b"/stream", method="GET"), receive, send), timeout=30)
        assert await asyncio.to_thread(upstream.stream_stopped.wait, 20)  # the upstream saw the proxy go
    finally:
        await app.aclose()
    assert events >= 3


def test_the_upstream_url_is_checked() -> None:
    with pytest.raises(ValueError, match="credentials"):
        UpstreamApp("http://user:secret@127.0.0.1:9/mcp")
    with pytest.raises(ValueError, match="http:// or https://"):
        UpstreamApp("ftp://127.0.0.1/mcp")
