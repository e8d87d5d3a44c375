"""Adapter regressions from the internal security review, with the real SDKs in-process.

1. FastMCP re-reads raw params with pydantic ``populate_by_name``: a snake_case
   ``request_state`` reached ``ctx.request_state`` unverified on legacy protocol versions.
2. The binding (and its argument digest) was computed for every MRTR call, before the
   token's cheap checks: now only when a state arrives or leaves, after the size cap.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import mcp_types as types
import pytest
from fastmcp_servers import deploy_server
from mcp.client import Client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

import statecodec as sc
from statecodec import boundary
from statecodec.adapters import fastmcp as fastmcp_adapter
from statecodec.adapters.asgi import RequestStateMiddleware
from statecodec.adapters.mcp import protect
from statecodec.replay import MemoryReplayStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _codec() -> sc.StateCodec:
    return sc.StateCodec(sc.KeyRing.generate(), mode=sc.Mode.ENCRYPT, replay=MemoryReplayStore())


@pytest.mark.parametrize("alias", ["request_state", "Request_State", "request-state", "REQUESTSTATE"])
def test_state_aliases_are_detected(alias: str) -> None:
    params = {"name": "t", alias: "x"}
    assert boundary.state_aliases(params) == [alias]
    assert boundary.carries_state(params)
    assert not boundary.carries_state({"name": "t", "requestState": None})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_fastmcp_snake_case_state_never_reaches_the_tool(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, seen = deploy_server(lambda version: f'{{"approved": false, "version": "{version}"}}')
    fastmcp_adapter.protect(server, _codec())
    forged = {"name": "deploy", "arguments": {"version": "v1"}, "request_state": '{"approved": true}'}
    async with Client(server._mcp_server, mode=mode) as client:
        with caplog.at_level(logging.WARNING, logger="statecodec"), pytest.raises(MCPError) as info:
            await client.session._dispatcher.send_raw_request("tools/call", forged, {})
    assert info.value.error.code == boundary.WIRE_ERROR_CODE
    assert seen == []  # the handler never ran, let alone with the forged state
    if mode == "legacy":  # 2026-07-28 sessions refuse the unknown key before any middleware
        assert "alias of requestState" in caplog.text


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])


async def _call_tool(ctx: Any, params: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])


async def test_plain_calls_are_never_bound() -> None:
    # An argument that cannot be digested (beyond 2**53) proves no binding is computed
    # for a call that carries no state and returns none.
    server = Server("svc", on_list_tools=_list_tools, on_call_tool=_call_tool)
    protect(server, _codec())
    async with Client(server, mode="legacy") as client:
        result = await client.session._dispatcher.send_raw_request(
            "tools/call", {"name": "t", "arguments": {"n": 2**60}}, {}
        )
    assert result["content"][0]["text"] == "ok"


async def test_oversized_token_is_refused_before_the_digest(caplog: pytest.LogCaptureFixture) -> None:
    server = Server("svc", on_list_tools=_list_tools, on_call_tool=_call_tool)
    codec = _codec()
    protect(server, codec)
    params = {
        "name": "t",
        "arguments": {"xs": [0.5] * 50_000},  # would exceed the JCS budget if digested
        "requestState": "sc1e." + "A" * codec.max_token_bytes,
    }
    async with Client(server, mode="legacy") as client:
        with caplog.at_level(logging.WARNING, logger="statecodec"), pytest.raises(MCPError):
            await client.session._dispatcher.send_raw_request("tools/call", params, {})
    assert "reason=too_large" in caplog.text
    assert "limited to" not in caplog.text


@pytest.mark.parametrize("key", ["requestState", "request_state", "Request-State"])
async def test_asgi_middleware_refuses_state_aliases_before_a_fastmcp_upstream(key: str) -> None:
    server, seen = deploy_server()
    inner = server.http_app(path="/mcp", stateless_http=True, json_response=True)
    app = RequestStateMiddleware(inner, _codec(), audience="deploy")
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2025-11-25",
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "deploy", "arguments": {"version": "v1"}, key: '{"approved": true}'},
    }
    async with inner.router.lifespan_context(inner):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            response = await client.post("/mcp", json=body, headers=headers)
    assert response.json()["error"]["code"] == boundary.WIRE_ERROR_CODE
    assert seen == []
