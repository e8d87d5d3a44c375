"""RequestStateMiddleware in process: exact bytes, batches, SSE, strict parsing, limits.

The application behind the middleware is a small but real JSON-RPC-over-HTTP ASGI app
(:class:`App`) whose answers the tests choose byte by byte, because "passes through
byte for byte" and "rewrites exactly this" can only be checked against known bytes.
It records every request it receives. The codec, keys and replay store are real; the
end-to-end tests against the TypeScript and Python SDK servers are in test_proxy_e2e.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn

from statecodec import KeyRing, StateCodec, _format, boundary
from statecodec.adapters.asgi import RequestHeaders, RequestStateMiddleware
from statecodec.replay import MemoryReplayStore

WIRE_ERROR = {
    "code": -32602,
    "message": "Invalid or expired requestState",
    "data": {"reason": "invalid_request_state"},
}
SEAL_FAILED = {"code": -32603, "message": "Internal error"}
TOOL = "deploy"
URL = "http://testserver/mcp"

Responder = Callable[[dict[str, Any], "App"], Awaitable[None] | None]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class App:
    """A JSON-RPC endpoint: the next answer is ``(status, headers, chunks)``, or computed from the body."""

    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(
        default_factory=lambda: [(b"content-type", b"application/json")]
    )
    chunks: list[bytes] | None = None  # fixed answer; None: answer every request (see _answer)
    sse: bool = False
    seen: list[Seen] = field(default_factory=list)
    gate: asyncio.Event | None = None  # SSE: wait for it after the first event

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append(Seen(scope["method"], scope["path"], headers, body))
        chunks = self.chunks if self.chunks is not None else self._answer(body)
        status = self.status if chunks else 202
        await send(
            {"type": "http.response.start", "status": status, "headers": self.headers if chunks else []}
        )
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if i == 0 and self.gate is not None:
                await asyncio.wait_for(self.gate.wait(), 10)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _answer(self, body: bytes) -> list[bytes]:
        """tools/call: round 1 asks with a plaintext state; with a state, echo it."""
        document = json.loads(body)
        answers = [
            self._one(m) for m in (document if isinstance(document, list) else [document]) if "id" in m
        ]
        if not answers:
            return []
        if self.sse:
            return [b"event: message\ndata: " + json.dumps(a).encode() + b"\n\n" for a in answers]
        return [json.dumps(answers if isinstance(document, list) else answers[0]).encode()]

    @staticmethod
    def _one(message: dict[str, Any]) -> dict[str, Any]:
        params = message.get("params") or {}
        if message["method"] != "tools/call":
            return {"jsonrpc": "2.0", "id": message["id"], "result": {"tools": []}}
        state = params.get("requestState")
        if state is None:
            plan = json.dumps({"plan": params.get("arguments"), "n": message["id"]})
            result = {"resultType": "input_required", "inputRequests": {}, "requestState": plan}
        else:
            result = {"resultType": "complete", "content": [{"type": "text", "text": state}]}
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}

    def states(self) -> list[Any]:
        """Every requestState the application received."""
        found = []
        for seen in self.seen:
            try:
                document = json.loads(seen.body)
            except ValueError:
                continue
            for message in document if isinstance(document, list) else [document]:
                if isinstance(message, dict) and "requestState" in (message.get("params") or {}):
                    found.append(message["params"]["requestState"])
        return found


@pytest.fixture
def codec() -> StateCodec:
    return StateCodec(KeyRing.generate(), mode="encrypt", replay=MemoryReplayStore())


def client(middleware: RequestStateMiddleware) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware), timeout=30)


def call(request_id: Any, state: str | None = None, version: str = "1", **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": TOOL, "arguments": {"version": version}, **extra}
    if state is not None:
        params["requestState"] = state
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def protect(app: App, codec: StateCodec, **options: Any) -> RequestStateMiddleware:
    return RequestStateMiddleware(app, codec, audience="svc", **options)


async def round_one(http: httpx.AsyncClient, request_id: Any = 1, version: str = "1", **headers: str) -> str:
    response = await http.post(URL, json=call(request_id, version=version), headers=headers)
    assert response.status_code == 200, response.text
    state = response.json()["result"]["requestState"]
    assert state.startswith("sc1e.")
    return str(state)


# ------------------------------------------------------------------ pass-through
async def test_other_methods_and_bodies_pass_byte_for_byte(codec: StateCodec) -> None:
    raw_response = b'{ "jsonrpc" : "2.0", "id" : 7 , "result" : {"tools": [], "x": "\\u00e9"} }\n'
    app = App(chunks=[raw_response[:10], raw_response[10:]])
    requests = [
        b'{"method":"tools/list", "jsonrpc":"2.0","id":7, "params": {"cursor": "\\u00e9"}}',
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}',
        b'{"jsonrpc":"2.0","id":8,"result":{"action":"accept"}}',  # a client's response
    ]
    async with client(protect(app, codec)) as http:
        for raw in requests:
            response = await http.post(URL, content=raw, headers={"content-type": "application/json"})
            assert response.content == raw_response
            assert app.seen[-1].body == raw
            assert app.seen[-1].headers["content-length"] == str(len(raw))
        assert (await http.get(URL)).content == raw_response
        assert (await http.delete(URL)).content == raw_response
    assert [s.method for s in app.seen] == ["POST", "POST", "POST", "GET", "DELETE"]


async def test_mrtr_response_that_is_not_json_passes_untouched(codec: StateCodec) -> None:
    app = App(headers=[(b"content-type", b"text/plain")], chunks=[b"plain words"])
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=call(1))
    assert response.content == b"plain words"


async def test_passthrough_paths_are_not_inspected(codec: StateCodec) -> None:
    app = App(chunks=[b"ok"])
    async with client(protect(app, codec, passthrough_paths=["/oauth/token"])) as http:
        response = await http.post("http://testserver/oauth/token", content=b"grant_type=x&code=\xff")
    assert response.content == b"ok" and app.seen[-1].body == b"grant_type=x&code=\xff"


@pytest.mark.parametrize(
    ("path", "form", "notification"),
    [
        (b"/oauth/token", 202, 202),  # the passthrough path as configured: both forwarded
        (b"/oauth%2Ftoken", 400, 400),  # decodes to it, as a router may read it: refused
        (b"/oauth/tok%65n", 400, 400),
        (b"/mcp%2Fx", 400, 400),  # an encoded "/" or unreserved character has two readings
        (b"/files/a%20b", 400, 202),  # other escapes: judged as MCP, where a form is no JSON
    ],
)
async def test_passthrough_is_decided_on_the_path_as_sent(
    codec: StateCodec, path: bytes, form: int, notification: int
) -> None:
    app = App(chunks=[])
    async with client(protect(app, codec, passthrough_paths=["/oauth/token"])) as http:
        url = httpx.URL("http://testserver").copy_with(raw_path=path)
        answers = [
            await http.post(
                url, content=b"grant_type=x", headers={"content-type": "application/x-www-form-urlencoded"}
            ),
            await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}),
        ]
    assert [answer.status_code for answer in answers] == [form, notification]
    assert len(app.seen) == [form, notification].count(202)


async def test_a_compressed_answer_without_a_body_passes(codec: StateCodec) -> None:
    app = App(headers=[(b"content-type", b"application/json"), (b"content-encoding", b"gzip")], chunks=[b""])
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=call(1))
    assert response.status_code == 200 and response.content == b""


async def test_answers_nobody_can_read_as_json_stream_through(codec: StateCodec) -> None:
    chunks = [b"\x89PNG\r\n\x1a\n", b"\x00" * 70, b"{not the start}"]
    app = App(headers=[(b"content-type", b"application/json")], chunks=chunks)
    async with client(protect(app, codec)) as http:
        response = await http.get(URL)
    assert response.content == b"".join(chunks)


# ------------------------------------------------------------------ the round trip
async def test_round_trip_seals_out_and_unseals_in(codec: StateCodec) -> None:
    app = App()
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=call(1))
        state = response.json()["result"]["requestState"]
        # The application sent its answer with more to come: the message goes out when complete,
        # without a length (never the application's length for what was rewritten).
        assert "content-length" not in response.headers
        issued = json.dumps({"plan": {"version": "1"}, "n": 1})
        assert codec.verify_unbound(state).payload == issued.encode()

        done = await http.post(URL, json=call(2, state))
        assert done.json()["result"]["content"][0]["text"] == issued
        assert app.seen[-1].headers["content-length"] == str(len(app.seen[-1].body))
        assert app.seen[-1].headers["accept-encoding"] == "identity"  # the answer must stay readable

        calls = len(app.seen)
        again = await http.post(URL, json=call(3, state))
    assert again.json() == {"jsonrpc": "2.0", "id": 3, "error": WIRE_ERROR}
    assert len(app.seen) == calls  # the replay never reached the application
    assert app.states() == [issued]


@pytest.mark.parametrize("request_id", ["abc", 0, 2**53, None])
async def test_ids_of_any_json_type_are_matched(codec: StateCodec, request_id: Any) -> None:
    app = App()
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=call(request_id))
    assert response.json()["id"] == request_id
    assert response.json()["result"]["requestState"].startswith("sc1e.")


@pytest.mark.parametrize(
    "change",
    [
        {"version": "2"},  # other arguments
        {"name": "other"},  # other tool
    ],
)
async def test_token_is_bound_to_the_request(codec: StateCodec, change: dict[str, str]) -> None:
    app = App()
    async with client(protect(app, codec)) as http:
        state = await round_one(http)
        message = call(2, state)
        if "name" in change:
            message["params"]["name"] = change["name"]
        else:
            message["params"]["arguments"] = change
        response = await http.post(URL, json=message)
    assert response.json()["error"] == WIRE_ERROR
    assert app.states() == []


async def test_token_is_bound_to_the_principal(codec: StateCodec) -> None:
    async def principal(scope: Any, headers: Mapping[str, str]) -> str | None:
        return headers.get("x-user")  # a test gateway's header

    app = App()
    async with client(protect(app, codec, principal=principal)) as http:
        state = await round_one(http, **{"x-user": "alice"})
        bob = await http.post(URL, json=call(2, state), headers={"x-user": "bob"})
        nobody = await http.post(URL, json=call(3, state))
        alice = await http.post(URL, json=call(4, state), headers={"x-user": "alice"})
    assert bob.json()["error"] == WIRE_ERROR and nobody.json()["error"] == WIRE_ERROR
    assert "result" in alice.json()  # the failed attempts did not burn it


async def test_a_principal_that_cannot_be_read_binds_nothing(codec: StateCodec) -> None:
    def principal(scope: Any, headers: Mapping[str, str]) -> str | None:
        if "authorization" in headers:
            raise PermissionError("signature does not verify")
        return None

    app = App()
    token = codec.seal(
        b"state", boundary.binding_for("tools/call", call(1)["params"], principal=None, audience="svc")
    )
    async with client(protect(app, codec, principal=principal)) as http:
        bad = {"authorization": "Bearer forged"}
        refused = await http.post(URL, json=call(1, token), headers=bad)
        first_round = await http.post(URL, json=call(2), headers=bad)
    assert refused.json()["error"] == WIRE_ERROR  # never accepted as if anonymous
    # Round 1 ran, but its state is never sent, sealed for nobody or in plaintext.
    assert first_round.json() == {"jsonrpc": "2.0", "id": 2, "error": SEAL_FAILED}
    assert app.states() == []


# ------------------------------------------------------------------ one message per POST
@pytest.mark.parametrize(
    "batch",
    [
        [{"jsonrpc": "2.0", "id": "list", "method": "tools/list"}, call("c", "sc1e.forged")],
        [call("new")],
        [],
    ],
    ids=["mixed", "one_call", "empty"],
)
async def test_batches_are_refused(codec: StateCodec, batch: list[Any]) -> None:
    # MCP dropped batches in 2025-06-18 and MRTR exists only in 2026-07-28.
    app = App()
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=batch)
    assert response.status_code == 400
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "JSON-RPC batches are not accepted"},
    }
    assert app.seen == []


async def test_request_rejected_never_reaches_the_application(codec: StateCodec) -> None:
    app = App()
    async with client(protect(app, codec)) as http:
        forged = await http.post(URL, json=call(1, "sc1e.forged"))
        not_a_token = await http.post(URL, json=call(2, 42))
        alias = await http.post(URL, json=call(3, None, request_state="plan"))
    assert forged.json() == {"jsonrpc": "2.0", "id": 1, "error": WIRE_ERROR}
    assert not_a_token.json() == {"jsonrpc": "2.0", "id": 2, "error": WIRE_ERROR}
    assert alias.json() == {"jsonrpc": "2.0", "id": 3, "error": WIRE_ERROR}
    assert app.seen == []


async def test_lone_surrogates_are_forwarded_escaped_and_never_bound(codec: StateCodec) -> None:
    app = App()
    token = codec.seal(
        b"plan", boundary.binding_for("tools/call", call(1)["params"], principal=None, audience="svc")
    )
    listing = b'{"jsonrpc":"2.0","id":"l","method":"tools/list","params":{"cursor":"\\ud800"}}'
    odd_arguments = b'{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"deploy",'
    odd_arguments += b'"arguments":{"v":"\\udfff"},"requestState":"sc1e.x"}}'
    odd_meta = json.dumps(
        {**call("m", token), "params": {**call("m", token)["params"], "_meta": {"x": "\udfff"}}}
    )
    async with client(protect(app, codec)) as http:
        listed = await http.post(URL, content=listing)
        unbindable = await http.post(URL, content=odd_arguments)
        redeemed = await http.post(URL, content=odd_meta.encode())
    assert listed.status_code == 200 and app.seen[0].body == listing  # byte for byte
    assert unbindable.json()["error"] == WIRE_ERROR  # not canonical JSON: cannot be bound
    assert redeemed.json()["result"]["content"][0]["text"] == "plan"
    forwarded = json.loads(app.seen[-1].body)
    assert forwarded["params"]["_meta"] == {"x": "\udfff"} and forwarded["params"]["requestState"] == "plan"
    assert len(app.seen) == 2


async def test_mrtr_notification_with_a_state_is_refused(codec: StateCodec) -> None:
    app = App()
    notification = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": TOOL, "requestState": "x"}}
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=notification)
    assert response.status_code == 400 and response.json()["error"]["code"] == -32600
    assert app.seen == []


# ------------------------------------------------------------------ SSE
async def test_sse_events_are_sealed_one_by_one_other_bytes_kept(codec: StateCodec) -> None:
    state = json.dumps({"plan": "p"})
    progress = (
        b': keep-alive\r\nevent: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\r\n\r\n'
    )
    result = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required", "requestState": state}}
    )
    final = b"id: 42\r\nevent: message\r\ndata: " + result.encode() + b"\r\nretry: 5\r\n\r\n"
    stream = progress + final
    app = App(
        headers=[(b"content-type", b"text/event-stream"), (b"content-length", str(len(stream)).encode())]
    )
    app.chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]  # events split across chunks
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=call(1))
    assert "content-length" not in response.headers
    assert response.content.startswith(progress)  # untouched, CRLFs and comment included
    rest = response.content[len(progress) :].decode()
    # The rewritten event keeps its other lines in order (with LF endings, as it was re-encoded).
    assert rest.startswith("id: 42\nevent: message\ndata: ") and rest.endswith("\nretry: 5\n\n")
    sealed = json.loads(rest.split("data: ", 1)[1].split("\n", 1)[0])
    token = sealed["result"]["requestState"]
    assert codec.verify_unbound(token).payload == state.encode()
    assert state not in response.text


async def test_sse_streams_event_by_event(codec: StateCodec) -> None:
    """The first event reaches the client while the application still holds the rest.

    The application waits for ``gate`` after its first event; only the client sets it,
    once it has read that event. A middleware that buffered the stream would deadlock
    (and fail on the application's 10 s wait) instead.
    """
    gate = asyncio.Event()
    first = b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}\n\n'
    result = {"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required", "requestState": "s"}}
    second = b"data: " + json.dumps(result).encode() + b"\n\n"
    app = App(headers=[(b"content-type", b"text/event-stream")], chunks=[first, second], gate=gate)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(protect(app, codec), log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        received = b""
        async with httpx.AsyncClient(timeout=20) as http, http.stream("POST", url, json=call(1)) as response:
            chunks = response.aiter_raw()
            while b"\n\n" not in received:
                received += await asyncio.wait_for(chunks.__anext__(), 10)
            assert received == first and not gate.is_set()
            gate.set()
            async for chunk in chunks:
                received += chunk
        assert received.startswith(first) and b"sc1e." in received[len(first) :]
    finally:
        server.should_exit = True
        await serving
        sock.close()


async def test_stream_without_mrtr_request_never_carries_a_state(codec: StateCodec) -> None:
    """A resumed or GET stream has no request to bind to: its states are never sent."""
    result = {"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required", "requestState": "plain"}}
    app = App(
        headers=[(b"content-type", b"text/event-stream")],
        chunks=[b"data: " + json.dumps(result).encode() + b"\n\n"],
    )
    async with client(protect(app, codec)) as http:
        response = await http.get(URL, headers={"last-event-id": "5"})
    assert "plain" not in response.text
    assert json.loads(response.text.split("data: ", 1)[1]) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": SEAL_FAILED,
    }


async def test_input_required_for_an_unknown_id_is_never_sent(codec: StateCodec) -> None:
    result = {"jsonrpc": "2.0", "id": 99, "result": {"resultType": "input_required", "requestState": "plain"}}
    app = App(chunks=[json.dumps(result).encode()])
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=call(1))
    assert response.json() == {"jsonrpc": "2.0", "id": 99, "error": SEAL_FAILED}


async def test_oversized_sse_event_cuts_the_stream(codec: StateCodec) -> None:
    result = {
        "jsonrpc": "2.0",
        "id": 1,
        # "~" is outside the base64url alphabet: a sealed token can never contain it.
        "result": {"resultType": "input_required", "requestState": "~" * 5000},
    }
    app = App(
        headers=[(b"content-type", b"text/event-stream")],
        chunks=[b"data: " + json.dumps(result).encode() + b"\n\n"],
    )
    async with client(protect(app, codec, max_response_bytes=1000)) as http:
        response = await http.post(URL, json=call(1))
    assert "~~~" not in response.text


@pytest.mark.parametrize("case", ["compressed", "too_large"])
async def test_unreadable_json_answer_fails_closed(codec: StateCodec, case: str) -> None:
    result = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required", "requestState": "plain"}}
    )
    if case == "compressed":
        app = App(
            headers=[(b"content-type", b"application/json"), (b"content-encoding", b"gzip")],
            chunks=[gzip.compress(result.encode())],
        )
        options: dict[str, Any] = {}
    else:
        app = App(chunks=[result.encode()])
        options = {"max_response_bytes": 20}
    async with client(protect(app, codec, **options)) as http:
        response = await http.post(URL, json=call(1))
    assert response.status_code == 502
    assert response.json()["error"] == SEAL_FAILED


# ------------------------------------------------------------------ strict parsing and limits
CALL_PREFIX = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"deploy",'
REFUSED = {
    "duplicate_key": CALL_PREFIX + b'"requestState":"sc1e.x","requestState":"forged"}}',
    "case_variant": CALL_PREFIX + b'"RequestState":"forged"}}',
    "fold_variant": CALL_PREFIX + '"reque\u017ftState":"forged"}}'.encode(),  # LATIN SMALL LETTER LONG S
    "arguments_variant": CALL_PREFIX + b'"Arguments":{}}}',
    "envelope_variant": b'{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call","params":{}}',
    "id_variant": b'{"jsonrpc":"2.0","Id":1,"method":"tools/call","params":{"name":"deploy"}}',
    "invalid_utf8": b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"d\xff",'
    b'"requestState":"f"}}',
    "bom": b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
    "nan": b'{"jsonrpc":"2.0","id":NaN,"method":"tools/list"}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "not_json": b"jsonrpc=2.0&method=tools/call",
    "duplicate_ids": b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"},'
    b'{"jsonrpc":"2.0","id":1.0,"method":"tools/list"}]',
}


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_ambiguous_bodies_are_refused_before_the_application(codec: StateCodec, case: str) -> None:
    app = App()
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, content=REFUSED[case], headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] in (-32700, -32600)
    assert app.seen == []


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"mcp-method": "tools/call"}, 400),  # the body says tools/list
        ({"mcp-method": "tools/list", "mcp-name": "other"}, 200),  # Mcp-Name only concerns MRTR methods
        ({"content-encoding": "gzip"}, 415),
    ],
)
async def test_routing_and_encoding_headers(codec: StateCodec, headers: dict[str, str], status: int) -> None:
    app = App()
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"requestState":"x"}}'
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, content=body, headers={"content-type": "application/json", **headers})
    assert response.status_code == status
    assert len(app.seen) == (1 if status == 200 else 0)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("deploy", True), ("=?base64?ZGVwbG95?=", True), ("other", False), ("=?base64?!!?=", False)],
)
async def test_mcp_name_must_match_the_target(codec: StateCodec, name: str, ok: bool) -> None:
    app = App()
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=call(1), headers={"mcp-method": "tools/call", "mcp-name": name})
    assert (response.status_code == 200) is ok and len(app.seen) == int(ok)


async def test_declared_oversized_body_is_refused_unread(codec: StateCodec) -> None:
    app = App()
    middleware = protect(app, codec, max_body_bytes=100)
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"x" * 1000, "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [(b"content-length", b"1000")]}
    await middleware(scope, receive, send)
    assert reads == 0 and sent[0]["status"] == 413 and app.seen == []


async def test_streamed_oversized_body_is_refused(codec: StateCodec) -> None:
    app = App()

    async def body() -> Any:
        for _ in range(20):
            yield b"x" * 100

    async with client(protect(app, codec, max_body_bytes=1000)) as http:
        response = await http.post(URL, content=body())
    assert response.status_code == 413 and app.seen == []


def test_configuration_errors() -> None:
    codec = StateCodec(KeyRing.generate())
    with pytest.raises(TypeError):
        RequestStateMiddleware(App(), object(), audience="svc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        RequestStateMiddleware(App(), codec, audience="svc", max_body_bytes=0)
    for path in ("oauth/token", "/caf\u00e9", "/token?x=1"):
        with pytest.raises(ValueError, match="as clients send it"):
            RequestStateMiddleware(App(), codec, audience="svc", passthrough_paths=[path])


# ------------------------------------------------------------------ nothing fails after the consume
@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1E+309"])
async def test_numbers_beyond_float_range_are_refused_before_the_consume(
    codec: StateCodec, number: bytes
) -> None:
    app = App()
    async with client(protect(app, codec)) as http:
        state = await round_one(http)
        body = json.dumps(call(2, state, _meta={"n": "N"})).encode()
        refused = await http.post(URL, content=body.replace(b'"N"', number))
        honest = await http.post(URL, content=body)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == -32700
    assert honest.json()["result"]["content"][0]["text"].startswith('{"plan"')  # not burnt


async def test_a_body_nested_near_the_recursion_limit_never_fails_after_the_consume(
    codec: StateCodec,
) -> None:
    """Parsed at one stack depth, written back at a deeper one: never a 500, never a burnt token.

    Each depth gets a fresh token; a refusal must leave it redeemable, an acceptance must
    hand the application the body it was judged on.
    """
    app = App()
    outcomes: set[int] = set()
    async with client(protect(app, codec)) as http:
        # The C parser's limit: under 1,000 levels on 3.11, under 1,500 on 3.12, 3,000-10,000 on 3.13.
        for depth in [*range(500, 1000, 10), 1500, 20_000]:
            state = await round_one(http, request_id=depth)
            nested = b"[" * depth + b"1" + b"]" * depth
            body = json.dumps(call(depth, state, _meta={"n": "N"})).encode()
            response = await http.post(URL, content=body.replace(b'"N"', nested))
            outcomes.add(response.status_code)
            if response.status_code == 200:
                assert "result" in response.json(), depth
                assert json.dumps(app.states()[-1]).startswith('"{\\"plan\\"')
            else:
                assert response.status_code == 400, depth
                honest = await http.post(URL, json=call(depth, state))
                assert "result" in honest.json(), depth  # the refusal did not burn it
    assert outcomes == {200, 400}  # both sides of the C parser's limit were tried


async def test_the_application_gets_the_length_of_the_body_it_receives(codec: StateCodec) -> None:
    app = App()
    middleware = protect(app, codec)
    async with client(middleware) as http:
        state = await round_one(http)
    body = json.dumps(call(2, state)).encode()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "raw_path": b"/mcp", "headers": headers}
    await middleware(scope, receive, send)
    assert len(app.seen[-1].body) < len(body)  # the plaintext is shorter than the token
    assert app.seen[-1].headers["content-length"] == str(len(app.seen[-1].body))
    assert sent[0]["status"] == 200


# ------------------------------------------------------------------ flows (issue 21)
async def test_an_early_retry_is_answered_with_its_state_and_a_round_logs_its_flow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1_750_000_000.0]
    codec = StateCodec(KeyRing.generate(), mode="encrypt", replay=MemoryReplayStore(), clock=lambda: now[0])
    app = App()  # round 1 answers requestState-only (empty inputRequests)
    caplog.set_level(logging.INFO, logger="statecodec")
    async with client(protect(app, codec, retry_after=30, max_hold=0)) as http:
        state = await round_one(http)
        assert _format.parse(state, 8192).not_before_ms == 30_000
        early = await http.post(URL, json=call(2, state))
        assert early.json() == {
            "jsonrpc": "2.0",
            "id": 2,
            "result": {"resultType": "input_required", "requestState": state},
        }
        assert len(app.seen) == 1  # never forwarded: the application did not run
        now[0] += 30
        done = await http.post(URL, json=call(3, state))
    assert done.json()["result"]["resultType"] == "complete" and len(app.seen) == 2
    access = [r for r in caplog.records if r.name == "statecodec.access"]
    flow_id = _format.parse(state, 8192).token_id.hex()[:8]  # logged like a token id
    assert [(getattr(r, "flow_id", None), getattr(r, "round", None)) for r in access] == [(flow_id, 1)]


def test_pacing_settings_are_checked(codec: StateCodec) -> None:
    with pytest.raises(ValueError, match="retry_after"):
        protect(App(), codec, retry_after=codec.ttl)
    with pytest.raises(ValueError, match="max_hold"):
        protect(App(), codec, max_hold=-1)


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_an_input_required_answer_that_asks_nothing_is_replaced(codec: StateCodec, sse: bool) -> None:
    # Neither inputRequests nor requestState (MCP 2026-07-28 requires one): no key spells a
    # state, yet the answer is read and replaced by -32603, as the TypeScript SDK does.
    answer = b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","content":[]}}'
    if sse:
        app = App(headers=[(b"content-type", b"text/event-stream")], chunks=[b"data: " + answer + b"\n\n"])
    else:
        app = App(chunks=[answer])
    async with client(protect(app, codec)) as http:
        response = await http.post(URL, json=call(1))
    body = response.text.removeprefix("data: ").strip() if sse else response.text
    assert json.loads(body) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32603, "message": "Internal error"},
    }


@pytest.mark.parametrize(
    "headers",
    [
        [(b"content-length", b"2"), (b"mcp-method", b" tools/call "), (b"mcp-method", b"x"), (b"a", b"1")],
        [(b"Content-Length", b"2"), (b"MCP-Method", b" tools/call "), (b"mcp-method", b"x"), (b"a", b"1")],
        [(b"content-length", b"2"), (b"mcp-method", b" tools/call "), (b"Mcp-Method", b"x"), (b"A", b"1")],
    ],
)
def test_request_headers_read_every_spelling_of_a_name_alike(headers: list[tuple[bytes, bytes]]) -> None:
    # Lower-case names (what servers hand) are taken as they are; any other spelling is
    # lower-cased name by name: the same index, routing and repeated header either way.
    sent = RequestHeaders.read(headers)
    assert sent.headers == headers
    assert sent.lowered == [(name.lower(), value) for name, value in headers]
    assert sent.index == {b"content-length": b"2", b"mcp-method": b" tools/call ", b"a": b"1"}
    assert sent.routing == {b"mcp-method": b"tools/call"}
    assert sent.repeated == b"mcp-method"
    assert sent.without(b"a") == headers[:3]
    assert RequestHeaders.read([]).index == {}
