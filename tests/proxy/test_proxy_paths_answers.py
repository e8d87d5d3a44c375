"""The proxy fails closed on every path: the holes of issue 13, each against a real upstream.

Tried as an attacker would, against ``statecodec proxy`` in front of an unprotected server:

1. passthrough paths matched on the decoded path but forwarded raw, and the TypeScript
   SDK's ``createMcpHandler`` serving MCP on every path (the passthrough path included);
2. answers the proxy could not read relayed untouched, the upstream's plaintext state
   included (deep nesting, BOMs, other JSON media types, SSE anywhere, answers to requests
   that were no MRTR request);
3. a number beyond the float range (``1e400``) burning the token and answering HTTP 500;
5. a proxy and a ``protect()`` server sharing keys, audience and store accepting one token
   twice, because their default replay namespaces differed.

Upstreams are real HTTP servers: the TypeScript SDK server under Node (``ts_fleet``), and
for the answer shapes no SDK produces on purpose, a server in this process that answers
exactly the bytes a test names (``crafted``). The proxies are ``statecodec proxy``
processes. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from fixtures_proxy import (
    ANSWERS,
    AUDIENCE,
    TOOL,
    Proxy,
    Upstream,
    messages,
    modern_request,
    node_or_skip,
    running_upstream,
    start_proxies,
)
from mcp.client import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from processes import stop
from replicas import keys_file

from statecodec import KeyRing, StateCodec
from statecodec.adapters.mcp import protect
from statecodec.replay import store_from_url

TOKEN = re.compile(rb"sc1e\.[A-Za-z0-9_-]+")
WIRE_ERROR = {
    "code": -32602,
    "message": "Invalid or expired requestState",
    "data": {"reason": "invalid_request_state"},
}


@dataclass
class Fleet:
    """One upstream behind one ``statecodec proxy`` (ENCRYPT, no principal)."""

    keys: Path
    replay: str
    proxy: Proxy
    upstream: Upstream | None = None

    def codec(self) -> StateCodec:
        return StateCodec(KeyRing.from_json(self.keys.read_text(encoding="utf-8")), mode="encrypt")

    def opened(self, token: bytes | str) -> bytes:
        return self.codec().verify_unbound(token.decode() if isinstance(token, bytes) else token).payload


@pytest.fixture(scope="module")
def ts_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The TypeScript SDK server, unprotected, behind a proxy with a passthrough path."""
    node_or_skip()
    tmp = tmp_path_factory.mktemp("ts-fleet")
    keys, replay = keys_file(tmp), f"sqlite:{tmp / 'replay.sqlite3'}"
    with running_upstream("typescript", tmp) as upstream:
        (proxy,) = start_proxies(
            tmp, upstream.url, keys=keys, replay=replay, mode="encrypt", jwks=None, names=("P",),
            extra=["--passthrough-path", "/oauth/token"],
        )  # fmt: skip
        try:
            yield Fleet(keys, replay, proxy, upstream)
        finally:
            proxy.stop()


async def post(url: str, body: bytes, headers: dict[str, str], path: bytes | None = None) -> httpx.Response:
    target = httpx.URL(url) if path is None else httpx.URL(url).copy_with(raw_path=path)
    async with httpx.AsyncClient(timeout=60) as http:
        return await http.post(target, content=body, headers=headers)


async def round_one(fleet: Fleet) -> str:
    body, headers = modern_request("tools/call", {"name": TOOL, "arguments": {"version": "1.2.3"}})
    response = await post(fleet.proxy.url, body, headers)
    token = messages(response)[0]["result"]["requestState"]
    assert token.startswith("sc1e.")
    return str(token)


def round_two(token: str) -> tuple[bytes, dict[str, str]]:
    params = {
        "name": TOOL,
        "arguments": {"version": "1.2.3"},
        "inputResponses": ANSWERS,
        "requestState": token,
    }
    return modern_request("tools/call", params, request_id=2)


def forged_call(tag: str, key: str = "requestState") -> tuple[str, bytes, dict[str, str]]:
    plan = json.dumps(
        {"version": "6.6.6", "plan_id": f"forged-{tag}", "planned_on": "x", "steps": ["rm -rf /"]}
    )
    body, headers = modern_request("tools/call", {"name": TOOL, "arguments": {"version": "6.6.6"}, key: plan})
    return plan, body, headers


# ------------------------------------------------------------------ 1. passthrough paths
@pytest.mark.parametrize(
    "path",
    [b"/oauth%2Ftoken", b"/oauth/tok%65n", b"/%6Fauth/token", b"/mc%70", b"/mcp%2F", b"/oauth%2ftoken"],
)
async def test_a_path_with_another_reading_is_refused(ts_fleet: Fleet, path: bytes) -> None:
    # The upstream serves MCP on every path: a path the proxy reads as passthrough
    # (decoded) but forwards raw would carry a forged state straight to the tool.
    plan, body, headers = forged_call(path.decode())
    response = await post(ts_fleet.proxy.base, body, headers, path=path)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32600
    assert ts_fleet.upstream is not None and plan not in ts_fleet.upstream.received()


@pytest.mark.parametrize("key", ["requestState", "request_state", "RequestState"])
async def test_a_state_on_the_passthrough_path_is_refused(ts_fleet: Fleet, key: str) -> None:
    plan, body, headers = forged_call(f"passthrough-{key}", key)
    response = await post(ts_fleet.proxy.base + "/oauth/token", body, headers)
    assert response.status_code == 400
    assert response.json()["error"] == WIRE_ERROR
    assert ts_fleet.upstream is not None and plan not in ts_fleet.upstream.received()
    assert f"refused a JSON body carrying {key!r} on a passthrough path" in ts_fleet.proxy.log()


async def test_answers_on_the_passthrough_path_are_watched(ts_fleet: Fleet) -> None:
    # No state to judge, but the upstream answers the tools/call it found there with its
    # plaintext plan: no request of this exchange can bind it, so it never goes out.
    assert ts_fleet.upstream is not None
    before = len(ts_fleet.upstream.issued())
    body, headers = modern_request("tools/call", {"name": TOOL, "arguments": {"version": "1.2.3"}})
    response = await post(ts_fleet.proxy.base + "/oauth/token", body, headers)
    issued = ts_fleet.upstream.issued()[before:]
    assert len(issued) == 1 and json.loads(issued[0])["plan_id"].encode() not in response.content
    assert messages(response)[0]["error"] == {"code": -32603, "message": "Internal error"}


# ------------------------------------------------------------------ 2. answers: depth
@pytest.mark.parametrize("depth", [10, 960, 980, 1000, 1500, 3000])
async def test_deep_answers_are_sealed(ts_fleet: Fleet, depth: int) -> None:
    # Python's C parser gives up near 1,000 levels, JavaScript's JSON.parse does not.
    assert ts_fleet.upstream is not None
    body, headers = modern_request("tools/call", {"name": "nested_meta", "arguments": {"depth": depth}})
    response = await post(ts_fleet.proxy.url, body, headers)
    issued = [state for state in ts_fleet.upstream.issued() if json.loads(state).get("depth") == depth][-1]
    assert json.loads(issued)["secret"].encode() not in response.content
    assert response.content.count(b'"bottom"') == 1  # the answer itself came through
    (token,) = TOKEN.findall(response.content)
    assert ts_fleet.opened(token) == issued.encode()
    retry = {"name": "nested_meta", "arguments": {"depth": depth}, "requestState": token.decode()}
    done = await post(ts_fleet.proxy.url, *modern_request("tools/call", retry, request_id=2))
    assert messages(done)[0]["result"]["content"][0]["text"] == "done"
    assert issued in ts_fleet.upstream.received()


# ------------------------------------------------------------------ 3. numbers
@pytest.mark.parametrize("number", [b"1e400", b"-1E+999", b"12e99999"])
async def test_a_number_beyond_float_range_is_refused_before_the_consume(
    ts_fleet: Fleet, number: bytes
) -> None:
    token = await round_one(ts_fleet)
    body, headers = round_two(token)
    hostile = body.replace(b'"_meta": {', b'"_meta": {"example.test/n": ' + number + b", ", 1)
    assert hostile != body
    refused = await post(ts_fleet.proxy.url, hostile, headers)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == -32700
    honest = await post(ts_fleet.proxy.url, body, headers)  # the token was not burnt
    assert honest.status_code == 200
    assert messages(honest)[0]["result"]["structuredContent"]["deployed"] == "1.2.3"
    assert "Traceback" not in ts_fleet.proxy.log()


# ------------------------------------------------------------------ 5. one namespace
async def test_a_mixed_fleet_accepts_a_token_once(ts_fleet: Fleet) -> None:
    """A proxy and a protect() server sharing keys, audience and store: one acceptance per token."""
    server = MCPServer("deploy-python")
    redeemed: list[str] = []

    @server.tool()
    async def deploy_production(
        version: str, ctx: Context
    ) -> types.CallToolResult | types.InputRequiredResult:
        if ctx.request_state is None:
            return types.InputRequiredResult(request_state="python plan")
        redeemed.append(ctx.request_state)
        return types.CallToolResult(content=[types.TextContent(type="text", text="deployed")])

    store = store_from_url(ts_fleet.replay)
    codec = StateCodec(
        KeyRing.from_json(ts_fleet.keys.read_text(encoding="utf-8")), mode="encrypt", replay=store
    )
    protect(server, codec, audience=AUDIENCE)  # the codec's default namespace, as the proxy's

    async def at_protect(client: Client, token: str) -> bool:
        try:
            await client.session.call_tool(
                TOOL, {"version": "1.2.3"}, request_state=token, allow_input_required=True
            )
        except MCPError as exc:
            assert exc.code == -32602
            return False
        return True

    async def at_proxy(token: str) -> bool:
        answer = messages(await post(ts_fleet.proxy.url, *round_two(token)))[0]
        assert "result" in answer or answer["error"] == WIRE_ERROR
        return "result" in answer

    try:
        async with Client(server) as client:
            first, second, third = [await round_one(ts_fleet) for _ in range(3)]
            assert [await at_protect(client, first), await at_proxy(first)] == [True, False]
            assert [await at_proxy(second), await at_protect(client, second)] == [True, False]
            raced = await asyncio.gather(at_protect(client, third), at_proxy(third))
    finally:
        store.close()
    assert sorted(raced) == [False, True]  # concurrently too: exactly one acceptance
    assert len(redeemed) == 1 + int(raced[0])


# ------------------------------------------------------------------ 2. answers: every shape
SECRET = f"PLAINTEXT-{secrets.token_hex(8)}"
PLAIN = json.dumps({"plan": SECRET})
BOM = b"\xef\xbb\xbf"


def asking(state_key: str = "requestState", **extra: Any) -> dict[str, Any]:
    return {"resultType": "input_required", "inputRequests": {}, state_key: PLAIN, **extra}


def wire(request_id: Any = 1, result: dict[str, Any] | None = None, key: str = "result") -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, key: result or asking()}).encode()


def deep(request_id: Any = 1, depth: int = 3000) -> bytes:
    nested = "[" * depth + '"bottom"' + "]" * depth
    result = wire(request_id, asking(_meta={"nested": "NESTED"}))
    return result.replace(b'"NESTED"', nested.encode())


COMPLETE: dict[str, Any] = {"resultType": "complete", "content": []}


def stray(where: str, result: dict[str, Any]) -> bytes:
    """A message carrying ``result`` where no result may stand: an error's data, a notification's
    or a server request's params."""
    if where == "error":
        message: dict[str, Any] = {"id": 1, "error": {"code": -32000, "message": "no", "data": result}}
    elif where == "notification":
        message = {"method": "notifications/message", "params": {"level": "info", "data": result}}
    else:
        message = {"id": 5, "method": "elicitation/create", "params": {"mode": "form", "prior": result}}
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


def event(data: bytes, newline: bytes = b"\n") -> bytes:
    return b"event: message" + newline + b"data: " + data + newline + newline


def split_lines(data: bytes) -> bytes:
    head, _, tail = data.partition(b', "result"')
    return b"data: " + head + b",\ndata: " + b'"result"' + tail + b"\n\n"


@dataclass(frozen=True)
class Shape:
    """An answer the crafted upstream gives, and what must come out of the proxy.

    ``kind`` is the request the client sends (an MRTR ``call``, ``list``, a notification,
    a client ``response`` or a ``get`` stream); ``outcome`` is ``sealed`` (a token that
    opens to the upstream's plaintext), ``replaced`` (-32603, no token), ``hidden``
    (only: no plaintext) or ``untouched`` (relayed byte for byte).
    """

    kind: str
    outcome: str
    media: str | None
    build: Callable[[], bytes]
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()


SSE = "text/event-stream"
SHAPES: dict[str, Shape] = {
    "json": Shape("call", "sealed", "application/json", wire),
    "json_rpc_media": Shape("call", "sealed", "application/json-rpc", wire),
    "jsonrequest_media": Shape("call", "sealed", "application/jsonrequest", wire),
    "plus_json_media": Shape("call", "sealed", "application/vnd.example+json", wire),
    "json_media_case": Shape("call", "sealed", "Application/JSON; charset=UTF-8", wire),
    "text_plain": Shape("call", "sealed", "text/plain", wire),
    "no_media": Shape("call", "sealed", None, wire),
    "bom": Shape("call", "sealed", "application/json", lambda: BOM + wire()),
    "two_boms": Shape("call", "sealed", "application/json", lambda: BOM + BOM + wire()),
    "utf16": Shape("call", "sealed", "application/json", lambda: wire().decode().encode("utf-16")),
    "utf16le_charset": Shape(
        "call", "sealed", "application/json; charset=utf-16le", lambda: wire().decode().encode("utf-16-le")
    ),
    "utf32": Shape("call", "sealed", "application/json", lambda: wire().decode().encode("utf-32")),
    "leading_whitespace": Shape("call", "sealed", "application/json", lambda: b" \r\n\t" * 2000 + wire()),
    "escaped_key": Shape(
        "call",
        "sealed",
        "application/json",
        lambda: wire().replace(b'"requestState"', b'"request\\u0053tate"'),
    ),
    "invalid_utf8": Shape(
        "call",
        "sealed",
        "application/json",
        lambda: wire(1, asking(content=[{"type": "text", "text": "XX"}])).replace(b"XX", b"\xff\xfe"),
    ),
    "nan": Shape(
        "call",
        "sealed",
        "application/json",
        lambda: wire().replace(b'"inputRequests"', b'"n": NaN, "inputRequests"'),
    ),
    "deep": Shape("call", "sealed", "application/json", deep),
    "array": Shape("call", "sealed", "application/json", lambda: b"[" + wire() + b"]"),
    "error_status": Shape("call", "sealed", "application/json", wire, status=500),
    "duplicate_result": Shape(
        "call",
        "hidden",
        "application/json",
        lambda: wire()[:-1] + b', "result": {"resultType": "complete", "content": []}}',
    ),
    "duplicate_state": Shape(
        "call", "hidden", "application/json", lambda: wire()[:-2] + b', "requestState": "decoy"}}'
    ),
    "alias_snake": Shape("call", "replaced", "application/json", lambda: wire(1, asking("request_state"))),
    "alias_case": Shape("call", "replaced", "application/json", lambda: wire(1, asking("RequestState"))),
    "alias_beside_state": Shape(
        "call", "replaced", "application/json", lambda: wire(1, {**asking(), "REQUEST-STATE": PLAIN})
    ),
    "result_case": Shape("call", "replaced", "application/json", lambda: wire(key="Result")),
    "other_id": Shape("call", "replaced", "application/json", lambda: wire(99)),
    "trailing_garbage": Shape("call", "replaced", "application/json", lambda: wire() + b" garbage"),
    "truncated": Shape("call", "replaced", "application/json", lambda: wire()[:-2]),
    "two_documents": Shape("call", "replaced", "application/json", lambda: wire() + b"\n" + wire()),
    "gzip": Shape(
        "call",
        "replaced",
        "application/json",
        lambda: gzip.compress(wire()),
        headers=(("content-encoding", "gzip"),),
    ),
    "too_large": Shape(
        "call",
        "replaced",
        "application/json",
        lambda: wire(1, asking(content=[{"type": "text", "text": "x" * 100_000}])),
    ),
    "sse": Shape("call", "sealed", SSE, lambda: event(wire())),
    "sse_media_case": Shape("call", "sealed", "Text/Event-Stream; charset=utf-8", lambda: event(wire())),
    "sse_bom": Shape("call", "sealed", SSE, lambda: BOM + event(wire())),
    "sse_crlf": Shape("call", "sealed", SSE, lambda: event(wire(), b"\r\n")),
    "sse_data_bom": Shape("call", "sealed", SSE, lambda: b"data: " + BOM + wire() + b"\n\n"),
    "sse_data_lines": Shape("call", "sealed", SSE, lambda: split_lines(wire())),
    "sse_deep": Shape("call", "sealed", SSE, lambda: event(deep())),
    "sse_after_progress": Shape(
        "call",
        "sealed",
        SSE,
        lambda: event(b'{"jsonrpc":"2.0","method":"notifications/progress"}') + event(wire()),
    ),
    "sse_unlabelled": Shape("call", "sealed", "text/plain", lambda: event(wire())),
    "sse_as_json": Shape("call", "sealed", "application/json", lambda: event(wire())),
    "sse_unparsable": Shape("call", "replaced", SSE, lambda: event(wire()[:-2])),
    "sse_other_id": Shape("call", "replaced", SSE, lambda: event(wire(99))),
    "list_answer": Shape("list", "replaced", "application/json", lambda: wire(7)),
    "list_answer_sse": Shape("list", "replaced", SSE, lambda: event(wire(7))),
    "notification_answer": Shape("notify", "replaced", "application/json", lambda: wire(None)),
    "client_response_answer": Shape("response", "replaced", SSE, lambda: event(wire(1))),
    "get_stream": Shape("get", "replaced", SSE, lambda: event(wire(1))),
    # An input_required result anywhere but a message's own result: a protocol violation
    # that would carry plaintext state, replaced whatever request it answers.
    "error_data": Shape("call", "replaced", "application/json", lambda: stray("error", asking())),
    "nested_in_result": Shape(
        "call", "replaced", "application/json", lambda: wire(1, {**COMPLETE, "structuredContent": asking()})
    ),
    "nested_case": Shape(
        "call",
        "replaced",
        "application/json",
        lambda: wire(
            1,
            {
                **COMPLETE,
                "structuredContent": {
                    "x": [{**asking(), "resultType": None, "ResultType": "input_required"}]
                },
            },
        ),
    ),
    "sse_notification": Shape(
        "call", "replaced", SSE, lambda: event(stray("notification", asking())) + event(wire(1, COMPLETE))
    ),
    "sse_server_request": Shape("call", "replaced", SSE, lambda: event(stray("request", asking()))),
    "get_stream_notification": Shape("get", "replaced", SSE, lambda: event(stray("notification", asking()))),
    # A tool's own content may hold a member named requestState: relayed as written.
    "own_request_state": Shape(
        "call",
        "untouched",
        "application/json",
        lambda: wire(1, {**COMPLETE, "structuredContent": {"requestState": "the tool's own", "n": 1}}),
    ),
    "own_request_state_sse": Shape(
        "call",
        "untouched",
        SSE,
        lambda: event(wire(1, {**COMPLETE, "structuredContent": {"requestState": "é", "n": 1}})),
    ),
}


@dataclass
class Crafted:
    """A real HTTP server answering each request with the bytes of the shape its header names."""

    server: ThreadingHTTPServer
    url: str
    seen: list[str] = field(default_factory=list)


def _crafted_server() -> Crafted:
    crafted: Crafted

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            shape = SHAPES[self.headers["x-shape"]]
            crafted.seen.append(self.headers["x-shape"])
            body = shape.build()
            self.send_response(shape.status)
            if shape.media is not None:
                self.send_header("content-type", shape.media)
            for name, value in shape.headers:
                self.send_header(name, value)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    crafted = Crafted(server, f"http://127.0.0.1:{server.server_address[1]}/mcp")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return crafted


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Crafted]]:
    tmp = tmp_path_factory.mktemp("crafted")
    keys, replay = keys_file(tmp), "memory:"
    upstream = _crafted_server()
    try:
        (proxy,) = start_proxies(
            tmp, upstream.url, keys=keys, replay=replay, mode="encrypt", jwks=None, names=("C",),
            extra=["--max-response-bytes", "65536"],
        )  # fmt: skip
        try:
            yield Fleet(keys, replay, proxy), upstream
        finally:
            stop(proxy.proc)
    finally:
        upstream.server.shutdown()
        upstream.server.server_close()


def leaked(content: bytes) -> bool:
    """Whether the upstream's plaintext is in ``content``, in any encoding a client decodes."""
    return any(
        SECRET.encode(encoding) in content
        for encoding in ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
    )


async def ask(fleet: Fleet, name: str, kind: str) -> httpx.Response:
    headers = {"x-shape": name, "accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=60) as http:
        if kind == "get":
            return await http.get(fleet.proxy.url, headers=headers)
        if kind == "call":
            body, extra = modern_request("tools/call", {"name": "lookup", "arguments": {"q": 1}})
        elif kind == "list":
            body, extra = modern_request("tools/list", {}, request_id=7)
        elif kind == "notify":
            body, extra = b'{"jsonrpc":"2.0","method":"notifications/initialized"}', {}
        else:
            body, extra = b'{"jsonrpc":"2.0","id":1,"result":{"action":"accept"}}', {}
        return await http.post(fleet.proxy.url, content=body, headers={**extra, **headers})


@pytest.mark.parametrize("name", list(SHAPES))
async def test_no_plaintext_state_ever_reaches_the_client(crafted: tuple[Fleet, Crafted], name: str) -> None:
    fleet, upstream = crafted
    shape = SHAPES[name]
    response = await ask(fleet, name, shape.kind)
    assert upstream.seen[-1] == name  # the upstream did answer with that shape
    assert not leaked(response.content), response.content[:300]
    tokens = TOKEN.findall(response.content)
    if shape.outcome == "sealed":
        assert response.status_code == shape.status
        assert tokens and all(fleet.opened(token) == PLAIN.encode() for token in tokens)
        assert "utf-16" not in response.headers.get("content-type", "")  # rewritten as UTF-8
    elif shape.outcome == "replaced":
        assert not tokens
        assert b'"code":-32603' in response.content
        assert " ERROR statecodec: " in fleet.proxy.wait_for_log(" ERROR statecodec: ")  # and logged why
    elif shape.outcome == "untouched":
        assert response.content == shape.build()


async def test_a_stray_input_required_keeps_the_id_and_is_logged_where(
    crafted: tuple[Fleet, Crafted],
) -> None:
    fleet, _ = crafted
    response = await ask(fleet, "error_data", "call")
    (message,) = messages(response)
    assert message == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "Internal error"}}
    assert "an input_required result at error.data" in fleet.proxy.wait_for_log("at error.data")
    response = await ask(fleet, "sse_server_request", "call")
    assert [message.get("id") for message in messages(response)] == [None]  # not the server request's 5
