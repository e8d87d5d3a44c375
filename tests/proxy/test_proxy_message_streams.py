"""Answers written as a stream of JSON messages go through the proxy message by message.

An MCP server may answer ``subscriptions/listen`` (SEP-2575), or any request, with a
chunked ``application/json`` body of newline-separated JSON-RPC messages (NDJSON) that
stays open. The proxy must hand each message on as soon as it is complete, judged on its
own: untouched when it cannot carry a state, sealed or replaced when it does.

The upstream is a raw socket server written here (no SDK writes these bodies on demand):
it writes the bytes a test names, then holds the stream open until the test releases it.
The proxy is a real ``statecodec proxy`` process; nothing is mocked.
"""

from __future__ import annotations

import json
import re
import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures_proxy import Proxy, modern_request, start_proxies
from processes import stop
from replicas import keys_file

from statecodec import KeyRing, StateCodec

pytestmark = pytest.mark.timeout(120)

PLAIN = "PLAINTEXT-state-of-the-upstream"
TOKEN = re.compile(r"sc1s\.[A-Za-z0-9_-]+")


def line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n"


ACK = line({"method": "notifications/subscriptions/acknowledged", "params": {"é": "ü"}})
CHANGED = line({"method": "notifications/tools/list_changed", "params": {}})
PROGRESS = line({"method": "notifications/progress", "params": {"progressToken": 1, "progress": 0.5}})
STRAY = line(
    {
        "method": "notifications/message",
        "params": {"level": "info", "data": {"resultType": "input_required", "requestState": PLAIN}},
    }
)
ASKING = line(
    {"id": 1, "result": {"resultType": "input_required", "inputRequests": {}, "requestState": PLAIN}}
)


@dataclass
class Held:
    """What the upstream writes first, and what it writes once the test releases it."""

    media: bytes
    first: bytes
    then: bytes
    released: threading.Event = field(default_factory=threading.Event)


@dataclass
class RawUpstream:
    url: str
    answers: list[Held]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@pytest.fixture
def raw_upstream() -> Iterator[RawUpstream]:
    answers: list[Held] = []

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            if self.rfile.readline().startswith(b"OPTIONS"):  # the proxy asking whether it answers
                self.wfile.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                return
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = header.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            self.rfile.read(length)
            held = answers.pop(0)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: %b\r\nTransfer-Encoding: chunked\r\n\r\n" % held.media
            self.wfile.write(head + _chunk(held.first))
            self.wfile.flush()
            held.released.wait(60)  # the stream stays open until the test has seen the first message
            self.wfile.write(_chunk(held.then) + b"0\r\n\r\n")
            self.wfile.flush()

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield RawUpstream(f"http://127.0.0.1:{server.server_address[1]}/mcp", answers)
    finally:
        for held in answers:
            held.released.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return keys_file(tmp_path)


@pytest.fixture
def proxy(tmp_path: Path, raw_upstream: RawUpstream, keys: Path) -> Iterator[Proxy]:
    (started,) = start_proxies(
        tmp_path, raw_upstream.url, keys=keys, replay="memory:", mode="sign", jwks=None, names=("S",)
    )
    try:
        yield started
    finally:
        stop(started.proc)


def exchange(proxy: Proxy, held: Held, method: str, params: dict[str, Any]) -> tuple[bytes, bytes]:
    """The bytes the client has when the first message is through (the upstream still holding
    the stream open), and all of them once the upstream, released, ends it."""
    body, headers = modern_request(method, params)
    del headers["mcp-method"]  # the body says what the request is
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", proxy.url, content=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        assert "content-length" not in response.headers
        received = b""
        chunks = response.iter_raw()
        while received.count(b"\n") < held.first.count(b"\n"):
            received += next(chunks)
        first = received
        held.released.set()
        received += b"".join(chunks)
    return first, received


def test_a_listen_answer_streamed_as_json_reaches_the_client_message_by_message(
    proxy: Proxy, raw_upstream: RawUpstream
) -> None:
    held = Held(b"application/json", ACK, CHANGED)
    raw_upstream.answers.append(held)
    first, everything = exchange(proxy, held, "subscriptions/listen", {})
    assert first == ACK  # before the stream ended, as the upstream wrote it
    assert everything == ACK + CHANGED


def test_each_message_of_a_streamed_tool_answer_is_judged_on_its_own(
    proxy: Proxy, raw_upstream: RawUpstream, keys: Path
) -> None:
    held = Held(b"application/x-ndjson", PROGRESS, STRAY + ASKING)
    raw_upstream.answers.append(held)
    first, everything = exchange(proxy, held, "tools/call", {"name": "deploy", "arguments": {}})
    assert first == PROGRESS  # relayed byte for byte before the rest exists
    assert PLAIN.encode() not in everything
    _, stray, asking = everything.splitlines()
    assert json.loads(stray) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32603, "message": "Internal error"},
    }
    (token,) = TOKEN.findall(asking.decode())
    codec = StateCodec(KeyRing.from_json(keys.read_text(encoding="utf-8")), mode="sign")
    assert codec.verify_unbound(token).payload == PLAIN.encode()
    assert "an input_required result at params.data" in proxy.wait_for_log("params.data")  # logged where


DONE = line({"id": 1, "result": {"resultType": "complete", "content": []}})


@pytest.mark.parametrize(
    ("media", "frame"),
    [(b"text/event-stream", lambda data: b"data: " + data + b"\n"), (b"application/json", lambda data: data)],
    ids=["sse", "json_messages"],
)
def test_a_state_after_an_answer_relayed_unread_is_refused(
    proxy: Proxy, raw_upstream: RawUpstream, media: bytes, frame: Any
) -> None:
    """The first answer cannot hold a state and goes out unparsed; the client takes it as the
    answer, so an input_required answer to the same request after it is refused, no token."""
    held = Held(media, frame(PROGRESS) + frame(DONE), frame(ASKING))
    raw_upstream.answers.append(held)
    first, everything = exchange(proxy, held, "tools/call", {"name": "deploy", "arguments": {}})
    assert first == held.first  # relayed as the upstream wrote it, before the rest exists
    assert PLAIN.encode() not in everything and not TOKEN.findall(everything.decode())
    refused = everything[len(first) :].removeprefix(b"data: ")
    assert json.loads(refused) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32603, "message": "Internal error"},
    }
    logged = proxy.wait_for_log("a second input_required result")
    assert "at result.resultType of an answer" in logged  # logged where
